"""Run folders shared by privlm's resumable mechanisms: an exclusive claim (``flock``) while a process draws
into a folder, and the check that a resumed or reused run repeats the public settings it was started with."""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from privlm.errors import UserError

LOCK = ".lock"


@contextlib.contextmanager
def claim(path: Path, *, wait: bool = False) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` for the block: ``False`` when another live process holds it
    (``wait``: block until it is free instead). The kernel drops the lock when its process dies, so a crash
    leaves no stale claim."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True


@contextlib.contextmanager
def hold(folder: Path, *, wait: bool = False) -> Iterator[None]:
    """Claim the run folder ``folder`` (created if needed) for the block, or a :class:`UserError` when another
    process holds it (``wait``: wait for it instead)."""
    with claim(folder / LOCK, wait=wait) as mine:
        if not mine:
            raise UserError(f"{folder} is in use by another process; wait for it to finish or use another output")
        yield


def check_settings(path: Path, settings: dict[str, Any], saved: dict[str, Any] | None = None) -> None:
    """A :class:`UserError` naming the first key (sorted) where ``settings`` differ from those saved in ``path``
    (``saved``: already read from it)."""
    saved = json.loads(path.read_text()) if saved is None else saved
    for key in sorted(set(saved) | set(settings)):
        if saved.get(key) != settings.get(key):
            raise UserError(
                f"--resume: {key} was {saved.get(key)!r} in the earlier run ({path}) but is now "
                f"{settings.get(key)!r}; resume with the same settings or remove {path.parent}"
            )
