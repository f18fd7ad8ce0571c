"""Sampling text from a causal LM: chat prompts, seeded batched sampling, cleaning, class instructions.

Public-side primitives shared by the generation baselines, GRADMM's instructed candidates, Private
Evolution and DP fine-tune-then-generate. Sampling is seeded: same seed, same texts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import Cache, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase

from privlm.digest import digest
from privlm.errors import UserError
from privlm.journal import Journal
from privlm.lm.nucleus import NucleusFilter
from privlm.lm.prompts import pad_token_id
from privlm.lm.sampling import Sampling
from privlm.progress import Task

DEFAULT_INSTRUCTION = "Write one short {label_name} movie review sentence."


def chat_prompt(tokenizer: PreTrainedTokenizerBase, instruction: str) -> str:
    """The instruction as a user turn of the chat template (with the assistant's opening), else plain."""
    if tokenizer.chat_template:
        messages = [{"role": "user", "content": instruction}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return instruction + "\n"


def clean_generation(text: str) -> str:
    """First non-empty line, without list markers or surrounding quotes."""
    for line in text.splitlines():
        line = line.strip().removeprefix("- ").strip().strip('"').strip()
        if line:
            return line
    return ""


def sample_texts(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt: str, n: int, seed: int, sampling: Sampling
) -> list[str]:
    """``n`` non-empty cleaned continuations of ``prompt``; resamples empty ones up to ``max_rounds`` times.

    Uses ``torch.manual_seed(seed + round)`` inside a forked RNG, so the caller's RNG is untouched.
    """
    return sample_many(model, tokenizer, [prompt], n, seed, sampling)[0]


def sample_many(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    per_prompt: int,
    seed: int,
    sampling: Sampling,
    batch_size: int = 48,
    task: Task | None = None,
    journal: Path | None = None,
) -> list[list[str]]:
    """``per_prompt`` non-empty cleaned continuations of each prompt, generated for ≈ ``batch_size``
    sequences at a time (prompts left-padded to a common length); empty ones are resampled up to
    ``max_rounds`` times. ``task``: advanced by every text kept (``len(prompts) · per_prompt`` in all).

    Deterministic: the chunk starting at prompt ``j`` samples under ``torch.manual_seed(seed + round + 7919·j)``
    in a forked RNG (the caller's RNG is untouched); one prompt is exactly :func:`sample_texts`. Each prompt is
    run through the model once for all its samples (:func:`_prompt_cache`). Temperature and top-p are applied by
    :class:`privlm.lm.nucleus.NucleusFilter`, which keeps the tokens of transformers' own warpers without sorting
    the vocabulary at every step.

    ``journal``: a file (:class:`privlm.journal.Journal`) where every finished chunk's texts are kept, so that a
    killed call resumes after them with the same result. It is keyed to the prompts, ``per_prompt``, ``seed``,
    ``sampling`` and ``batch_size``, not to the model, the tokenizer or the device: keep it in a folder bound to
    one model (PE's run folder checks its LM head's fingerprint on resume). Moved to another machine (PE's public
    mirror), it resumes with the same kept texts, but the chunks written there may round differently: the result
    is then not bitwise the one-machine run's."""
    encoded = [tokenizer(p, add_special_tokens=not tokenizer.chat_template)["input_ids"] for p in prompts]
    context = model.config.max_position_embeddings
    longest = max((len(ids) for ids in encoded), default=0)
    if longest + sampling.max_new_tokens > context:
        raise UserError(
            f"prompt of {longest} tokens + {sampling.max_new_tokens} new tokens exceeds the model's context of {context}"
        )
    pad = pad_token_id(tokenizer)
    step = max(1, batch_size // per_prompt)
    texts: list[list[str]] = [[] for _ in prompts]
    key = digest([list(prompts), per_prompt, seed, asdict(sampling), batch_size])
    finished = None if journal is None else Journal(journal, key)
    for first in range(0, len(prompts), step):
        chunk = range(first, min(first + step, len(prompts)))
        if finished is not None and first in finished.done:
            for j, kept in zip(chunk, finished.done[first], strict=True):
                texts[j] = kept
                if task is not None:
                    task.advance(len(kept))
            continue
        for round_ in range(sampling.max_rounds):
            todo = [j for j in chunk if len(texts[j]) < per_prompt]
            if not todo:
                break
            width, count = max(len(encoded[j]) for j in todo), max(per_prompt - len(texts[j]) for j in todo)
            ids = torch.tensor([[pad] * (width - len(encoded[j])) + encoded[j] for j in todo])
            mask = torch.tensor([[0] * (width - len(encoded[j])) + [1] * len(encoded[j]) for j in todo])
            with torch.random.fork_rng(devices=[]), torch.inference_mode():
                torch.manual_seed(seed + round_ + 7919 * first)
                out = model.generate(
                    ids.repeat_interleave(count, 0),
                    attention_mask=mask.repeat_interleave(count, 0),
                    cache=_prompt_cache(model, ids, mask, count),
                    do_sample=True,
                    temperature=1.0,  # both applied by the filter, which keeps the warpers' tokens
                    top_p=1.0,
                    top_k=0,
                    num_beams=1,
                    logits_processor=LogitsProcessorList([NucleusFilter(sampling.top_p, sampling.temperature)]),
                    max_new_tokens=sampling.max_new_tokens,
                    pad_token_id=pad,
                )
            decoded = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
            for i, j in enumerate(todo):
                cleaned = [t for t in map(clean_generation, decoded[i * count : (i + 1) * count]) if t]
                kept = cleaned[: per_prompt - len(texts[j])]
                texts[j].extend(kept)
                if task is not None:
                    task.advance(len(kept))
        for j in chunk:
            if len(texts[j]) < per_prompt:
                raise UserError(
                    f"the model gave only {len(texts[j])} non-empty texts out of {per_prompt} for prompt {prompts[j][:60]!r}"
                )
        if finished is not None:
            finished.add(first, [texts[j] for j in chunk])
    return texts


def _prompt_cache(model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, count: int) -> Cache | None:
    """The keys and values of each left-padded prompt but its last token, computed once per prompt and repeated
    for its ``count`` samples (``generate`` with ``num_return_sequences`` would run every copy through the model);
    ``generate`` then starts from the last token. The positions are ``generate``'s own (counted over the real
    tokens), so the samples are those of the uncached call (tested against it). None for one-token prompts."""
    if ids.shape[1] < 2:
        return None
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=ids[:, :-1],
        attention_mask=mask[:, :-1],
        position_ids=positions[:, :-1],
        use_cache=True,
        logits_to_keep=1,
    )
    cache = out.cache
    cache.batch_repeat_interleave(count)
    return cache


def class_instructions(label_names: Sequence[str], instructions: Sequence[str] | None) -> list[str]:
    """The public instruction of each class: ``instructions``, or the default with each class name."""
    if instructions is None:
        return [DEFAULT_INSTRUCTION.format(label_name=name) for name in label_names]
    if len(instructions) != len(label_names):
        raise UserError(f"{len(instructions)} instructions for {len(label_names)} classes")
    return list(instructions)
