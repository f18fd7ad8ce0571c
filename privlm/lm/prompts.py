"""Token layout of a label-word prompt, shared by scoring, fine-tuning and membership inference.

A classification example is scored as the continuation ``<label word>`` of the context
``fill(template, text)`` (:func:`privlm.resources.verbalizers.fill`, e.g. ``"{text} It was "`` gives
``"a fine film It was "`` + ``"great"``). Trailing whitespace of the
context is moved to the front of the label word (``"… It was"`` + ``" great"``), so that byte-level
BPE tokenizers see the word with its leading space, as in running text. Context and continuation are
tokenized separately and concatenated, so the label-word tokens are the same for every text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.resources.padding import padded_batch
from privlm.resources.verbalizers import Verbalizer, fill

IGNORE_INDEX = -100


@dataclass(frozen=True)
class EncodedOption:
    """Token ids of ``context + continuation`` and how many trailing ids are the continuation."""

    input_ids: list[int]
    n_option_tokens: int


def split_prompt(text: str, template: str, word: str) -> tuple[str, str]:
    """``(context, continuation)`` with the context's trailing whitespace moved onto the word."""
    prompt = fill(template, text)
    context = prompt.rstrip()
    return context, prompt[len(context) :] + word


def encode_option(
    tokenizer: PreTrainedTokenizerBase, text: str, template: str, word: str, max_length: int
) -> EncodedOption:
    """Encode one (text, label word) pair; the context is cut from the left to fit ``max_length``.

    Left truncation keeps the end of the prompt (``" It was"``) next to the label word.
    """
    context, continuation = split_prompt(text, template, word)
    context_ids = tokenizer(context, add_special_tokens=True)["input_ids"]
    option_ids = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    if not option_ids:
        raise UserError(f"label word {word!r} encodes to no tokens")
    room = max_length - len(option_ids)
    if room < 1:
        raise UserError(f"max_length={max_length} leaves no room for a context before {word!r}")
    return EncodedOption(context_ids[-room:] + option_ids, len(option_ids))


def check_label_words(tokenizer: PreTrainedTokenizerBase, verbalizer: Verbalizer) -> None:
    """Refuse label words that add no token after the prompt, or two that add the same tokens. A word
    of several tokens is fine here: scoring and fine-tuning use all of its tokens (length-normalized)."""
    seen: dict[tuple[int, ...], str] = {}
    for word in verbalizer.label_words:
        _, continuation = split_prompt("", verbalizer.template, word)
        ids = tuple(tokenizer(continuation, add_special_tokens=False)["input_ids"])
        if not ids:
            raise UserError(f"label word {word!r} encodes to no tokens for this tokenizer; choose another word")
        if ids in seen:
            raise UserError(f"label words {seen[ids]!r} and {word!r} encode to the same tokens; choose distinct words")
        seen[ids] = word


def collate(
    options: Sequence[EncodedOption], pad_token_id: int, *, width: int | None = None, rows: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-padded batch: ``input_ids``, ``attention_mask`` and ``labels`` (shape ``(B, T)``).

    ``labels`` holds the option tokens at their own positions and ``IGNORE_INDEX`` elsewhere
    (context and padding), so a shifted cross-entropy over ``labels`` is the label-word loss.
    ``T`` is ``width`` (default: the longest option) and ``B`` is ``rows`` (default: one per option): a
    fixed shape adds one-token filler rows after the options, with no target
    (:func:`privlm.resources.padding.padded_batch`, which refuses options that do not fit).
    """
    ids, mask, _ = padded_batch([o.input_ids for o in options], pad_token_id, width=width, rows=rows)
    labels = torch.full_like(ids, IGNORE_INDEX)
    for row, option in enumerate(options):
        length = len(option.input_ids)
        labels[row, length - option.n_option_tokens : length] = ids[row, length - option.n_option_tokens : length]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The tokenizer's pad id, else its eos id (padding is masked, so any id works)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise UserError("tokenizer has neither a pad nor an eos token")
    return pad
