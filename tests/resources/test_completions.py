"""Prompt/completion data: user files and their errors, the per-row split, explicit split files, and
``bbc-headlines`` in exactly the splits of ``bbc-news``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from privlm.errors import UserError
from privlm.resources.completions import (
    CompletionRow,
    completion_spec,
    headline_and_body,
    load_completions,
    load_completions_file,
    token_length_summary,
)
from privlm.resources.datasets import DataSpec, load_dataset
from privlm.resources.splits import SPLITS, row_split


def write(path: Path, content: str) -> Path:
    path.write_text(content, encoding="utf-8")
    return path


def jsonl(path: Path, rows: list[dict]) -> Path:
    return write(path, "".join(json.dumps(row) + "\n" for row in rows))


def test_jsonl_and_csv_rows_are_read_in_order_and_stripped(tmp_path: Path) -> None:
    j = jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": " an article ", "completion": " A headline\n", "id": 1}, {"prompt": "second", "completion": "two"}],
    )
    c = write(tmp_path / "d.csv", '\ufeffid,completion,prompt\n1,A headline,"an, article\nover lines"\n2,two,second\n')
    assert load_completions_file(str(j)) == (CompletionRow("an article", "A headline"), CompletionRow("second", "two"))
    assert load_completions_file(f"csv:{c}") == (
        CompletionRow("an, article\nover lines", "A headline"),
        CompletionRow("second", "two"),
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"prompt": "a", "completion": "b"}\n{"prompt": "a"\n', r"d\.jsonl:2: not valid JSON"),
        ('{"prompt": "a", "completion": "b"}\n\n{"prompt": "a"}\n', r"d\.jsonl:3: missing 'completion'"),
        ('{"completion": "b"}\n', r"d\.jsonl:1: missing 'prompt'"),
        ('{"prompt": "a", "completion": "  "}\n', r"d\.jsonl:1: 'completion' must be a non-empty string"),
        ('{"prompt": "a", "completion": 3}\n', r"d\.jsonl:1: 'completion' must be a non-empty string"),
        ('{"prompt": "", "completion": "b"}\n', r"d\.jsonl:1: 'prompt' must be a non-empty string"),
        ('["a", "b"]\n', r"d\.jsonl:1: expected a JSON object"),
        ("\n\n", r"d\.jsonl: no rows"),
    ],
)
def test_bad_jsonl_names_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    path = write(tmp_path / "d.jsonl", content)
    with pytest.raises(UserError, match=message):
        load_completions(f"jsonl:{path}")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("prompt,text\na,b\n", r"d\.csv:1: no 'completion' column \(columns: prompt, text\)"),
        ("prompt,completion\na,b\nc,\n", r"d\.csv:3: 'completion' must be a non-empty string"),
        ("prompt,completion\na,b\nc\n", r"d\.csv:3: 'completion' must be a non-empty string"),
        ("prompt,completion\n", r"d\.csv: no rows"),
    ],
)
def test_bad_csv_names_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    path = write(tmp_path / "d.csv", content)
    with pytest.raises(UserError, match=message):
        load_completions(str(path))


def test_private_values_are_not_in_error_messages(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "d.jsonl", [{"prompt": "secret prompt", "completion": 12345}])
    with pytest.raises(UserError) as info:
        load_completions(str(path))
    assert "secret" not in str(info.value) and "12345" not in str(info.value)


def test_unknown_names_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown completion data set 'nope'.*bbc-headlines"):
        load_completions("nope")
    with pytest.raises(UserError, match="file not found"):
        load_completions(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UserError, match="unknown split"):
        load_completions("bbc-headlines", split="dev")


def test_user_data_is_split_row_by_row_by_its_prompt(tmp_path: Path) -> None:
    rows = [{"prompt": f"article {i}", "completion": f"headline {i}"} for i in range(60)]
    path = jsonl(tmp_path / "d.jsonl", rows)
    splits = {s: load_completions(str(path), s, seed=3) for s in SPLITS}
    assert sum(len(d) for d in splits.values()) == 60 and min(len(d) for d in splits.values()) > 0
    assert all(d.split_sizes == {t: len(splits[t]) for t in SPLITS} for d in splits.values())
    for s, data in splits.items():  # the rule of user classification data: a hash of the row's prompt alone
        assert all(row_split(row.prompt, 3) == s for row in data)
        assert all(row.completion == "headline " + row.prompt.removeprefix("article ") for row in data)
    # adding rows moves no other row, nor changes the other rows' order; a repeated prompt joins its twin
    extra = [CompletionRow("article new", "x"), CompletionRow("article 7", "another headline")]
    bigger = jsonl(tmp_path / "e.jsonl", [*rows, *({"prompt": r.prompt, "completion": r.completion} for r in extra)])
    for s in SPLITS:
        grown = load_completions(str(bigger), s, seed=3).rows
        assert [r for r in grown if r not in extra] == list(splits[s].rows)
    twin = next(s for s in SPLITS if CompletionRow("article 7", "headline 7") in splits[s].rows)
    assert extra[1] in load_completions(str(bigger), twin, seed=3).rows
    # another seed, another split
    assert [d.rows for d in splits.values()] != [load_completions(str(path), s, seed=4).rows for s in SPLITS]


def test_explicit_split_files_are_taken_whole(tmp_path: Path) -> None:
    train = jsonl(tmp_path / "train.jsonl", [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(10)])
    test = jsonl(tmp_path / "test.jsonl", [{"prompt": "q", "completion": "r"}])
    spec = completion_spec(train=str(train), test=f"jsonl:{test}")
    assert spec == DataSpec(None, f"jsonl:{train}", None, f"jsonl:{test}")
    got = load_completions(spec, "train")
    assert got.rows == load_completions_file(str(train)) and got.split == "train"
    assert got.split_sizes == {"train": 10, "validation": 0, "test": 1}
    assert load_completions(spec, "test").rows == (CompletionRow("q", "r"),)
    assert len(load_completions(spec)) == 11
    with pytest.raises(UserError, match="no validation data"):
        load_completions(spec, "validation")
    assert completion_spec("bbc-headlines") == "bbc-headlines"
    with pytest.raises(UserError, match="no data"):
        completion_spec()


def test_spec_fills_other_splits_from_the_named_data_set(tmp_path: Path) -> None:
    test = jsonl(tmp_path / "test.jsonl", [{"prompt": "q", "completion": "r"}])
    spec = completion_spec("bbc-headlines", test=str(test))
    assert load_completions(spec, "train").rows == load_completions("bbc-headlines", "train").rows
    assert load_completions(spec, "test").rows == (CompletionRow("q", "r"),)


def test_headline_and_body() -> None:
    assert headline_and_body("  Big win for team \n\nThe team won.\n\nA second paragraph. ") == CompletionRow(
        "The team won.\n\nA second paragraph.", "Big win for team"
    )
    for bad in ("Only a headline", "", "  \n\n  body alone"):
        with pytest.raises(UserError, match="article 3: expected a headline line"):
            headline_and_body(bad, "article 3")


@pytest.mark.parametrize("seed", [0, 7])
def test_bbc_headlines_articles_are_in_the_same_split_as_bbc_news(seed: int) -> None:
    """Every split holds the same articles (as a multiset of full texts, in the same order) as ``bbc-news``'s."""
    corpus = load_dataset("bbc-news", seed=seed)
    whole = load_completions("bbc-headlines", seed=seed)
    assert len(whole) == 2225 and whole.split_sizes == corpus.split_sizes

    def article(row: CompletionRow) -> str:  # every BBC article is "headline\n\nbody"
        return row.completion + "\n\n" + row.prompt

    assert [article(row) for row in whole] == corpus.texts  # row i is article i, split at its first line
    seen: set[str] = set()
    for split in SPLITS:
        news = load_dataset("bbc-news", split=split, seed=seed)
        heads = load_completions("bbc-headlines", split=split, seed=seed)
        assert heads.split == split and heads.split_sizes == news.split_sizes
        assert [article(row) for row in heads] == news.texts
        assert Counter(article(row) for row in heads) == Counter(news.texts)
        assert not set(news.texts) & seen  # and no article is in two splits
        seen |= set(news.texts)
    assert seen == set(corpus.texts)


def test_bbc_headlines_split_changes_with_the_seed() -> None:
    assert (
        load_completions("bbc-headlines", "test", seed=0).rows != load_completions("bbc-headlines", "test", seed=7).rows
    )


def test_bbc_headlines_rows_are_clean() -> None:
    data = load_completions("bbc-headlines", "validation", seed=0)
    assert data.name == "bbc-headlines" and data.split == "validation"
    for row in data:
        assert row.completion and "\n" not in row.completion and row.completion == row.completion.strip()
        assert row.prompt == row.prompt.strip() and len(row.prompt) > len(row.completion)
        assert not row.prompt.startswith(row.completion)
    assert data.rows[0].prompt == load_dataset("bbc-news", "validation").texts[0].split("\n", 1)[1].strip()


def test_token_length_summary() -> None:
    summary = token_length_summary([1, 2, 3, 4, 100])
    assert summary == {
        "n": 5,
        "min": 1.0,
        "median": 3.0,
        "p90": pytest.approx(61.6),
        "p99": pytest.approx(96.16),
        "max": 100.0,
        "mean": 22.0,
    }
    with pytest.raises(UserError, match="no lengths"):
        token_length_summary([])
