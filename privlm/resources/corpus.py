"""A labelled text corpus as every loader returns it, and the checks every corpus must pass."""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from privlm.errors import UserError

Example = tuple[str, int]


class Corpus(NamedTuple):
    """``examples[i] = (text, label)`` with ``0 <= label < len(label_names)``, in source order."""

    examples: tuple[Example, ...]
    label_names: tuple[str, ...]


def checked(corpus: Corpus, source: str) -> Corpus:
    """Return ``corpus`` if it has ≥ 2 classes, each with ≥ 1 example and no other label; else :class:`UserError`.

    ``source`` (file or dataset name) is named in the message.
    """
    if not corpus.examples:
        raise UserError(f"{source}: no examples")
    if len(corpus.label_names) < 2:
        raise UserError(f"{source}: needs at least 2 classes, found {list(corpus.label_names)}")
    counts = Counter(label for _, label in corpus.examples)
    outside = sorted(set(counts) - set(range(len(corpus.label_names))))
    if outside:
        raise UserError(f"{source}: label {outside[0]!r} is outside 0..{len(corpus.label_names) - 1}")
    empty = [name for i, name in enumerate(corpus.label_names) if counts[i] == 0]
    if empty:
        raise UserError(f"{source}: class {', '.join(map(repr, empty))} has no examples")
    return corpus
