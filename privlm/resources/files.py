"""User datasets from local files: ``jsonl:PATH`` and ``csv:PATH``.

Both need a ``text`` column (non-empty string) and a ``label`` column. Labels are either all
non-negative integers (classes ``0..K-1``, every one present, names ``"0"``, ``"1"``, …) or names
(classes = the distinct names sorted alphabetically). Files must be UTF-8 (a BOM is allowed).
Every problem is a :class:`UserError` naming the file and, where there is one, the line.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from privlm.errors import UserError
from privlm.resources.corpus import Corpus, checked

TEXT, LABEL = "text", "label"
_INTEGER = re.compile(r"[0-9]+")


def jsonl_records(path: str | Path) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of a UTF-8 JSONL file; :class:`UserError` names
    the file and line of anything that is not a JSON object."""
    path = Path(path)
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise UserError(f"{path}:{number}: not valid JSON ({err.msg})") from err
        if not isinstance(record, dict):
            raise UserError(f"{path}:{number}: expected a JSON object with '{TEXT}' and '{LABEL}'")
        yield number, record


def read_jsonl(path: str | Path) -> Corpus:
    """One JSON object per line with ``text`` and ``label``; blank lines are skipped."""
    path = Path(path)
    texts, labels, lines = [], [], []
    for number, record in jsonl_records(path):
        for column in (TEXT, LABEL):
            if column not in record:
                raise UserError(f"{path}:{number}: missing '{column}'")
        label = record[LABEL]
        if isinstance(label, bool) or not isinstance(label, (int, str)) or not str(label).strip():
            raise UserError(f"{path}:{number}: '{LABEL}' must be an integer or a name, got {label!r}")
        texts.append(_text(record[TEXT], f"{path}:{number}"))
        labels.append(str(label).strip())
        lines.append(number)
    return encode_labels(texts, labels, str(path), lines)


def read_csv(path: str | Path) -> Corpus:
    """A CSV file with a header row that includes ``text`` and ``label`` (other columns ignored)."""
    path = Path(path)
    reader = csv.DictReader(io.StringIO(_read_text(path), newline=""))
    try:
        columns = reader.fieldnames or []
    except csv.Error as err:
        raise UserError(f"{path}:1: malformed CSV header ({err})") from err
    for column in (TEXT, LABEL):
        if column not in columns:
            raise UserError(f"{path}: no '{column}' column (columns: {', '.join(columns) or 'none'})")
    texts, labels, lines = [], [], []
    try:
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if row[LABEL] is None or not row[LABEL].strip():
                raise UserError(f"{where}: missing '{LABEL}'")
            texts.append(_text(row[TEXT], where))
            labels.append(row[LABEL].strip())
            lines.append(reader.line_num)
    except csv.Error as err:
        raise UserError(f"{path}:{reader.line_num}: malformed CSV ({err})") from err
    return encode_labels(texts, labels, str(path), lines)


def encode_labels(texts: Sequence[str], labels: Sequence[str], source: str, lines: Sequence[int]) -> Corpus:
    """Map raw label strings to class ids (integers as given, names sorted); checks every class."""
    if labels and all(_INTEGER.fullmatch(label) for label in labels):
        ids = [int(label) for label in labels]
        names = tuple(str(i) for i in range(max(ids) + 1))
    else:
        names = tuple(sorted(set(labels)))
        ids = [names.index(label) for label in labels]
        digits = [(line, label) for line, label in zip(lines, labels) if _INTEGER.fullmatch(label)]
        if digits:
            line, label = digits[0]
            raise UserError(f"{source}:{line}: label {label!r} is a number but other labels are names")
    return checked(Corpus(tuple(zip(texts, ids)), names), source)


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError as err:
        raise UserError(f"file not found: {path}") from err
    except IsADirectoryError as err:
        raise UserError(f"{path} is a folder, not a file") from err
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[err.start]:02x})") from err


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{where}: '{TEXT}' must be a non-empty string")
    return value
