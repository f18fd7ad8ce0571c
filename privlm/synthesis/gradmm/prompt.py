"""The public prompt layout of GRADMM and the model calls that read the last position.

Every sequence, real or synthetic, is ``prefix + text + suffix`` where ``prefix`` opens a document
(:func:`document_start_ids`) followed by the template's text before ``{text}`` (empty for the built-in
verbalizers) and ``suffix`` is the template's text after it (e.g. ``" It was"``); the
LM head's next-token prediction at the last position is scored against the first token of the class's
label word (e.g. ``" great"``). Everything here is public: it depends on the tokenizer and verbalizer
only, never on private data.

Assumption (stated because the closed forms rest on it): the model's logits are ``h @ W.T (+ b)`` with
``h`` the final hidden state returned by ``model.base_model`` (after the final norm) and ``W`` the
output-embedding weight; models with logit scaling or soft-capping are not supported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.resources.padding import padded_batch
from privlm.resources.verbalizers import TEXT, fill, split_template


@dataclass(frozen=True)
class Prompt:
    """Token ids of the public prompt: ``prefix_ids`` (document start, then ``lead_ids``: the template's
    text before ``{text}``, ``prefix``), ``suffix_ids``, one label token per class."""

    prefix_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    suffix: str
    label_words: tuple[str, ...]
    label_names: tuple[str, ...]
    label_token_ids: tuple[int, ...]
    prefix: str = ""
    lead_ids: tuple[int, ...] = ()

    @property
    def template(self) -> str:
        """The verbalizer's template, ``prefix + "{text}" + suffix``."""
        return f"{self.prefix}{TEXT}{self.suffix}"

    def completion(self, text: str, label: int) -> str:
        """``text`` verbalized with class ``label``'s word (a few-shot demonstration)."""
        return fill(self.template, text) + self.label_words[label]

    def text_ids(self, tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
        """The ids of ``text`` where it follows ``prefix_ids`` (the prefix's trailing space goes with it)."""
        gap = self.prefix[len(self.prefix.rstrip()) :]
        return tokenizer.encode(gap + text, add_special_tokens=False)

    def with_context(self, context: Sequence[int]) -> tuple[int, ...]:
        """``prefix_ids`` with ``context`` (e.g. demonstrations) between the document start and ``lead_ids``."""
        start = self.prefix_ids[: len(self.prefix_ids) - len(self.lead_ids)]
        return (*start, *context, *self.lead_ids)

    def to_dict(self) -> dict:
        """JSON-able form (stored with the release; ``prefix`` and ``lead_ids`` only when there is a prefix,
        so releases made without one keep their form)."""
        return {
            "prefix_ids": list(self.prefix_ids),
            "suffix_ids": list(self.suffix_ids),
            "suffix": self.suffix,
            "label_words": list(self.label_words),
            "label_names": list(self.label_names),
            "label_token_ids": list(self.label_token_ids),
            **({"prefix": self.prefix, "lead_ids": list(self.lead_ids)} if self.prefix else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Prompt:
        """Inverse of :meth:`to_dict`."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


DOCUMENT_SEPARATOR = "<|endoftext|>"


def document_start_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """The public prefix that opens every sequence: ``<|endoftext|>`` where the vocabulary has it
    (GPT-2-style BPE and SmolLM2 separate pretraining documents with it; an instruct model's BOS such
    as ``<|im_start|>`` would instead start a chat turn), else BOS, else nothing."""
    vocab = tokenizer.get_vocab()
    if DOCUMENT_SEPARATOR in vocab:
        return (int(vocab[DOCUMENT_SEPARATOR]),)
    return () if tokenizer.bos_token_id is None else (int(tokenizer.bos_token_id),)


def build_prompt(
    tokenizer: PreTrainedTokenizerBase,
    template: str,
    label_words: Sequence[str],
    label_names: Sequence[str] | None = None,
) -> Prompt:
    """Tokenize the verbalizer: ``template`` (e.g. ``"{text} It was "``; without ``{text}``, a suffix) and
    one label word per class.

    The label token of word ``w`` is the first token that ``suffix + w`` adds after ``suffix.rstrip()``
    (so ``" It was " + "great"`` gives the token ``" great"``): GRADMM releases and matches that one
    token of a multi-token word. Raises :class:`UserError` when two classes share a label token or a
    word adds no token.
    """
    prefix, suffix = split_template(template)
    lead = prefix.rstrip()
    lead_ids = tuple(tokenizer.encode(lead, add_special_tokens=False)) if lead else ()
    stem = suffix.rstrip()
    suffix_ids = tuple(tokenizer.encode(stem, add_special_tokens=False))
    label_ids = []
    for word in label_words:
        full = tokenizer.encode(suffix + word, add_special_tokens=False)
        if tuple(full[: len(suffix_ids)]) != suffix_ids or len(full) == len(suffix_ids):
            raise UserError(f"label word {word!r} does not tokenize as a continuation of {suffix!r}")
        label_ids.append(full[len(suffix_ids)])
    if len(set(label_ids)) != len(label_ids):
        raise UserError(f"label words {list(label_words)} share a first token; choose distinct words")
    return Prompt(
        prefix_ids=(*document_start_ids(tokenizer), *lead_ids),
        prefix=prefix,
        lead_ids=lead_ids,
        suffix_ids=suffix_ids,
        suffix=suffix,
        label_words=tuple(label_words),
        label_names=tuple(label_names if label_names is not None else label_words),
        label_token_ids=tuple(label_ids),
    )


def head_weight(model: PreTrainedModel) -> torch.Tensor:
    """The LM-head weight ``W`` (V × d): the parameter whose gradient GRADMM releases and matches."""
    return model.get_output_embeddings().weight


def head_logits(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    """Logits (…, V) from final hidden states (…, d)."""
    return model.get_output_embeddings()(hidden)


def last_hidden_from_embeds(model: PreTrainedModel, embeds: torch.Tensor) -> torch.Tensor:
    """Final hidden state (B, d) at the last position of unpadded input embeddings (B, T, d)."""
    return model.base_model(inputs_embeds=embeds, use_cache=False).last_hidden_state[:, -1]


def last_hidden_from_ids(
    model: PreTrainedModel, sequences: Sequence[Sequence[int]], *, width: int | None = None, rows: int | None = None
) -> torch.Tensor:
    """Final hidden state (B, d) at each sequence's own last token (right padding + attention mask);
    ``width``/``rows``: compute in a batch of that fixed public shape (:mod:`privlm.resources.padding`)."""
    ids, mask, lengths = padded_batch(sequences, width=width, rows=rows)
    out = model.base_model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    return out[torch.arange(len(sequences)), lengths - 1]


def encode_text(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, text: str, max_tokens: int) -> list[int]:
    """``prefix + text[:max_tokens tokens] + suffix`` as ids (``max_tokens`` is a public parameter)."""
    ids = prompt.text_ids(tokenizer, text)[:max_tokens]
    return [*prompt.prefix_ids, *ids, *prompt.suffix_ids]
