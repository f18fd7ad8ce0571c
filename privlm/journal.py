"""An append-only journal of a deterministic job's finished chunks, so that a killed job resumes after them.

A :class:`Journal` is one JSON-lines file: a header ``{"key": ...}`` (the caller's hash of everything the
chunks depend on), then one ``{"chunk": i, "value": ...}`` line per finished chunk, appended and fsync'd
the moment the chunk is done. Opening it returns the chunks a job with the same key finished; a file with
another key, or none, starts empty (the file is rewritten). A last line cut short by a kill is dropped (and
with it any line after an unreadable one: the journal then holds less, never a wrong chunk).

The journal holds whatever the chunks hold: it is as private as its values (and its key, when the key hashes
private rows), so keep it in the run folder it belongs to.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from privlm.atomic import write_text_atomic


class Journal:
    """The finished chunks of the job hashed to ``key``, kept in ``path`` (module docstring)."""

    def __init__(self, path: str | os.PathLike[str], key: str) -> None:
        self.path = Path(path)
        self.done: dict[int, Any] = {}
        text = self.path.read_text(encoding="utf-8") if self.path.exists() else ""
        entries = []
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill; anything after it is dropped too
                break
            if not isinstance(entry, dict) or (entries and set(entry) != {"chunk", "value"}):
                break
            entries.append(entry)
        if entries and entries[0] == {"key": key}:
            self.done = {e["chunk"]: e["value"] for e in entries[1:]}
        kept = "".join(
            json.dumps(e) + "\n" for e in [{"key": key}, *({"chunk": i, "value": v} for i, v in self.done.items())]
        )
        if text != kept:  # another key, a cut or unreadable line, or a last line without its newline
            write_text_atomic(self.path, kept)

    def add(self, chunk: int, value: Any) -> None:
        """Record ``value`` as chunk ``chunk``'s result, durably (appended, flushed and fsync'd)."""
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"chunk": chunk, "value": value}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.done[chunk] = value
