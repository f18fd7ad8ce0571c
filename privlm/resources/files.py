"""User datasets from local files: ``jsonl:PATH`` and ``csv:PATH``.

Both need a ``text`` column (non-empty string) and a ``label`` column; a JSONL row's optional
``label_name`` (as in ``privlm synth``'s output) must name the class its ``label`` gives. **The class names are public
input** (:class:`~privlm.resources.labels.LabelSpec`, from ``--labels`` or the TOML ``labels`` key), never
read off the rows: each row's label must be one of those names or a class index ``0..K-1`` (a JSON
integer or its digits). A row with any other label is a :class:`UserError` naming the file
and line but not the label (it is private data); a class with no rows is fine (the class list is
public, so it must not depend on which labels occur). Files must be UTF-8 (a BOM is allowed). Every
problem is a :class:`UserError` naming the file and, where there is one, the line.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from privlm.errors import UserError
from privlm.resources.corpus import Corpus
from privlm.resources.labels import LabelSpec, unknown_label_error

TEXT, LABEL, LABEL_NAME = "text", "label", "label_name"


def jsonl_records(path: str | Path, columns: Sequence[str] = (TEXT, LABEL)) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of a UTF-8 JSONL file; :class:`UserError` names
    the file and line of anything that is not a JSON object (expected to hold ``columns``)."""
    path = Path(path)
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise UserError(f"{path}:{number}: not valid JSON ({err.msg})") from err
        if not isinstance(record, dict):
            raise UserError(f"{path}:{number}: expected a JSON object with {' and '.join(repr(c) for c in columns)}")
        yield number, record


def jsonl_rows(path: str | Path, columns: Sequence[str]) -> Iterator[tuple[str, dict]]:
    """``("FILE:LINE", object)`` for every record of a JSONL file, each checked to hold ``columns``."""
    for number, record in jsonl_records(path, columns):
        for column in columns:
            if column not in record:
                raise UserError(f"{path}:{number}: missing '{column}'")
        yield f"{path}:{number}", record


def csv_rows(path: str | Path, columns: Sequence[str]) -> Iterator[tuple[str, dict[str, str | None]]]:
    """``("FILE:LINE", row)`` for every row of a CSV file whose header holds ``columns`` (others ignored);
    :class:`UserError` names the file and line of a malformed header or row, or a missing column."""
    path = Path(path)
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
    try:
        header = reader.fieldnames or []
    except csv.Error as err:
        raise UserError(f"{path}:1: malformed CSV header ({err})") from err
    for column in columns:
        if column not in header:
            raise UserError(f"{path}:1: no '{column}' column (columns: {', '.join(header) or 'none'})")
    try:
        for row in reader:
            yield f"{path}:{reader.line_num}", row
    except csv.Error as err:
        raise UserError(f"{path}:{reader.line_num}: malformed CSV ({err})") from err


def read_jsonl(path: str | Path, labels: LabelSpec) -> Corpus:
    """One JSON object per line with ``text`` and ``label``; blank lines are skipped; classes ``labels``."""
    path = Path(path)
    texts, raw, lines, given_names = [], [], [], []
    for where, record in jsonl_rows(path, (TEXT, LABEL)):
        label = record[LABEL]
        if isinstance(label, bool) or not isinstance(label, (int, str)) or not str(label).strip():
            raise UserError(
                f"{where}: '{LABEL}' must be an integer or a name (the value is not shown: labels are private)"
            )
        texts.append(_text(record[TEXT], where))
        raw.append(str(label).strip())
        lines.append(where)
        given_names.append(record.get(LABEL_NAME))
    corpus = encode_labels(texts, raw, labels, lines, str(path))
    for (_, k), name, where in zip(corpus.examples, given_names, lines):
        if name is not None and name != labels.names[k]:  # e.g. a file written for classes in another order
            raise UserError(f"{where}: '{LABEL_NAME}' does not match class {k} ({labels.names[k]!r})")
    return corpus


def read_csv(path: str | Path, labels: LabelSpec) -> Corpus:
    """A CSV file with a header row that includes ``text`` and ``label`` (other columns ignored); classes ``labels``."""
    texts, raw, lines = [], [], []
    for where, row in csv_rows(path, (TEXT, LABEL)):
        label = row[LABEL]
        if label is None or not label.strip():
            raise UserError(f"{where}: missing '{LABEL}'")
        texts.append(_text(row[TEXT], where))
        raw.append(label.strip())
        lines.append(where)
    return encode_labels(texts, raw, labels, lines, str(path))


def encode_labels(
    texts: Sequence[str], raw: Sequence[str], labels: LabelSpec, where: Sequence[str], source: str
) -> Corpus:
    """Class ids of raw label strings under the public ``labels``; ``where[i]`` ("FILE:LINE") locates row
    ``i`` in errors, which never show the label itself."""
    if not texts:
        raise UserError(f"{source}: no examples")
    ids = []
    for label, place in zip(raw, where):
        k = labels.class_of(label)
        if k is None:
            raise unknown_label_error(place, labels)
        ids.append(k)
    return Corpus(tuple(zip(texts, ids)), labels.names)


def read_text(path: Path) -> str:
    """A user file's text (UTF-8, BOM allowed); :class:`UserError` names a missing file or the line of a bad byte."""
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
