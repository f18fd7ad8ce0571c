"""JSONL files of the evaluation: training sets (text, label rows) and the append-only results log.

Whole files are written atomically (temp file in the same folder, then ``os.replace``); the results log
is appended one flushed, fsync'd line at a time, and a torn last line left by a crash is cut off
when the log is read for a resume. Reads and appends hold an exclusive ``flock`` on the log, so
several processes (``privlm experiment --shard``) can share one folder on a local file system.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from privlm.atomic import write_text_atomic
from privlm.errors import UserError

if TYPE_CHECKING:  # a type only: reading a results log loads no torch (``privlm experiment --pending``)
    from privlm.lm.scoring import Example


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict[str, object]]) -> None:
    """Write ``rows`` (one JSON object per line) atomically, as :func:`write_text_atomic`."""
    write_text_atomic(path, (json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows))


def read_training_set(path: str | Path, label_names: Sequence[str], allow_empty: bool = False) -> list[Example]:
    """Rows with ``text`` (non-empty string), ``label`` (int in ``0..K-1``) and optionally ``label_name``.

    A ``label_name``, when present, must be ``label_names[label]``: it catches files written for a
    dataset whose classes are numbered differently. Errors name the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"training file {path} does not exist")
    examples: list[Example] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 ({err.reason})") from err
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise UserError(f"{where}: not valid JSON ({err.msg})") from err
        if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not row["text"].strip():
            raise UserError(f"{where}: expected an object with a non-empty string 'text'")
        label = row.get("label")
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(label_names):
            raise UserError(f"{where}: 'label' must be an integer in 0..{len(label_names) - 1}, got {label!r}")
        if "label_name" in row and row["label_name"] != label_names[label]:
            raise UserError(
                f"{where}: label_name {row['label_name']!r} does not match class {label} ({label_names[label]!r})"
            )
        examples.append((row["text"], label))
    if not examples and not allow_empty:
        raise UserError(f"{path}: no examples")
    return examples


class ResultsLog:
    """``results.jsonl``: one JSON row per finished cell, appended and fsync'd as soon as it exists."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self) -> list[dict[str, object]]:
        """Complete rows; a torn last line (a crash mid-write) is cut off the file."""
        if not self.path.exists():
            return []
        with open(self.path, "rb+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            data = handle.read()
            complete = data[: data.rfind(b"\n") + 1]
            if len(complete) < len(data):
                handle.truncate(len(complete))
                os.fsync(handle.fileno())
        rows = []
        for number, line in enumerate(complete.decode("utf-8").splitlines(), start=1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise UserError(f"{self.path}:{number}: corrupt results row ({err.msg})") from err
        return rows

    def append(self, row: dict[str, object]) -> None:
        """Append one row durably."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
