"""Atomic text files: written to ``NAME.tmp``, flushed to disk, then renamed over ``NAME``.

A reader (or a resumed run) sees either the old file, no file, or the complete new file — never a
half-written one, whatever happens to the writer.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
