"""User files (jsonl:, csv:): public class names, label coding and every bad input, each with a message
naming the place (and never a private label)."""

from __future__ import annotations

from pathlib import Path

import pytest

from privlm.errors import UserError
from privlm.resources.datasets import load_dataset
from privlm.resources.files import read_csv, read_jsonl
from privlm.resources.labels import parse_labels


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
    corpus = read_jsonl(path, parse_labels("pos,neg"))  # the given order, not sorted, not read off the rows
    assert corpus.label_names == ("pos", "neg")
    assert corpus.examples == (("good", 0), ("bad", 1), ("ok", 0))


def test_names_and_indices_mix(tmp_path: Path) -> None:
    path = write(
        tmp_path / "d.jsonl", '{"text": "a", "label": "pos"}\n{"text": "b", "label": 0}\n{"text": "c", "label": "1"}\n'
    )
    assert read_jsonl(path, parse_labels("neg,pos")).examples == (("a", 1), ("b", 0), ("c", 1))


def test_csv_with_integer_labels_and_bom(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", '\ufeffid,label,text\n1,1,"a, quoted\ntext"\n2,0,plain\n3,2,third\n')
    corpus = read_csv(path, parse_labels("0,1,2"))
    assert corpus.label_names == ("0", "1", "2")
    assert corpus.examples == (("a, quoted\ntext", 1), ("plain", 0), ("third", 2))


def test_user_file_through_the_registry(tmp_path: Path) -> None:
    lines = [f'{{"text": "t{i}", "label": {i % 2}}}' for i in range(40)]
    path = write(tmp_path / "d.jsonl", "\n".join(lines))
    full = load_dataset(f"jsonl:{path}", labels="0,1")
    assert len(full) == 40 and sum(full.split_sizes.values()) == 40 and full.split_sizes["train"] > 24
    assert full.verbalizer.template == "{text} Label: " and full.verbalizer.label_words == ("0", "1")
    assert full.verbalizer.completion("t0", 1) == "t0 Label: 1"
    worded = load_dataset(f"jsonl:{path}", labels="no=bad,yes=great")
    assert worded.label_names == ("no", "yes") and worded.verbalizer.label_words == ("bad", "great")
    assert worded.examples == full.examples


@pytest.mark.parametrize("prefix", ["jsonl", "csv"])
def test_a_user_file_without_labels_is_refused_before_it_is_read(tmp_path: Path, prefix: str) -> None:
    with pytest.raises(
        UserError, match=r"class names as public input.*--labels NAME,NAME,\.\.\. \(e\.g\. --labels negative"
    ):
        load_dataset(f"{prefix}:{tmp_path}/absent.{prefix}")


def test_a_class_without_rows_changes_nothing(tmp_path: Path) -> None:
    """The class list is public: whichever classes occur in the rows, names, words and label_names agree."""
    rows = [("a fine film", "pos"), ("a dull film", "neg"), ("so good", "pos"), ("awful", "neg")]
    both = write(tmp_path / "both.jsonl", "".join(f'{{"text": "{t}", "label": "{y}"}}\n' for t, y in rows))
    only_pos = write(
        tmp_path / "pos.jsonl", "".join(f'{{"text": "{t}", "label": "{y}"}}\n' for t, y in rows if y == "pos")
    )
    labels = "neg=bad,pos=great,mixed=so-so"
    a, b = load_dataset(f"jsonl:{both}", labels=labels), load_dataset(f"jsonl:{only_pos}", labels=labels)
    assert a.label_names == b.label_names == ("neg", "pos", "mixed")
    assert a.verbalizer == b.verbalizer and a.verbalizer.label_words == ("bad", "great", "so-so")
    assert b.class_counts() == {"neg": 0, "pos": 2, "mixed": 0}
    assert [b.label_names[y] for _, y in b.examples] == ["pos", "pos"]
    assert {t: a.label_names[y] for t, y in a.examples if t in dict(b.examples)} == {t: "pos" for t in dict(b.examples)}


@pytest.mark.parametrize(
    ("name", "header", "row", "line"),
    [("d.jsonl", "", '{{"text": "x", "label": "{}"}}', 4), ("d.csv", "text,label\n", "x,{}", 5)],
)
def test_a_row_with_a_new_label_is_refused_without_showing_it(tmp_path: Path, name, header, row, line) -> None:
    body = header + "".join(row.format(y) + "\n" for y in ("neg", "pos", "neg"))
    path = write(tmp_path / name, body + row.format("hiv_positive") + "\n")
    with pytest.raises(UserError, match=rf"d\.(jsonl|csv):{line}: label is not one of the 2 class names") as err:
        load_dataset(f"{name.split('.')[1]}:{path}", labels="neg,pos")
    assert "hiv_positive" not in str(err.value) and "neg, pos" in str(err.value)
    for bad in ('{"text": "x", "label": 7}', '{"text": "x", "label": -1}', '{"text": "x", "label": [1]}'):
        path = write(tmp_path / "e.jsonl", '{"text": "a", "label": 0}\n' + bad + "\n")
        with pytest.raises(UserError, match=r"e\.jsonl:2: ") as err:
            load_dataset(f"jsonl:{path}", labels="neg,pos")
        assert bad.split('"label": ')[1].rstrip("}") not in str(err.value).removeprefix(f"{path}:2: ")


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
        ("d.jsonl", '{"text": "a", "label": 0}\n{"text": "b", "label": 2}\n', r"d\.jsonl:2: label is not one of"),
        ("d.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": "x"}\n', r"d\.jsonl:1: label is not one of"),
        ("d.jsonl", "\n\n", r"d\.jsonl: no examples"),
        ("d.jsonl", b'{"text": "a", "label": 0}\n{"text": "caf\xe9", "label": 1}\n', r"d\.jsonl:2: not UTF-8 text"),
        ("d.csv", "text,y\na,0\n", r"d\.csv:1: no 'label' column \(columns: text, y\)"),
        ("d.csv", "words,label\na,0\n", r"d\.csv:1: no 'text' column"),
        ("d.csv", "text,label\na,0\nb\n", r"d\.csv:3: missing 'label'"),
        ("d.csv", "text,label\na,0\nb,2\n", r"d\.csv:3: label is not one of"),
        ("d.csv", b"text,label\na,0\n\xff\xfe,1\n", r"d\.csv:3: not UTF-8 text \(byte 0xff\)"),
    ],
)
def test_bad_user_files(tmp_path: Path, name: str, content: str | bytes, message: str) -> None:
    path = write(tmp_path / name, content)
    prefix = "jsonl" if name.endswith(".jsonl") else "csv"
    with pytest.raises(UserError, match=message):
        load_dataset(f"{prefix}:{path}", labels="0,1")


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ("", r"--labels is empty"),
        ("neg", r"needs at least 2 classes"),
        ("neg,,pos", r"empty class name"),
        ("neg,pos,neg", r"'neg' is given twice"),
        ("neg=,pos", r"'neg' has an empty label word"),
        ("1,0", r"'1' is a number but is class 0"),
    ],
)
def test_bad_labels_option(tmp_path: Path, labels: str, message: str) -> None:
    path = write(tmp_path / "d.jsonl", '{"text": "a", "label": 0}\n')
    with pytest.raises(UserError, match=message):
        load_dataset(f"jsonl:{path}", labels=labels)


def test_labels_of_a_builtin_data_set_may_only_repeat_them() -> None:
    assert load_dataset("tweets", labels="negative,positive").label_names == ("negative", "positive")
    assert load_dataset("tweets", labels="negative=sadness,positive=joy").verbalizer.label_words == ("sadness", "joy")
    with pytest.raises(UserError, match=r"tweets is built in with classes negative,positive"):
        load_dataset("tweets", labels="positive,negative")
    with pytest.raises(UserError, match=r"built-in label words \(negative=sadness,positive=joy\)"):
        load_dataset("tweets", labels="negative=bad,positive=great")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=rf"file not found: {tmp_path}/absent\.jsonl"):
        load_dataset(f"jsonl:{tmp_path}/absent.jsonl", labels="a,b")
    with pytest.raises(UserError, match=r"is a folder, not a file"):
        load_dataset(f"csv:{tmp_path}", labels="a,b")
