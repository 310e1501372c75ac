"""parallel.chunks: the refusals that need no data, each naming its field and what to do."""

from __future__ import annotations

import pytest

from dagtrain.config import PipelineConfig
from dagtrain.config.files import validate
from dagtrain.config.schema import ConfigError

TWO = {"backend": "torch", "ranks": 2}


@pytest.mark.parametrize(
    ("parallel", "distributed", "needle"),
    [
        ({"chunks": 2}, {}, "parallel.chunks is 2 with parallel.stages 1"),
        ({"stages": 2, "chunks": 2, "microbatches": 3, "order": "1f1b"}, TWO,
         "make microbatches a multiple of 2 (e.g. 4), or use order gpipe"),
        ({"stages": 2, "chunks": 2, "microbatches": 3}, TWO, "an interleaved auto order"),
        ({"stages": 2, "chunks": 2, "microbatches": 4, "split": [3]}, TWO,
         "parallel.split [3] has 1 boundary; 2 stages x 2 chunks need 3"),
        ({"stages": 2, "chunks": 2, "microbatches": 4}, {**TWO, "device": "cuda"},
         "NCCL pairs a send with a receive by the order they are posted"),
        ({"stages": 2, "chunks": 3, "microbatches": 4, "placement": "v"}, TWO,
         "parallel.placement v with parallel.chunks 3: a V places two chunks a rank"),
        ({"stages": 2, "microbatches": 4, "placement": "v"}, TWO,
         "set parallel.chunks to 2, or placement to looped"),
    ],
)  # fmt: skip
def test_a_chunked_pipeline_that_cannot_run_is_refused_naming_the_field(
    parallel, distributed, needle
):
    with pytest.raises(ConfigError) as info:
        validate({"parallel": parallel, "distributed": distributed, "training": {"batch_size": 64}})
    assert needle in str(info.value), str(info.value)


def test_looped_bfs_takes_any_microbatches_and_chunks_reach_the_ranks():
    cfg = PipelineConfig(
        distributed={"backend": "mpi", "ranks": 2, "device": "cuda"},  # (mpi honours tags)
        parallel={"stages": 2, "chunks": 2, "microbatches": 3, "order": "gpipe"},
        training={"batch_size": 63},
    )
    t = cfg.train_config()
    assert (t.parallel.chunks, t.parallel.parts) == (2, 4)
