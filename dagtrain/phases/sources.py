"""Where a pipeline's data comes from (``data.source``) and the checks that refuse a
source that cannot work, naming the field, before any rank starts:

- ``digits``: scikit-learn's set, no download;
- a file: .npz/.npy/.csv/.parquet, relative to the config file;
- an object-storage URL (``s3://``, ``gs://``, ``file://``, ...): read through Airflow's
  ``ObjectStoragePath`` with ``data.connection`` (the credentials), copied into the data
  folder and checksummed as it is copied, then read as the file it is;
- ``package.module:factory``: a DAG author's function returning a map-style
  ``torch.utils.data.Dataset`` of ``(input, target)`` pairs, or a pair of arrays
  (see :mod:`dagtrain.training.rank.samples`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dagtrain import redact
from dagtrain.atomic import atomic_write
from dagtrain.config import BUILTIN_SOURCES, DATA_SUFFIXES, PipelineConfig, is_factory
from dagtrain.errors import InputError, MissingDependency

__all__ = ["SUFFIXES", "check_source", "fetch_url", "source_kind"]

# a URL as errors name it: without a user, password or query string (dagtrain.redact)
_hide = redact.url


def _src(cfg: PipelineConfig) -> str:
    return _hide(cfg.data.source)


SUFFIXES = DATA_SUFFIXES
_HOW = (
    "give 'digits' or 'diabetes', a .npz/.npy/.csv/.parquet file, a text (.txt) or token "
    "ids (.bin, .npy) (a relative path is relative to the config file), an "
    "object-storage URL (s3://bucket/key.npz) or 'package.module:factory'"
)


# what installs a scheme's filesystem for Airflow's ObjectStoragePath, and the type of
# connection that holds its credentials
_PACKAGES = {
    "s3": "apache-airflow-providers-amazon[s3fs]",
    "gs": "apache-airflow-providers-google",
    "gcs": "apache-airflow-providers-google",
    "abfs": "apache-airflow-providers-microsoft-azure",
    "az": "apache-airflow-providers-microsoft-azure",
}
_CONN_TYPES = {
    "s3": "aws",
    "gs": "google_cloud_platform",
    "gcs": "google_cloud_platform",
    "abfs": "wasb",
    "az": "wasb",
}


def source_kind(cfg: PipelineConfig) -> str:
    """``digits`` (a built-in source: digits or diabetes), ``factory``, ``url`` or
    ``file``."""
    s = cfg.data.source
    if s in BUILTIN_SOURCES:
        return "digits"
    if is_factory(s):
        return "factory"
    return "url" if "://" in s else "file"


def check_source(cfg: PipelineConfig) -> str:
    """``data.source`` resolved (``digits``, a factory, a URL, or a path), after the
    checks that can be made here and now: a file there, readable and of a kind the data
    layer reads; a URL's filesystem installed. InputError names the field. (A factory is
    imported by the preflight and the data-prep phase, a URL's connection read by the
    data-prep phase.)"""
    src = cfg.data_source()
    kind = source_kind(cfg)
    if kind in ("digits", "factory"):
        return src
    if kind == "url":
        _check_url(cfg)
    else:
        _check_file(cfg, src)
    suffix = Path(src.split("?", 1)[0]).suffix.lower()
    if suffix not in SUFFIXES:
        raise InputError(f"data.source {_src(cfg)!r}: unknown kind of file; {_HOW}")
    if suffix == ".parquet":
        lacking = [m for m in ("pandas", "pyarrow") if importlib.util.find_spec(m) is None]
        if lacking:
            raise MissingDependency(
                f"data.source {_src(cfg)!r}: reading parquet needs pandas and pyarrow; "
                f"not installed in this environment ({sys.prefix}): {', '.join(lacking)}. "
                "pip install pandas pyarrow, or convert the file to .npz/.csv"
            )
    return src


def _check_file(cfg: PipelineConfig, src: str) -> None:
    if Path(src).is_dir():
        raise InputError(f"data.source {_src(cfg)!r}: {src} is a directory; {_HOW}")
    if not Path(src).is_file():
        raise InputError(f"data.source {_src(cfg)!r}: no such file ({src}); {_HOW}")
    if not os.access(src, os.R_OK):
        raise InputError(f"data.source {_src(cfg)!r}: {src} is not readable by this user")


def _check_url(cfg: PipelineConfig) -> None:
    """The URL's scheme has a filesystem installed here (fsspec's registry, which
    Airflow's ObjectStoragePath reads through)."""
    import fsspec

    scheme = cfg.data.source.split("://", 1)[0].lower()
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as e:
        hint = _PACKAGES.get(scheme)
        raise MissingDependency(
            f"data.source {_src(cfg)!r}: no filesystem for {scheme}:// is installed in "
            f"this environment ({sys.prefix}): {e}" + (f"; pip install '{hint}'" if hint else "")
        ) from e
    except ValueError:
        raise InputError(
            f"data.source {_src(cfg)!r}: {scheme}:// is not a storage scheme fsspec knows; {_HOW}"
        ) from None


def _connection(cfg: PipelineConfig) -> str | None:
    """``data.connection``, after checking that Airflow has it (the Task SDK: the API
    server in a task, else ``AIRFLOW_CONN_*`` or the secrets backend)."""
    conn_id = cfg.data.connection
    if conn_id is None:
        return None
    scheme = cfg.data.source.split("://", 1)[0].lower()
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise InputError(
            f"data.connection: there is no Airflow connection {conn_id!r} (for "
            f"data.source {_src(cfg)!r}); create it (`airflow connections add "
            f"{conn_id} --conn-type {_CONN_TYPES.get(scheme, 'generic')} ...`, or the UI's "
            "Admin > Connections), or fix the name in the pipeline's file"
        ) from None
    return conn_id


def reach_url(cfg: PipelineConfig, timeout: float = 30.0) -> None:
    """An object-storage ``data.source``, reached as ``prepare_data`` will reach it
    (``data.connection`` read, then the object looked up through it): InputError naming
    the field when the connection or the object does not exist. A store that does not
    answer within ``timeout`` is not judged (the run's own deadline is prepare_data's)."""
    import threading

    if source_kind(cfg) != "url":
        return
    conn_id = _connection(cfg)
    from airflow.sdk import ObjectStoragePath

    url = cfg.data.source
    found: list[Any] = []

    def look() -> None:
        try:
            p = ObjectStoragePath(url, conn_id=conn_id) if conn_id else ObjectStoragePath(url)
            found.append(p.exists())
        except Exception as e:  # judged below: what the store said
            found.append(e)

    t = threading.Thread(target=look, daemon=True)
    t.start()
    t.join(timeout)
    if not found:
        return
    if isinstance(found[0], PermissionError):
        raise InputError(
            f"data.source {_hide(url)!r}: access refused ({found[0]}); check "
            "data.connection's credentials"
        )
    if found[0] is False:
        raise InputError(f"data.source {_hide(url)!r}: no such object")


def fetch_url(cfg: PipelineConfig, folder: Path) -> tuple[Path, str]:
    """The object ``data.source`` names, copied into ``folder`` (atomically: a reader
    sees the whole copy or none) through ``ObjectStoragePath``; returns (the copy, its
    sha256), computed as it is copied."""
    check_source(cfg)
    conn_id = _connection(cfg)
    from airflow.sdk import ObjectStoragePath

    url = cfg.data.source
    src = ObjectStoragePath(url, conn_id=conn_id) if conn_id else ObjectStoragePath(url)
    digest = hashlib.sha256()

    def chunks(f: Any) -> Iterator[bytes]:
        while block := f.read(1 << 20):
            digest.update(block)
            yield block

    name = hashlib.sha256(url.encode()).hexdigest()[:12] + Path(src.path).suffix.lower()
    dest = folder / name
    try:
        with src.open("rb") as f:
            atomic_write(dest, chunks(f))
    except FileNotFoundError:
        raise InputError(f"data.source {_hide(url)!r}: no such object") from None
    except PermissionError as e:
        raise InputError(
            f"data.source {_hide(url)!r}: access refused ({e}); check data.connection's credentials"
        ) from e
    except OSError as e:
        raise InputError(
            f"data.source {_hide(url)!r}: cannot read it: {type(e).__name__}: "
            f"{str(e).replace(url, _hide(url))}"
        ) from e
    return dest, digest.hexdigest()
