"""Atomic files: written to a temporary file in the same folder, fsync'd, then renamed into place.

A reader (or a resumed run) sees the old file, no file, or the complete new file — never a half-written
one, whatever happens to the writer (exception, kill -9). After the rename the folder is fsync'd too, so
the new file survives a crash of the machine: a write-ahead ledger saved here is durable before whatever
it covers is written. Every writer of outputs, ledgers, releases and checkpoints in privlm goes through here.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on normal exit fsync it and ``os.replace`` it onto ``path``.

    On an exception the temporary file is removed and ``path`` is untouched. The final file gets the
    usual permissions (0666 minus the umask). Creates the parent folder if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def fsync_folder(folder: str | os.PathLike[str]) -> None:
    """Make a rename or creation inside ``folder`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the file itself was fsync'd
    finally:
        os.close(fd)


def write_text_atomic(path: str | os.PathLike[str], chunks: str | Iterable[str]) -> None:
    """Write ``chunks`` (a string or an iterable of strings, UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for chunk in [chunks] if isinstance(chunks, str) else chunks:
            handle.write(chunk)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a kill leaves the old file or the new, never a part)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def json_once(path: str | os.PathLike[str] | None, make: Callable[[], Any]) -> Any:
    """The JSON value saved at ``path``; else ``make()``, saved there atomically first (``path=None``: just
    ``make()``). A step a resumed run never repeats: what was saved is returned, not recomputed."""
    if path is not None and Path(path).exists():
        return json.loads(Path(path).read_text())
    value = make()
    if path is not None:
        write_text_atomic(path, json.dumps(value, sort_keys=True) + "\n")
    return value
