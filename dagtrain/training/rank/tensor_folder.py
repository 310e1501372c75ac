"""A pipeline stage's checkpoint tensors as a ``torch.distributed.checkpoint`` (DCP)
folder: written by ``dcp.save`` with torch's ``FileSystemWriter``, read by
``dcp.load`` with its ``FileSystemReader``; both with ``no_dist`` (no collectives:
the ``mpi`` backend's ranks have no ``torch.distributed`` group, and no stage waits
for another).

The folder is DCP's own format (``__0_0.distcp``, the tensors one after the other as
``torch.save`` streams them, and ``.metadata``), which torch's tools read (e.g.
``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``). Its metadata is a
pickle: it is read here with an unpickler that builds DCP's metadata types and nothing
else (no ``BytesStorageMetadata``: DCP's loading of an item's bytes, which unpickles
them without torch's weights-only guard, never runs), and every file it names must be one of
the folder's own. The tensors are read by ``torch.load(weights_only=True)``.

The caller checks the folder's files against their checksums first; DCP then opens
them again by name, so a file swapped in between is read unchecked (as safely: no
pickle runs), which only someone who can write the checkpoint folder can do.
"""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from torch.distributed import checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

__all__ = ["load_tensors", "save_tensors", "sizes"]


def save_tensors(tensors: dict[str, torch.Tensor], folder: Path) -> None:
    """Write ``tensors`` (by name) into the new folder ``folder`` (fsynced)."""
    with warnings.catch_warnings():  # "assuming ... a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(tensors, storage_writer=dcp.FileSystemWriter(str(folder)), no_dist=True)


def sizes(folder: Path) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Each tensor's size and type in ``folder``, by name."""
    meta = _Reader(str(folder)).read_metadata().state_dict_metadata
    return {k: (m.size, m.properties.dtype) for k, m in meta.items()}


def load_tensors(folder: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The tensors ``names`` of ``folder`` (each of its size and type there)."""
    there = sizes(folder)
    tensors = {k: torch.empty(there[k][0], dtype=there[k][1]) for k in names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(
            tensors,
            storage_reader=_Reader(str(folder)),
            planner=DefaultLoadPlanner(allow_partial_load=True),
            no_dist=True,
        )
    return tensors


# torch's dtypes by name, from its namespace as imported (no lazy submodule imported)
_DTYPES = {n: v for n, v in vars(torch).items() if isinstance(v, torch.dtype)}


class _Unpickler(pickle.Unpickler):
    """DCP's metadata types, torch's sizes, dtypes and layouts, a path: nothing else."""

    ALLOWED = {
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "TensorStorageMetadata",
            "TensorProperties",
            "ChunkStorageMetadata",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    } | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib._local", "PosixPath"),
        ("pathlib", "PurePosixPath"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and name in _DTYPES:
            return _DTYPES[name]
        raise pickle.UnpicklingError(
            f"a DCP folder's metadata may not hold {module}.{name}: not a dagtrain checkpoint's"
        )


class _Reader(dcp.FileSystemReader):
    """torch's reader, its metadata read by :class:`_Unpickler`, its files checked to
    be the folder's own."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            with path.open("rb") as f:
                meta = _Unpickler(f).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, TypeError) as e:
            raise ValueError(f"{path}: not a DCP folder's metadata ({e})") from e
        if not isinstance(meta, Metadata) or not isinstance(meta.storage_data, dict):
            raise ValueError(f"{path}: not a DCP folder's metadata")
        own = set(os.listdir(self.path))
        for info in meta.storage_data.values():
            name = str(getattr(info, "relative_path", ""))
            if PurePosixPath(name).name != name or name not in own:
                raise ValueError(f"{path} names {name!r}, not a file of its folder")
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta
