"""The base of every section of the config: no unknown keys, no NaN or infinity."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["SEED_MAX", "Section"]

# seeds reach numpy's and torch's generators (and per-epoch/per-step seeds derived from
# them must fit 64 bits): every accepted seed works
SEED_MAX = 2**32 - 1


class Section(BaseModel):
    # a number that is NaN or infinite reaches torch, numpy or timedelta as nonsense
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
