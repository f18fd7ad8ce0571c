"""User files (jsonl:, csv:): label coding and every bad input, each with a message naming the place."""

from __future__ import annotations

from pathlib import Path

import pytest

from privlm.errors import UserError
from privlm.resources.datasets import load_dataset
from privlm.resources.files import read_csv, read_jsonl


def write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def test_jsonl_with_label_names(tmp_path: Path) -> None:
    path = write(
        tmp_path / "d.jsonl",
        '{"text": "good", "label": "pos"}\n\n{"text": "bad", "label": "neg", "id": 3}\n{"text": "ok", "label": "pos"}\n',
    )
    corpus = read_jsonl(path)
    assert corpus.label_names == ("neg", "pos")
    assert corpus.examples == (("good", 1), ("bad", 0), ("ok", 1))


def test_csv_with_integer_labels_and_bom(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", "\ufeffid,label,text\n1,1,\"a, quoted\ntext\"\n2,0,plain\n3,2,third\n")
    corpus = read_csv(path)
    assert corpus.label_names == ("0", "1", "2")
    assert corpus.examples == (("a, quoted\ntext", 1), ("plain", 0), ("third", 2))


def test_user_file_through_the_registry(tmp_path: Path) -> None:
    lines = [f'{{"text": "t{i}", "label": {i % 2}}}' for i in range(40)]
    path = write(tmp_path / "d.jsonl", "\n".join(lines))
    full = load_dataset(f"jsonl:{path}")
    assert len(full) == 40 and full.split_sizes == {"train": 32, "validation": 4, "test": 4}
    assert full.verbalizer.suffix == " Label: " and full.verbalizer.label_words == ("0", "1")
    assert full.verbalizer.completion("t0", 1) == "t0 Label: 1"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("d.jsonl", '{"text": "a", "label": 0}\n{"text": "b", "label": 1\n', r"d\.jsonl:2: not valid JSON"),
        ("d.jsonl", '{"text": "a", "label": 0}\n["b", 1]\n', r"d\.jsonl:2: expected a JSON object"),
        ("d.jsonl", '{"text": "a", "label": 0}\n{"label": 1}\n', r"d\.jsonl:2: missing 'text'"),
        ("d.jsonl", '{"text": "a", "label": 0}\n{"text": "b"}\n', r"d\.jsonl:2: missing 'label'"),
        ("d.jsonl", '{"text": "a", "label": 0}\n{"text": "", "label": 1}\n', r"d\.jsonl:2: 'text' must be a non-empty"),
        ("d.jsonl", '{"text": "a", "label": true}\n', r"d\.jsonl:1: 'label' must be an integer or a name"),
        ("d.jsonl", '{"text": "a", "label": 0}\n{"text": "b", "label": " "}\n', r"d\.jsonl:2: 'label' must be an"),
        ("d.jsonl", '{"text": "a", "label": 0}\n{"text": "b", "label": 2}\n', r"d\.jsonl: class '1' has no examples"),
        ("d.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": "x"}\n', r"needs at least 2 classes"),
        ("d.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": 1}\n', r"d\.jsonl:2: label '1' is a number"),
        ("d.jsonl", "\n\n", r"d\.jsonl: no examples"),
        ("d.jsonl", b'{"text": "a", "label": 0}\n{"text": "caf\xe9", "label": 1}\n', r"d\.jsonl:2: not UTF-8 text"),
        ("d.csv", "text,y\na,0\n", r"d\.csv: no 'label' column \(columns: text, y\)"),
        ("d.csv", "words,label\na,0\n", r"d\.csv: no 'text' column"),
        ("d.csv", "text,label\na,0\nb\n", r"d\.csv:3: missing 'label'"),
        ("d.csv", "text,label\na,0\nb,2\n", r"d\.csv: class '1' has no examples"),
        ("d.csv", b"text,label\na,0\n\xff\xfe,1\n", r"d\.csv:3: not UTF-8 text \(byte 0xff\)"),
    ],
)
def test_bad_user_files(tmp_path: Path, name: str, content: str | bytes, message: str) -> None:
    path = write(tmp_path / name, content)
    prefix = "jsonl" if name.endswith(".jsonl") else "csv"
    with pytest.raises(UserError, match=message):
        load_dataset(f"{prefix}:{path}")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=rf"file not found: {tmp_path}/absent\.jsonl"):
        load_dataset(f"jsonl:{tmp_path}/absent.jsonl")
    with pytest.raises(UserError, match=r"is a folder, not a file"):
        load_dataset(f"csv:{tmp_path}")
