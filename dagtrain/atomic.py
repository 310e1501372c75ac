"""Atomic file writes: a reader sees the whole new file or the old one, never half;
and appends of whole JSON lines (``append_line``), which a reader never sees half of.

Temp file in the same directory, fsync, rename over the target (and fsync the
directory where the rename must survive a crash). Standard library only: a base module of
the package, which every layer may import, so that the executor's traces, the ranks'
status records, the training layer's checkpoints and the stages' artifacts are all
written by this one helper. The file gets the permissions any
new file of this process would (0666 less the umask), not the temp file's 0600: a web
server or a colleague in the same group can read what a training task wrote.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["append_line", "atomic_write", "fsync_dir", "umask"]


def umask() -> int:
    """This process's umask, read without changing it (Linux), else set and restored."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, data: bytes | Iterable[bytes] | Callable[[BinaryIO], object]) -> None:
    """Write ``data`` (bytes, chunks of them: a stream, or a function that writes to
    the file it is given) to ``path`` so that readers see the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                for chunk in [data] if isinstance(data, bytes | bytearray) else data:
                    f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_line(path: str | Path, record: Any) -> None:
    """Append ``record`` to ``path`` as one JSON line, in one ``write`` on an
    ``O_APPEND`` descriptor: concurrent writers (rank 0, the launching side, the
    listener) never interleave, and a reader never sees half a line. A new file gets
    the permissions ``atomic_write`` gives (0666 less the umask)."""
    line = (json.dumps(record, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
