"""``privlm data show``: JSON facts, the table, and exit code 2 with one line for every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run


def test_rotten_tomatoes_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["data", "show", "rotten-tomatoes", "--json", "--n", "3", "--split", "test"], capsys)
    facts = json.loads(out)
    assert code == 0
    assert facts["num_examples"] == 10_568 and facts["num_classes"] == 2
    assert facts["label_names"] == ["negative", "positive"]
    assert sum(facts["split_sizes"].values()) == 10_568 and facts["split_sizes"]["test"] > 1000
    assert sum(facts["split_class_counts"].values()) == facts["split_sizes"]["test"]
    assert len(facts["examples"]) == 3 and facts["split"] == "test"
    assert all(e["label_name"] == facts["label_names"][e["label"]] for e in facts["examples"])
    assert facts["verbalizer"] == {"suffix": " It was ", "label_words": ["bad", "great"]}


def test_same_seed_same_examples_other_seed_different(capsys: pytest.CaptureFixture[str]) -> None:
    outputs = [json.loads(run(["data", "show", "tweets", "--json", "--seed", s], capsys)[1]) for s in ("3", "3", "4")]
    assert outputs[0]["examples"] == outputs[1]["examples"] != outputs[2]["examples"]


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["data", "show", "bbc-news", "--n", "2"], capsys)
    assert code == 0
    assert "2,225 examples, 5 classes" in out and "first 2 of train" in out and "technology" in out


def bad_files(tmp: Path) -> dict[str, tuple[str, str]]:
    (tmp / "broken.jsonl").write_text('{"text": "a", "label": 0}\n{"text": \n')
    (tmp / "nolabel.csv").write_text("text,stars\na,1\n")
    (tmp / "gap.jsonl").write_text('{"text": "a", "label": 0}\n{"text": "b", "label": 2}\n')
    (tmp / "latin1.csv").write_bytes(b"text,label\ncaf\xe9,0\n")
    return {
        "unknown name": ("imdb-reviews", "error: unknown dataset 'imdb-reviews'; known: bbc-news, rotten-tomatoes"),
        "missing file": (f"jsonl:{tmp}/none.jsonl", f"error: file not found: {tmp}/none.jsonl"),
        "malformed JSONL": (f"jsonl:{tmp}/broken.jsonl", f"error: {tmp}/broken.jsonl:2: not valid JSON"),
        "missing column": (f"csv:{tmp}/nolabel.csv", f"error: {tmp}/nolabel.csv: no 'label' column"),
        "empty class": (f"jsonl:{tmp}/gap.jsonl", f"error: {tmp}/gap.jsonl: class '1' has no examples"),
        "non-UTF-8": (f"csv:{tmp}/latin1.csv", f"error: {tmp}/latin1.csv:2: not UTF-8 text (byte 0xe9)"),
    }


@pytest.mark.parametrize(
    "case", ["unknown name", "missing file", "malformed JSONL", "missing column", "empty class", "non-UTF-8"]
)
def test_bad_inputs_exit_2_with_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name, message = bad_files(tmp_path)[case]
    code, out, err = run(["data", "show", name], capsys)
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1


def test_missing_data_archive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRIVLM_DATA_DIR", str(tmp_path))
    code, _, err = run(["data", "show", "tweets"], capsys)
    assert code == 2 and "vaderSentiment-3.3.2.tar.gz not found" in err and "make install" in err


def test_bad_split_and_count(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["data", "show", "tweets", "--split", "dev"], capsys)
    assert code == 2 and "unknown split 'dev'" in err
    code, _, _ = run(["data", "show", "tweets", "--n", "-1"], capsys)
    assert code == 2
