"""Prompt → completion data for the ``generate`` task: ``load_completions(name, split=None, seed=0)``.

Names:

- built-in: ``bbc-headlines`` — every ``bbc-news`` article (:func:`privlm.resources.sources.bbc_news`),
  its body as the prompt and its first line, the headline, as the completion (2,225 rows). **Each article
  is in the same split as in** ``bbc-news``: the rows of a split are read off
  ``load_dataset("bbc-news", split, seed)`` itself, in its order, so the two data sets never disagree
  (and a classifier's test articles are never a headline model's training articles, for one seed);
- ``jsonl:PATH`` / ``csv:PATH`` (a bare path ending in ``.jsonl`` / ``.csv`` too): a UTF-8 file with a
  non-empty ``prompt`` and ``completion`` in every row (other columns are ignored; surrounding whitespace
  is stripped). Every problem is a :class:`UserError` naming the file and line (never the private value).

**Splits.** User data is split **row by row** with the rule of :func:`privlm.resources.splits.per_row_split`
(each row's split is a hash of its own *prompt* and the seed), so adding a row never moves another, and
rows with the same prompt always share a split (a test prompt is never a training prompt). As for
classification data, a :class:`~privlm.resources.datasets.DataSpec` built by :func:`completion_spec`
(``--data NAME --train FILE --validation FILE --test FILE``) takes each split from the file given for it,
**whole**, a built-in name given for a split means that data set's own split, and every other split comes
from the seeded split of ``data``.

:func:`token_length_summary` summarises token lengths (e.g. of the prompts) for a report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from privlm.errors import UserError
from privlm.resources.datasets import DataSpec, load_dataset
from privlm.resources.files import csv_rows, jsonl_rows
from privlm.resources.splits import SPLITS, check_split, per_row_split

PROMPT, COMPLETION = "prompt", "completion"
BBC_HEADLINES = "bbc-headlines"
PREFIXES = ("jsonl:", "csv:")


@dataclass(frozen=True)
class CompletionRow:
    """One example: the model reads ``prompt`` (inside a template) and learns to write ``completion``."""

    prompt: str
    completion: str


@dataclass(frozen=True)
class CompletionDataset:
    """Prompt/completion rows of one split (or of the whole data set when ``split`` is ``None``).

    ``split_sizes`` gives the number of rows of every split of the full data set."""

    name: str
    split: str | None
    seed: int
    rows: tuple[CompletionRow, ...]
    split_sizes: dict[str, int]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[CompletionRow]:
        return iter(self.rows)

    def __getitem__(self, index: int) -> CompletionRow:
        return self.rows[index]

    @property
    def prompts(self) -> list[str]:
        """The prompts, in row order."""
        return [row.prompt for row in self.rows]

    @property
    def completions(self) -> list[str]:
        """The completions (references), in row order."""
        return [row.completion for row in self.rows]


def completion_dataset_names() -> list[str]:
    """Built-in names, plus the prefixes that name user files."""
    return sorted(BUILTIN) + [f"{prefix}PATH" for prefix in PREFIXES]


def completion_spec(
    data: str | None = None, train: str | None = None, validation: str | None = None, test: str | None = None
) -> str | DataSpec:
    """``data`` itself when no split is given as a file (the seeded split), else a
    :class:`~privlm.resources.datasets.DataSpec` (load it with :func:`load_completions`); a bare
    ``PATH.jsonl`` / ``PATH.csv`` is read as ``jsonl:PATH`` / ``csv:PATH``. The completion-data twin of
    :func:`privlm.resources.datasets.data_spec`, whose names are classification data sets."""
    data, train, validation, test = (_name(v) for v in (data, train, validation, test))
    if train is None and validation is None and test is None:
        if data is None:
            raise UserError(
                "no data: give --data NAME (split 80/10/10) or the splits as files, --train FILE --test FILE"
            )
        return data
    return DataSpec(data, train, validation, test)


def load_completions(name: str | DataSpec, split: str | None = None, seed: int = 0) -> CompletionDataset:
    """Load completion data ``name`` (a name or a :func:`completion_spec`); ``split`` is ``"train"``,
    ``"validation"``, ``"test"`` or ``None`` (all rows). Bad names, files or rows raise :class:`UserError`."""
    check_split(split)
    if isinstance(name, DataSpec):
        return _load_spec(name, split, seed)
    name = _name(name)
    assert name is not None
    if name in BUILTIN:
        return BUILTIN[name](split, seed)
    rows = load_completions_file(name)
    indices = per_row_split([row.prompt for row in rows], seed)
    chosen = rows if split is None else tuple(rows[i] for i in indices[split])
    return CompletionDataset(name, split, seed, chosen, {part: len(indices[part]) for part in SPLITS})


def load_completions_file(path: str) -> tuple[CompletionRow, ...]:
    """Every row of one user file, in file order: ``jsonl:PATH``, ``csv:PATH`` or a bare ``.jsonl`` / ``.csv``
    path. At least one row; each with a non-empty ``prompt`` and ``completion`` (stripped)."""
    name = _name(path)
    assert name is not None
    if name in BUILTIN:
        raise UserError(f"{name} is a built-in data set, not a file")
    kind, _, file = name.partition(":")
    return _read_jsonl(Path(file)) if kind == "jsonl" else _read_csv(Path(file))


def bbc_headlines(split: str | None = None, seed: int = 0) -> CompletionDataset:
    """``bbc-headlines``: each ``bbc-news`` article as ``CompletionRow(body, headline)``, in the rows and
    the order of ``load_dataset("bbc-news", split, seed)`` (so the same article is in the same split)."""
    check_split(split)
    articles = load_dataset("bbc-news", split=split, seed=seed)
    rows = tuple(headline_and_body(text, f"bbc-news article {i}") for i, text in enumerate(articles.texts))
    return CompletionDataset(BBC_HEADLINES, split, seed, rows, dict(articles.split_sizes))


def headline_and_body(article: str, where: str = "article") -> CompletionRow:
    """``CompletionRow(prompt=body, completion=headline)`` of a BBC article ``"headline\\n\\nbody…"`` (its
    first line is the headline; both stripped). An article without a headline or a body is a :class:`UserError`."""
    headline, _, body = article.strip().partition("\n")
    headline, body = headline.strip(), body.strip()
    if not headline or not body:
        raise UserError(f"{where}: expected a headline line followed by the article's body")
    return CompletionRow(prompt=body, completion=headline)


def token_length_summary(lengths: Sequence[int]) -> dict[str, float]:
    """``{"n", "min", "median", "p90", "p99", "max", "mean"}`` of token ``lengths`` (percentiles linearly
    interpolated, as :func:`numpy.percentile`). No lengths is a :class:`UserError`."""
    values = np.asarray(lengths, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise UserError("no lengths to summarise")
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "n": int(values.size),
        "min": float(values.min()),
        "median": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(values.max()),
        "mean": float(values.mean()),
    }


BUILTIN: dict[str, Callable[[str | None, int], CompletionDataset]] = {BBC_HEADLINES: bbc_headlines}


def _name(value: str | None) -> str | None:
    """A known name, prefixed name, or a bare ``.jsonl`` / ``.csv`` path as ``jsonl:PATH`` / ``csv:PATH``."""
    if value is None or value in BUILTIN:
        return value
    if value.startswith(PREFIXES):
        if value.partition(":")[2]:
            return value
    else:
        for kind in ("jsonl", "csv"):
            if value.lower().endswith(f".{kind}"):
                return f"{kind}:{value}"
    raise UserError(
        f"unknown completion data set {value!r}; known: {', '.join(completion_dataset_names())}, or a .jsonl/.csv file"
    )


def _load_spec(spec: DataSpec, split: str | None, seed: int) -> CompletionDataset:
    """``split`` of ``spec`` (``None``: every split it has, one after the other); each name is read once."""
    read: dict[str, CompletionDataset] = {}

    def whole(name: str) -> CompletionDataset:
        if name not in read:
            read[name] = load_completions(name, None, seed)
        return read[name]

    def part(name: str, which: str) -> CompletionDataset:
        if name in BUILTIN:
            return load_completions(name, which, seed)
        data = whole(name)  # user data: its seeded per-row split, computed from the rows read once
        indices = per_row_split(data.prompts, seed)[which]
        return replace(data, split=which, rows=tuple(data.rows[i] for i in indices))

    parts: dict[str, CompletionDataset | None] = {}
    for which in SPLITS:
        given = getattr(spec, which)
        if given is None:
            parts[which] = None if spec.data is None else part(spec.data, which)
        elif given in BUILTIN:
            parts[which] = part(given, which)
        else:
            parts[which] = replace(whole(given), split=which)
    available = {which: data for which, data in parts.items() if data is not None}
    if split is not None and split not in available:
        raise UserError(f"no {split} data: give --{split} FILE, or --data NAME to split one data set 80/10/10")
    chosen = [available[split]] if split is not None else list(available.values())
    return CompletionDataset(
        name=str(spec),
        split=split,
        seed=seed,
        rows=tuple(row for data in chosen for row in data.rows),
        split_sizes={which: len(data) if data is not None else 0 for which, data in parts.items()},
    )


def _row(prompt: object, completion: object, where: str) -> CompletionRow:
    for column, value in ((PROMPT, prompt), (COMPLETION, completion)):
        if not isinstance(value, str) or not value.strip():
            raise UserError(
                f"{where}: '{column}' must be a non-empty string (the value is not shown: rows are private)"
            )
    assert isinstance(prompt, str) and isinstance(completion, str)
    return CompletionRow(prompt.strip(), completion.strip())


def _read_jsonl(path: Path) -> tuple[CompletionRow, ...]:
    return _nonempty(
        path, [_row(r[PROMPT], r[COMPLETION], where) for where, r in jsonl_rows(path, (PROMPT, COMPLETION))]
    )


def _read_csv(path: Path) -> tuple[CompletionRow, ...]:
    return _nonempty(path, [_row(r[PROMPT], r[COMPLETION], where) for where, r in csv_rows(path, (PROMPT, COMPLETION))])


def _nonempty(path: Path, rows: list[CompletionRow]) -> tuple[CompletionRow, ...]:
    if not rows:
        raise UserError(f"{path}: no rows")
    return tuple(rows)
