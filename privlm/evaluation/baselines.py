"""Generation baselines: zero-shot (public instructions only) and few-shot (private examples in the prompt).

Zero-shot sees no private data: one instruction per class, wrapped in the tokenizer's chat template
when it has one (else the bare instruction and a newline), sampled ``n`` times. Few-shot puts ``k``
examples of the class, drawn from the private pool, into every prompt: it is NOT private, and its
rows say so (``uses_private_data: true``). Sampling is seeded: same seed, same texts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.evaluation.prompts import pad_token_id
from privlm.evaluation.scoring import Example

DEFAULT_INSTRUCTION = "Write one short {label_name} movie review sentence."


@dataclass(frozen=True)
class Sampling:
    """Sampling settings of ``model.generate`` (nucleus sampling) and retries for empty outputs."""

    max_new_tokens: int = 40
    temperature: float = 1.0
    top_p: float = 0.95
    max_rounds: int = 5


def chat_prompt(tokenizer: PreTrainedTokenizerBase, instruction: str) -> str:
    """The instruction as a user turn of the chat template (with the assistant's opening), else plain."""
    if tokenizer.chat_template:
        messages = [{"role": "user", "content": instruction}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return instruction + "\n"


def few_shot_instruction(instruction: str, shots: Sequence[str]) -> str:
    """``instruction`` followed by the example texts as a list, asking for one new example."""
    listed = "\n".join(f"- {s}" for s in shots)
    return f"{instruction}\nExamples:\n{listed}\nWrite one new example, different from these. Reply with the sentence only."


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
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=not tokenizer.chat_template)["input_ids"]])
    context = model.config.max_position_embeddings
    if ids.shape[1] + sampling.max_new_tokens > context:
        raise UserError(
            f"prompt of {ids.shape[1]} tokens + {sampling.max_new_tokens} new tokens exceeds the model's context of {context}"
        )
    texts: list[str] = []
    for round_ in range(sampling.max_rounds):
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(seed + round_)
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=0,
                max_new_tokens=sampling.max_new_tokens,
                num_return_sequences=n - len(texts),
                pad_token_id=pad_token_id(tokenizer),
            )
        decoded = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
        texts.extend(t for t in map(clean_generation, decoded) if t)
        if len(texts) == n:
            return texts
    raise UserError(f"the model gave only {len(texts)} non-empty texts out of {n} for prompt {prompt[:60]!r}")


def _instructions(label_names: Sequence[str], instructions: Sequence[str] | None) -> list[str]:
    if instructions is None:
        return [DEFAULT_INSTRUCTION.format(label_name=name) for name in label_names]
    if len(instructions) != len(label_names):
        raise UserError(f"{len(instructions)} instructions for {len(label_names)} classes")
    return list(instructions)


def zero_shot(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    label_names: Sequence[str],
    n_per_class: int,
    seed: int = 0,
    *,
    instructions: Sequence[str] | None = None,
    sampling: Sampling = Sampling(),
) -> list[dict[str, object]]:
    """``n_per_class`` generated rows per class from public instructions only (no private data)."""
    rows: list[dict[str, object]] = []
    for label, instruction in enumerate(_instructions(label_names, instructions)):
        prompt = chat_prompt(tokenizer, instruction)
        for text in sample_texts(model, tokenizer, prompt, n_per_class, seed + 1000 * label, sampling):
            rows.append({"text": text, "label": label, "label_name": label_names[label], "method": "zero-shot", "uses_private_data": False})
    return rows


def few_shot(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pool: Sequence[Example],
    label_names: Sequence[str],
    n_per_class: int,
    k: int,
    seed: int = 0,
    *,
    instructions: Sequence[str] | None = None,
    sampling: Sampling = Sampling(),
) -> list[dict[str, object]]:
    """``n_per_class`` rows per class, each generated from a prompt with ``k`` private examples of the class.

    NON-PRIVATE: the prompts contain private texts (drawn with ``numpy.random.default_rng(seed)``).
    """
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []
    for label, instruction in enumerate(_instructions(label_names, instructions)):
        texts = [t for t, y in pool if y == label]
        if len(texts) < k:
            raise UserError(f"class {label_names[label]!r} has {len(texts)} pool examples, fewer than k={k} shots")
        for j in range(n_per_class):
            shots = [texts[i] for i in rng.choice(len(texts), size=k, replace=False)]
            prompt = chat_prompt(tokenizer, few_shot_instruction(instruction, shots))
            (text,) = sample_texts(model, tokenizer, prompt, 1, seed + 1000 * label + j, sampling)
            rows.append({"text": text, "label": label, "label_name": label_names[label], "method": "few-shot", "uses_private_data": True})
    return rows
