"""Dataset registry: ``load_dataset(name, split=None, seed=0) -> Dataset``.

Names:

- built-in: ``rotten-tomatoes`` (10,568 sentences, 2 classes), ``tweets`` (4,196, 2 classes),
  ``tweets-3class`` (38,158, 3 classes), ``bbc-news`` (2,225 articles, 5 topics); sources and
  parsing in :mod:`privlm.resources.sources`, verbalizers in :mod:`privlm.resources.verbalizers`;
- ``jsonl:PATH`` / ``csv:PATH``: a local file with ``text`` and ``label`` columns
  (:mod:`privlm.resources.files`);
- ``hf:NAME``: a Hugging Face hub dataset, when ``datasets`` is installed and the machine is online.

Splits are seeded and stratified, 80 / 10 / 10, and keep identical texts in one split
(:mod:`privlm.resources.splits`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from privlm.errors import UserError
from privlm.resources import sources, verbalizers
from privlm.resources.corpus import Corpus, Example
from privlm.resources.files import read_csv, read_jsonl
from privlm.resources.hub import read_hub_dataset
from privlm.resources.splits import SPLITS, check_split, groups_of_identical, stratified_split
from privlm.resources.verbalizers import Verbalizer, generic_verbalizer

DEFAULT_DATASET = "rotten-tomatoes"

BUILTIN: dict[str, tuple[Callable[[], Corpus], Verbalizer]] = {
    "rotten-tomatoes": (sources.rotten_tomatoes, verbalizers.SENTIMENT),
    "tweets": (sources.tweets, verbalizers.TWEETS),
    "tweets-3class": (sources.tweets_3class, verbalizers.TWEETS_3CLASS),
    "bbc-news": (sources.bbc_news, verbalizers.BBC_NEWS),
}
PREFIXES: dict[str, Callable[[str], Corpus]] = {"jsonl:": read_jsonl, "csv:": read_csv, "hf:": read_hub_dataset}


@dataclass(frozen=True)
class Dataset:
    """Labelled examples of one split (or of the whole corpus when ``split`` is ``None``).

    ``examples[i] = (text, label)``, ``0 <= label < len(label_names)``; ``verbalizer.label_words[k]``
    is the word of class ``k``. ``split_sizes`` gives the size of every split of the full corpus.
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


def dataset_names() -> list[str]:
    """Registered names, plus the prefixes that name user data."""
    return sorted(BUILTIN) + [f"{prefix}PATH" for prefix in ("jsonl:", "csv:")] + ["hf:NAME"]


def load_dataset(name: str, split: str | None = None, seed: int = 0) -> Dataset:
    """Load dataset ``name``; ``split`` is ``"train"``, ``"validation"``, ``"test"`` or ``None`` (all).

    The same ``(name, seed)`` gives the same split everywhere, and a text never appears in two
    splits. Bad names, files or contents raise :class:`UserError`.
    """
    check_split(split)
    corpus, verbalizer = _read(name)
    texts, labels = zip(*corpus.examples)
    indices = stratified_split(labels, seed, groups=groups_of_identical(texts))
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


def _read(name: str) -> tuple[Corpus, Verbalizer]:
    if name in BUILTIN:
        reader, verbalizer = BUILTIN[name]
        return reader(), verbalizer
    for prefix, reader in PREFIXES.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            corpus = reader(name[len(prefix) :])
            return corpus, generic_verbalizer(corpus.label_names)
    raise UserError(f"unknown dataset {name!r}; known: {', '.join(dataset_names())}")
