"""Verbalizers: how a classification example becomes a next-word prediction for a causal LM.

An example ``(text, label)`` is read as the prompt ``text + suffix`` followed by the label's word,
e.g. ``"a fine film" + " It was " + "great"``. Tokenization (moving the suffix's trailing space onto
the word) is :mod:`privlm.evaluation.prompts`' concern; here we only fix the strings.

Built-in verbalizers (suffix; one word per class, in label order):

- ``rotten-tomatoes``: ``" It was "``; bad, great.
- ``tweets``: ``" Does the tweet express joy or sadness? "``; sadness, joy.
- ``tweets-3class``: ``" Is the tweet negative, neutral or positive? "``; negative, neutral, positive.
- ``bbc-news``: ``" This news article is about "``; business, entertainment, politics, sports, technology.
- user files (``jsonl:``, ``csv:``, ``hf:``): ``" Label: "``; the words given with ``--labels NAME=WORD``,
  else the label names (both public input, never read off the data).

The rotten-tomatoes verbalizer and the tweets question follow the GRADMM reference code (DESIGN.md
§3); the tweets label words and the other verbalizers are ours (each word names its class). With
SmolLM2's tokenizer every label word, with its leading space, is one token, distinct within its task
(checked by the slow test).
"""

from __future__ import annotations

from dataclasses import dataclass

from privlm.errors import UserError


@dataclass(frozen=True)
class Verbalizer:
    """Prompt suffix plus one label word per class (``label_words[i]`` verbalizes label ``i``)."""

    suffix: str
    label_words: tuple[str, ...]

    def prompt(self, text: str) -> str:
        """The context the LM continues: ``text + suffix``."""
        return text + self.suffix

    def completion(self, text: str, label: int) -> str:
        """The full verbalized example ``text + suffix + label_words[label]``."""
        return self.prompt(text) + self.label_words[label]

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form: ``{"suffix": ..., "label_words": [...]}``."""
        return {"suffix": self.suffix, "label_words": list(self.label_words)}


SENTIMENT = Verbalizer(" It was ", ("bad", "great"))
TWEETS = Verbalizer(" Does the tweet express joy or sadness? ", ("sadness", "joy"))
TWEETS_3CLASS = Verbalizer(" Is the tweet negative, neutral or positive? ", ("negative", "neutral", "positive"))
BBC_NEWS = Verbalizer(
    " This news article is about ", ("business", "entertainment", "politics", "sports", "technology")
)
GENERIC_SUFFIX = " Label: "


def generic_verbalizer(label_names: tuple[str, ...], words: tuple[str, ...] | None = None) -> Verbalizer:
    """Verbalizer of a user-supplied dataset: suffix ``" Label: "``, the given ``words`` (one per class),
    else the label names as words."""
    words = tuple(label_names) if words is None else tuple(words)
    if len(words) != len(label_names) or any(not word.strip() for word in words):
        raise UserError(f"label words must be non-empty, one per class, got {list(words)}")
    return Verbalizer(GENERIC_SUFFIX, words)
