"""Prompt → completion sequences for the ``generate`` task: encoding with a loss mask, batches, greedy decoding.

**Layout.** A row is ``[specials] + head + suffix`` (the *context*) followed by the completion and EOS:

- ``template`` wraps the prompt (``{text}`` is replaced by it, :func:`privlm.resources.verbalizers.fill`);
  the *head* is the template's text before ``{text}`` plus the prompt, the *suffix* the template's text
  after it (``"{text}\\nHeadline: "`` → suffix ``"\\nHeadline:"``). As in :mod:`privlm.lm.prompts`, the
  context's trailing whitespace moves to the front of the completion (``"…\\nHeadline:"`` + ``" Ad sales…"``),
  so byte-level BPE tokenizers see the completion's first word with its leading space: end the template
  with a space for that;
- *specials* are the tokens the tokenizer puts before any text (a BOS for Llama-2/3-style tokenizers;
  none for SmolLM2's or the tiny test tokenizer, whose ``add_special_tokens`` adds nothing);
- head, suffix and completion are tokenized separately and concatenated, so the suffix and the completion
  have the same tokens whatever the prompt, and a cut never re-tokenizes anything;
- the completion ends with the tokenizer's EOS (when it has one), which the model learns to emit.

**Cuts.** When a row is longer than ``max_length`` the *prompt's body is cut*: the head keeps its beginning
(the article's first sentences) and the specials, the full suffix and the whole completion are kept. A row
whose completion and suffix leave no room for one head token is a :class:`UserError` naming the row.

**Labels.** ``labels`` is aligned with ``input_ids``: the token id on completion (and EOS) positions,
``IGNORE_INDEX`` (-100) on context positions and padding, as Hugging Face models and
:func:`privlm.lm.scoring.option_logprobs` shift them.

**Decoding.** :func:`greedy_complete` encodes each context the same way (cut to leave room for
``max_new_tokens``), left-pads a batch and runs ``model.generate(do_sample=False)`` with the KV cache,
stopping a row at EOS or at the first newline after some text; the answer is its first non-empty line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, StoppingCriteria, StoppingCriteriaList

from privlm.errors import UserError
from privlm.lm.prompts import IGNORE_INDEX, pad_token_id
from privlm.resources.completions import CompletionRow
from privlm.resources.padding import padded_batch
from privlm.resources.verbalizers import TEXT, split_template

DEFAULT_TEMPLATE = TEXT
HEADLINE_TEMPLATE = f"{TEXT}\nHeadline: "


@dataclass(frozen=True)
class EncodedCompletion:
    """Token ids of one row, its labels (``IGNORE_INDEX`` on the context) and how many prompt tokens were cut."""

    input_ids: list[int]
    labels: list[int]
    prompt_cut: int

    @property
    def n_completion_tokens(self) -> int:
        """Number of target tokens (the completion and its EOS)."""
        return sum(label != IGNORE_INDEX for label in self.labels)


@dataclass(frozen=True)
class _Context:
    """A prompt in its template, tokenized in parts: what the cut keeps whole and what it may shorten."""

    specials: list[int]  # tokens the tokenizer puts before a text (BOS), never cut
    head: list[int]  # template text before {text} + the prompt: cut from its end
    suffix: list[int]  # template text after {text} (trailing whitespace removed), never cut
    lead: str  # the context's trailing whitespace, moved to the front of the completion
    min_head: int  # head tokens a cut must keep: the template's text before {text}, and one more

    def fit(self, room: int, where: str, what: str) -> tuple[list[int], int]:
        """``(context ids, tokens cut)`` of at most ``room`` tokens, the head cut from its end."""
        keep = room - len(self.specials) - len(self.suffix)
        if keep < min(self.min_head, len(self.head)):
            raise UserError(
                f"{where}: {what}, less a template suffix of {len(self.suffix)} tokens, leaves room for "
                f"{max(keep, 0)} prompt tokens (needs {min(self.min_head, len(self.head))}); "
                "raise max_length or shorten the template"
            )
        kept = self.head[:keep]
        return self.specials + kept + self.suffix, len(self.head) - len(kept)

    @property
    def length(self) -> int:
        """Tokens of the whole context, uncut."""
        return len(self.specials) + len(self.head) + len(self.suffix)


def check_completion_template(template: str) -> str:
    """``template`` if it holds ``{text}`` at most once (none: the template is a suffix after the prompt)."""
    if template.count(TEXT) > 1:
        raise UserError(f"the template must contain {TEXT} at most once, got {template!r}")
    return template


def special_prefix(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The special tokens the tokenizer puts before every text (e.g. ``[bos]``; ``[]`` for SmolLM2 and the
    tiny tokenizer). A tokenizer that also adds tokens after a text (BERT-style) is a :class:`UserError`."""
    plain = tokenizer("x", add_special_tokens=False)["input_ids"]
    full = tokenizer("x", add_special_tokens=True)["input_ids"]
    if len(full) < len(plain) or full[len(full) - len(plain) :] != plain:
        raise UserError("this tokenizer adds special tokens after a text; a causal LM's tokenizer is needed")
    return list(full[: len(full) - len(plain)])


def _context(tokenizer: PreTrainedTokenizerBase, prompt: str, template: str, specials: list[int]) -> _Context:
    before, after = split_template(check_completion_template(template))
    suffix_text = after.rstrip()
    if suffix_text:
        head_text, lead = before + prompt, after[len(suffix_text) :]
    else:
        whole = before + prompt + after
        head_text = whole.rstrip()
        lead = whole[len(head_text) :]

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    return _Context(specials, ids(head_text), ids(suffix_text), lead, len(ids(before)) + 1)


def _where(row: int | str | None) -> str:
    return "a row" if row is None else f"row {row}" if isinstance(row, int) else str(row)


def encode_completion(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    completion: str,
    *,
    max_length: int,
    template: str = DEFAULT_TEMPLATE,
    row: int | str | None = None,
) -> EncodedCompletion:
    """Encode one (prompt, completion) row in at most ``max_length`` tokens (layout and cut: module docstring).

    ``row`` (an index or a place such as ``"FILE:LINE"``) names the row in errors, which never show its text.
    An empty completion, or one that with the suffix leaves no room for the prompt, is a :class:`UserError`."""
    return _encode(tokenizer, prompt, completion, max_length, template, row, special_prefix(tokenizer))


def _encode(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    completion: str,
    max_length: int,
    template: str,
    row: int | str | None,
    specials: list[int],
) -> EncodedCompletion:
    context = _context(tokenizer, prompt, template, specials)
    target = list(tokenizer(context.lead + completion, add_special_tokens=False)["input_ids"])
    if not target:
        raise UserError(f"{_where(row)}: the completion is empty (encodes to no tokens)")
    if tokenizer.eos_token_id is not None:
        target.append(tokenizer.eos_token_id)
    what = f"max_length={max_length} minus a completion of {len(target)} tokens (EOS included)"
    ids, cut = context.fit(max_length - len(target), _where(row), what)
    return EncodedCompletion(ids + target, [IGNORE_INDEX] * len(ids) + target, cut)


def encode_completions(
    tokenizer: PreTrainedTokenizerBase,
    rows: Iterable[CompletionRow | tuple[str, str]],
    *,
    max_length: int,
    template: str = DEFAULT_TEMPLATE,
) -> list[EncodedCompletion]:
    """:func:`encode_completion` of every row (a :class:`~privlm.resources.completions.CompletionRow`, e.g. of a
    ``CompletionDataset``, or a ``(prompt, completion)`` pair); errors name the row's index."""
    specials = special_prefix(tokenizer)
    return [
        _encode(tokenizer, prompt, completion, max_length, template, i, specials)
        for i, (prompt, completion) in enumerate(_pairs(rows))
    ]


def _pairs(rows: Iterable[CompletionRow | tuple[str, str]]) -> Iterable[tuple[str, str]]:
    for row in rows:
        yield (row.prompt, row.completion) if isinstance(row, CompletionRow) else row


def count_cut(encoded: Iterable[EncodedCompletion]) -> int:
    """How many rows had their prompt cut to fit."""
    return sum(e.prompt_cut > 0 for e in encoded)


def collate_completions(
    encoded: Sequence[EncodedCompletion], pad_token: int, *, width: int | None = None, rows: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-padded batch: ``input_ids``, ``attention_mask`` and ``labels``, each ``(B, T)`` int64.

    ``T`` is the longest row (or ``width``), ``B`` one per row (or ``rows``: one-token filler rows with no
    target follow, for a fixed public shape; :func:`privlm.resources.padding.padded_batch`). Padding has
    mask 0 and label ``IGNORE_INDEX``; ``pad_token`` is e.g. :func:`privlm.lm.prompts.pad_token_id`. The
    labels come from the rows, never from comparing ids with the pad id (the tiny tokenizer's pad is its EOS)."""
    ids, mask, _ = padded_batch([e.input_ids for e in encoded], pad_token, width=width, rows=rows)
    labels = torch.full_like(ids, IGNORE_INDEX)
    for i, e in enumerate(encoded):
        labels[i, : len(e.labels)] = torch.tensor(e.labels, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def prompt_token_lengths(
    tokenizer: PreTrainedTokenizerBase, prompts: Iterable[str], template: str = DEFAULT_TEMPLATE
) -> list[int]:
    """Tokens of each prompt's whole context (specials, prompt in its template), before any cut (for
    :func:`privlm.resources.completions.token_length_summary`)."""
    specials = special_prefix(tokenizer)
    return [_context(tokenizer, prompt, template, specials).length for prompt in prompts]


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    *,
    max_length: int,
    template: str = DEFAULT_TEMPLATE,
    row: int | str | None = None,
) -> tuple[list[int], int]:
    """``(context ids, tokens cut)``: the context of :func:`encode_completion` alone, cut the same way to at
    most ``max_length`` tokens (what a model completes at evaluation)."""
    context = _context(tokenizer, prompt, template, special_prefix(tokenizer))
    return context.fit(max_length, _where(row), f"max_length={max_length}")


class _StopAfterLine(StoppingCriteria):
    """Stops a row once its new text holds a newline after some non-blank text (the answer is one line)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, start: int):
        self.tokenizer, self.start = tokenizer, start

    def __call__(self, input_ids: torch.LongTensor, scores: object, **kwargs: object) -> torch.BoolTensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.start :], skip_special_tokens=True)
        return torch.tensor([text.lstrip() != "" and "\n" in text.lstrip() for text in texts], device=input_ids.device)


def first_line(text: str) -> str:
    """The first non-blank line of ``text``, stripped (``""`` if none)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def greedy_complete(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    max_length: int,
    template: str = DEFAULT_TEMPLATE,
    batch_size: int = 16,
    stop_at_newline: bool = True,
    on_batch: Callable[[int], None] | None = None,
) -> list[str]:
    """The greedy completion of each prompt (one string per prompt, in order), deterministic.

    Each context is :func:`encode_prompt` cut to ``max_length - max_new_tokens`` tokens; prompts are batched
    by length (``batch_size`` at a time), left-padded, and decoded with ``model.generate(do_sample=False)``
    and the KV cache. A row stops at EOS, after ``max_new_tokens``, or (``stop_at_newline``) at a newline
    after some text; its answer is the first non-blank line of the new text (with ``stop_at_newline=False``
    the whole new text, stripped). ``on_batch(n)`` is called after each decoded batch of n prompts
    (progress). The model's train/eval mode is restored afterwards."""
    if batch_size < 1 or max_new_tokens < 1:
        raise UserError(f"batch_size and max_new_tokens must be >= 1, got {batch_size} and {max_new_tokens}")
    context_size = getattr(model.config, "max_position_embeddings", None)
    if context_size is not None and max_length > context_size:
        raise UserError(f"max_length={max_length} exceeds the model's context of {context_size} tokens")
    specials = special_prefix(tokenizer)
    room = max_length - max_new_tokens
    what = f"max_length={max_length} minus {max_new_tokens} new tokens"
    encoded = [_context(tokenizer, p, template, specials).fit(room, _where(i), what)[0] for i, p in enumerate(prompts)]
    pad = pad_token_id(tokenizer)
    order = sorted(range(len(prompts)), key=lambda i: len(encoded[i]))
    answers = [""] * len(prompts)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            width = max(len(encoded[i]) for i in chunk)
            ids = torch.tensor([[pad] * (width - len(encoded[i])) + encoded[i] for i in chunk], device=model.device)
            mask = torch.tensor(
                [[0] * (width - len(encoded[i])) + [1] * len(encoded[i]) for i in chunk], device=model.device
            )
            stopping = StoppingCriteriaList([_StopAfterLine(tokenizer, width)] if stop_at_newline else [])
            with torch.inference_mode():
                out = model.generate(
                    ids,
                    attention_mask=mask,
                    do_sample=False,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad,
                    eos_token_id=tokenizer.eos_token_id,
                    use_cache=True,
                    stopping_criteria=stopping,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                )
            texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
            for i, text in zip(chunk, texts):
                answers[i] = first_line(text) if stop_at_newline else text.strip()
            if on_batch is not None:
                on_batch(len(chunk))
    finally:
        model.train(was_training)
    return answers
