"""Where privlm keeps derived files, and how it writes them so that a crash never leaves half a file.

The cache root is ``$PRIVLM_CACHE`` if set, else ``~/.cache/privlm``. Folders are written with
:func:`atomic_directory`: everything goes into a fresh temporary folder next to the target, which is
renamed onto the target only once it is complete. A reader therefore sees either no folder or a
complete one, whatever happens to the writer (exception, Ctrl-C, power loss before the rename).
Temporary folders left behind by a killed writer are deleted by the next write of the same target
once they are older than ``STALE_AFTER_S``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

CACHE_ENV = "PRIVLM_CACHE"
STALE_AFTER_S = 6 * 3600


def cache_root() -> Path:
    """The cache folder: ``$PRIVLM_CACHE``, else ``~/.cache/privlm`` (not created here)."""
    override = os.environ.get(CACHE_ENV)
    return Path(override).expanduser() if override else Path.home() / ".cache" / "privlm"


@contextlib.contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield an empty temporary folder that becomes ``target`` when the block succeeds.

    On an exception the temporary folder is deleted and ``target`` is untouched. If another
    process created ``target`` meanwhile, its complete copy is kept and ours is discarded.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale(target: Path) -> None:
    """Delete temporary folders of ``target`` older than ``STALE_AFTER_S`` (their writer died)."""
    now = time.time()
    for leftover in target.parent.glob(f".{target.name}.*.tmp"):
        with contextlib.suppress(OSError):
            if now - leftover.stat().st_mtime > STALE_AFTER_S:
                shutil.rmtree(leftover)
