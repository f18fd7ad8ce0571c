"""Dataset registry: ``load_dataset(name, split=None, seed=0) -> Dataset``.

Names:

- built-in: ``rotten-tomatoes`` (10,568 sentences, 2 classes), ``tweets`` (4,196, 2 classes),
  ``tweets-3class`` (38,158, 3 classes), ``bbc-news`` (2,225 articles, 5 topics); sources and
  parsing in :mod:`privlm.resources.sources`, verbalizers in :mod:`privlm.resources.verbalizers`;
- ``jsonl:PATH`` / ``csv:PATH``: a local file with ``text`` and ``label`` columns
  (:mod:`privlm.resources.files`);
- ``hf:NAME``: a Hugging Face hub dataset, when ``datasets`` is installed and the machine is online.

**Class names are public input.** For user data (``jsonl:``, ``csv:``, ``hf:`` without a ``ClassLabel``
column) the class names, their order and optionally their label words are given by the user
(``labels=``, i.e. ``--labels negative,positive`` or the TOML ``labels`` key; see
:mod:`privlm.resources.labels`) and never read off the private rows, so the class list, the verbalizer
and every ``label_name`` are the same whichever labels occur in the data; without them loading
fails. Built-in data sets keep their own names and verbalizers; ``labels`` given for one must
repeat its names in order (and its words, if any are given).

**Explicit splits.** A :class:`DataSpec` (``--data NAME --train FILE --validation FILE --test FILE``,
TOML keys ``dataset``/``train``/``validation``/``test``; built by :func:`data_spec`) takes each split
from the file given for it, **whole**, and every other split from the seeded split of ``--data``. A
private file given as ``--train`` is then the whole private set, and a file given as ``--test`` is
scored row by row. A built-in name given for a split means that data set's own split of that name.
Bare paths ending in ``.jsonl`` or ``.csv`` are read as ``jsonl:PATH`` / ``csv:PATH``.

Splits are seeded, 80 / 10 / 10, and keep identical texts in one split
(:mod:`privlm.resources.splits`): built-in data sets are stratified by class; **user data is split row
by row** (each row's split is a hash of its own text and the seed), so adding one row never moves
another, and the sizes are only about 80 / 10 / 10.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace

from privlm.errors import UserError
from privlm.resources import sources, verbalizers
from privlm.resources.corpus import Corpus, Example
from privlm.resources.files import read_csv, read_jsonl
from privlm.resources.hub import read_hub_dataset
from privlm.resources.labels import LabelSpec, as_labels, missing_labels_error
from privlm.resources.splits import SPLITS, check_split, groups_of_identical, per_row_split, stratified_split
from privlm.resources.verbalizers import Verbalizer, generic_verbalizer

DEFAULT_DATASET = "rotten-tomatoes"

BUILTIN: dict[str, tuple[Callable[[], Corpus], Verbalizer]] = {
    "rotten-tomatoes": (sources.rotten_tomatoes, verbalizers.SENTIMENT),
    "tweets": (sources.tweets, verbalizers.TWEETS),
    "tweets-3class": (sources.tweets_3class, verbalizers.TWEETS_3CLASS),
    "bbc-news": (sources.bbc_news, verbalizers.BBC_NEWS),
}
PREFIXES: dict[str, Callable[[str, LabelSpec | None], Corpus]] = {
    "jsonl:": read_jsonl,
    "csv:": read_csv,
    "hf:": read_hub_dataset,
}
NEEDS_LABELS = ("jsonl:", "csv:")  # hf: needs them unless its label column is a ClassLabel


@dataclass(frozen=True)
class Dataset:
    """Labelled examples of one split (or of the whole corpus when ``split`` is ``None``).

    ``examples[i] = (text, label)``, ``0 <= label < len(label_names)``; ``verbalizer.label_words[k]``
    is the word of class ``k``. ``split_sizes`` gives the size of every split of the full corpus.
    ``label_names`` and ``verbalizer`` are public: built in, or given by the user for user data (a
    class may have no examples).
    """

    name: str
    split: str | None
    seed: int
    examples: tuple[Example, ...]
    label_names: tuple[str, ...]
    verbalizer: Verbalizer
    split_sizes: dict[str, int]

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)

    def __getitem__(self, index: int) -> Example:
        return self.examples[index]

    @property
    def texts(self) -> list[str]:
        """The texts, in example order."""
        return [text for text, _ in self.examples]

    @property
    def labels(self) -> list[int]:
        """The class ids, in example order."""
        return [label for _, label in self.examples]

    @property
    def num_classes(self) -> int:
        """Number of classes ``K``."""
        return len(self.label_names)

    def class_counts(self) -> dict[str, int]:
        """Examples per class name, in label order."""
        counts = Counter(self.labels)
        return {name: counts[k] for k, name in enumerate(self.label_names)}


@dataclass(frozen=True)
class DataSpec:
    """Where each split comes from: the file (or built-in name) given for it, else the seeded split of
    ``data``. Load it with :func:`load_dataset` like a name."""

    data: str | None = None
    train: str | None = None
    validation: str | None = None
    test: str | None = None

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) is not None)


def data_spec(
    data: str | None = None, train: str | None = None, validation: str | None = None, test: str | None = None
) -> str | DataSpec:
    """``data`` itself when no split is given as a file (the seeded 80/10/10 split), else a :class:`DataSpec`;
    a bare ``PATH.jsonl`` / ``PATH.csv`` is read as ``jsonl:PATH`` / ``csv:PATH``."""
    data, train, validation, test = (_dataset_name(v) for v in (data, train, validation, test))
    if train is None and validation is None and test is None:
        if data is None:
            raise UserError(
                "no data: give --data NAME (split 80/10/10) or the splits as files, --train FILE --test FILE"
            )
        return data
    return DataSpec(data, train, validation, test)


def _dataset_name(value: str | None) -> str | None:
    if value is None or value in BUILTIN or value.startswith(tuple(PREFIXES)):
        return value
    for kind in ("jsonl", "csv"):
        if value.lower().endswith(f".{kind}"):
            return f"{kind}:{value}"
    raise UserError(f"unknown dataset {value!r}; known: {', '.join(dataset_names())}, or a .jsonl/.csv file")


def dataset_names() -> list[str]:
    """Registered names, plus the prefixes that name user data."""
    return sorted(BUILTIN) + [f"{prefix}PATH" for prefix in ("jsonl:", "csv:")] + ["hf:NAME"]


def load_dataset(name: str | DataSpec, split: str | None = None, seed: int = 0, labels: object = None) -> Dataset:
    """Load dataset ``name``; ``split`` is ``"train"``, ``"validation"``, ``"test"`` or ``None`` (all).

    ``labels``: the public class names (and optional words) — a :class:`LabelSpec` or any form
    :func:`~privlm.resources.labels.as_labels` takes (``"neg,pos"``, ``"neg=bad,pos=great"``, a list,
    a mapping name → word). Required for
    ``jsonl:``/``csv:`` data and for ``hf:`` data without a ``ClassLabel`` column.

    The same ``(name, seed)`` gives the same split everywhere, and a text never appears in two
    splits. Bad names, files or contents raise :class:`UserError`.
    """
    check_split(split)
    if isinstance(name, DataSpec):
        return _load_spec(name, split, seed, as_labels(labels))
    return _load(name, split, seed, *_split(name, seed, as_labels(labels)))


Splits = tuple[Corpus, Verbalizer, dict[str, list[int]]]


def _split(name: str, seed: int, spec: LabelSpec | None) -> Splits:
    """Data set ``name`` read (``spec`` checked against a built-in's classes), its verbalizer, and the example
    indices of each split."""
    corpus, verbalizer, builtin = _read(name, spec)
    texts, labels = zip(*corpus.examples)
    if builtin:
        indices = stratified_split(labels, seed, groups=groups_of_identical(texts))
    else:
        indices = per_row_split(texts, seed)
    return corpus, verbalizer, indices


def _load(
    name: str, split: str | None, seed: int, corpus: Corpus, verbalizer: Verbalizer, indices: dict[str, list[int]]
) -> Dataset:
    """``split`` (``None``: all) of data set ``name``, read and split by :func:`_split`."""
    chosen = corpus.examples if split is None else tuple(corpus.examples[i] for i in indices[split])
    return Dataset(
        name=name,
        split=split,
        seed=seed,
        examples=chosen,
        label_names=corpus.label_names,
        verbalizer=verbalizer,
        split_sizes={part: len(indices[part]) for part in SPLITS},
    )


def _load_spec(spec: DataSpec, split: str | None, seed: int, labels: LabelSpec | None) -> Dataset:
    """``split`` of ``spec`` (``None``: every split it has, one after the other). Every split shares the
    classes and verbalizer: a built-in's when one is named, else those of ``labels``."""
    read: dict[str, Splits] = {}

    def load(name: str, part: str | None) -> Dataset:
        """``load_dataset(name, part, seed, labels)``, but each data set is read and split once for every part
        of ``spec`` that names it. Only a built-in reference is read before ``labels`` becomes its own classes
        (which pass its check), so every later read would see the same ``labels``."""
        if name not in read:
            read[name] = _split(name, seed, labels)
        return _load(name, part, seed, *read[name])

    builtin = next((n for n in (spec.data, spec.train, spec.validation, spec.test) if n in BUILTIN), None)
    reference = None
    if builtin is not None:
        reference = load(builtin, None)  # checks ``labels`` against the built-in
        words = reference.verbalizer.label_words
        labels = LabelSpec(reference.label_names, words, reference.verbalizer.template)
    parts = {part: _part(spec, part, load) for part in SPLITS}
    available = {part: data for part, data in parts.items() if data is not None}
    if split is not None and split not in available:
        raise UserError(f"no {split} data: give --{split} FILE, or --data NAME to split one data set 80/10/10")
    chosen = [available[split]] if split is not None else list(available.values())
    first = reference or chosen[0]
    return Dataset(
        name=str(spec),
        split=split,
        seed=seed,
        examples=tuple(e for data in chosen for e in data.examples),
        label_names=first.label_names,
        verbalizer=first.verbalizer,
        split_sizes={part: len(parts[part]) if parts[part] is not None else 0 for part in SPLITS},
    )


def _part(spec: DataSpec, part: str, load: Callable[[str, str | None], Dataset]) -> Dataset | None:
    """One split of ``spec`` (``load``: name, split → data set): its file, whole; a built-in's own split; that
    split of ``spec.data``; or ``None``."""
    given = getattr(spec, part)
    if given is None:
        return None if spec.data is None else load(spec.data, part)
    if given in BUILTIN:
        return load(given, part)
    return replace(load(given, None), split=part)


def _read(name: str, spec: LabelSpec | None) -> tuple[Corpus, Verbalizer, bool]:
    if name in BUILTIN:
        reader, verbalizer = BUILTIN[name]
        corpus = reader()
        if spec is not None:
            _check_builtin_labels(name, corpus.label_names, verbalizer, spec)
        return corpus, verbalizer, True
    for prefix, reader in PREFIXES.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            if spec is None and prefix in NEEDS_LABELS:
                raise missing_labels_error(name)
            corpus = reader(name[len(prefix) :], spec)
            words = spec.label_words if spec is not None else None
            template = spec.template if spec is not None else None
            description = spec.description if spec is not None else None
            return corpus, generic_verbalizer(corpus.label_names, words, template, description), False
    raise UserError(f"unknown dataset {name!r}; known: {', '.join(dataset_names())}")


def _check_builtin_labels(name: str, names: tuple[str, ...], verbalizer: Verbalizer, spec: LabelSpec) -> None:
    """``--labels`` for a built-in data set may only repeat its names (and words): they are built in,
    like its template."""
    if spec.template is not None and spec.template != verbalizer.template:
        raise UserError(f"{name} has a built-in prompt ({verbalizer.template!r}); --template is for user data")
    if spec.description is not None:
        raise UserError(f"{name} has a built-in generation instruction; --describe is for user data")
    if spec.names != names:
        raise UserError(
            f"{name} is built in with classes {','.join(names)}; --labels may only repeat them "
            f"(got {','.join(spec.names)}), or leave it out"
        )
    if spec.has_words and spec.label_words != verbalizer.label_words:
        words = ",".join(f"{n}={w}" for n, w in zip(names, verbalizer.label_words))
        raise UserError(f"{name} has built-in label words ({words}); --labels cannot change them")
