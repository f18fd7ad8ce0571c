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
    assert facts["verbalizer"] == {"template": "{text} It was ", "label_words": ["bad", "great"]}


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
    (tmp / "fine.jsonl").write_text('{"text": "a", "label": 0}\n')
    (tmp / "latin1.csv").write_bytes(b"text,label\ncaf\xe9,0\n")
    return {
        "unknown name": ("imdb-reviews", "error: unknown dataset 'imdb-reviews'; known: bbc-news, rotten-tomatoes"),
        "missing file": (f"jsonl:{tmp}/none.jsonl", f"error: file not found: {tmp}/none.jsonl"),
        "malformed JSONL": (f"jsonl:{tmp}/broken.jsonl", f"error: {tmp}/broken.jsonl:2: not valid JSON"),
        "missing column": (f"csv:{tmp}/nolabel.csv", f"error: {tmp}/nolabel.csv:1: no 'label' column"),
        "label outside": (f"jsonl:{tmp}/gap.jsonl", f"error: {tmp}/gap.jsonl:2: label is not one of the 2 class names"),
        "no --labels": (f"jsonl:{tmp}/fine.jsonl", f"error: jsonl:{tmp}/fine.jsonl: user data needs its class names"),
        "non-UTF-8": (f"csv:{tmp}/latin1.csv", f"error: {tmp}/latin1.csv:2: not UTF-8 text (byte 0xe9)"),
    }


@pytest.mark.parametrize(
    "case",
    ["unknown name", "missing file", "malformed JSONL", "missing column", "label outside", "no --labels", "non-UTF-8"],
)
def test_bad_inputs_exit_2_with_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name, message = bad_files(tmp_path)[case]
    labels = [] if case in ("unknown name", "no --labels") else ["--labels", "neg,pos"]
    code, out, err = run(["data", "show", name, *labels], capsys)
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


def _show(path: Path, labels: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict | str, str]:
    code, out, err = run(["data", "show", f"jsonl:{path}", "--labels", labels, "--json", "--n", "50", *extra], capsys)
    return code, (json.loads(out) if code == 0 else out), err


ROWS = [(f"review {i}: " + ("a fine film" if i % 3 else "a dull film"), "pos" if i % 3 else "neg") for i in range(30)]


def _write(path: Path, rows: list[tuple[str, object]]) -> Path:
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    return path


def test_a_new_label_in_a_user_file_exits_2_naming_the_line_not_the_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path / "d.jsonl", [*ROWS, ("patient record 31", "hiv_positive")])
    code, out, err = _show(path, "neg,pos", capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"error: {path}:31: label is not one of the 2 class names given by --labels (neg, pos)")
    assert "hiv_positive" not in err + out


def test_a_user_file_without_labels_explains_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "d.jsonl", ROWS)
    code, out, err = run(["data", "show", f"jsonl:{path}"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "never read off the private rows" in err and "--labels negative,positive" in err
    assert "--labels negative=bad,positive=great" in err


def test_outputs_do_not_depend_on_which_labels_occur(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --labels, a file lacking a class entirely shows the same classes, verbalizer and label_names."""
    labels = "neg=bad,pos=great,mixed=meh"
    all_classes = _write(tmp_path / "all.jsonl", [*ROWS, ("an odd, mixed film", "mixed")])
    no_neg = _write(tmp_path / "no_neg.jsonl", [(t, y) for t, y in ROWS if y == "pos"])
    code_a, a, _ = _show(all_classes, labels, capsys)
    code_b, b, _ = _show(no_neg, labels, capsys)
    assert code_a == code_b == 0
    for key in ("num_classes", "label_names", "verbalizer"):
        assert a[key] == b[key]
    assert a["label_names"] == ["neg", "pos", "mixed"]
    assert a["verbalizer"] == {"template": "{text} Label: ", "label_words": ["bad", "great", "meh"]}
    assert b["class_counts"] == {"neg": 0, "pos": 20, "mixed": 0}
    name_of = {e["text"]: e["label_name"] for e in a["examples"]}
    assert b["examples"] and all(name_of.get(e["text"], "pos") == e["label_name"] == "pos" for e in b["examples"])
    # the rows both files share land in the same split, in the same order
    assert [e["text"] for e in b["examples"]] == [
        e["text"] for e in a["examples"] if e["text"] in {x["text"] for x in b["examples"]}
    ]


def test_labels_for_a_builtin_data_set_must_match(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["data", "show", "tweets", "--labels", "negative,positive", "--json", "--n", "1"], capsys)
    assert code == 0 and json.loads(out)["label_names"] == ["negative", "positive"]
    code, _, err = run(["data", "show", "tweets", "--labels", "sad,happy"], capsys)
    assert code == 2 and "built in with classes negative,positive" in err
