"""Generation baselines: zero-shot (public instructions only) and few-shot (private examples in the prompt).

Zero-shot sees no private data: one instruction per class, wrapped in the tokenizer's chat template
when it has one (else the bare instruction and a newline), sampled ``n`` times. Few-shot puts ``k``
examples of the class, drawn from the private pool, into every prompt: it is NOT private, and its
rows say so (``uses_private_data: true``). Sampling is seeded: same seed, same texts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.lm.generation import chat_prompt, class_instructions, sample_texts
from privlm.lm.sampling import Sampling
from privlm.lm.scoring import Example


def few_shot_instruction(instruction: str, shots: Sequence[str]) -> str:
    """``instruction`` followed by the example texts as a list, asking for one new example."""
    listed = "\n".join(f"- {s}" for s in shots)
    return f"{instruction}\nExamples:\n{listed}\nWrite one new example, different from these. Reply with the sentence only."


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
    for label, instruction in enumerate(class_instructions(label_names, instructions)):
        prompt = chat_prompt(tokenizer, instruction)
        for text in sample_texts(model, tokenizer, prompt, n_per_class, seed + 1000 * label, sampling):
            rows.append(
                {
                    "text": text,
                    "label": label,
                    "label_name": label_names[label],
                    "method": "zero-shot",
                    "uses_private_data": False,
                }
            )
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
    for label, instruction in enumerate(class_instructions(label_names, instructions)):
        texts = [t for t, y in pool if y == label]
        if len(texts) < k:
            raise UserError(f"class {label_names[label]!r} has {len(texts)} pool examples, fewer than k={k} shots")
        for j in range(n_per_class):
            shots = [texts[i] for i in rng.choice(len(texts), size=k, replace=False)]
            prompt = chat_prompt(tokenizer, few_shot_instruction(instruction, shots))
            (text,) = sample_texts(model, tokenizer, prompt, 1, seed + 1000 * label + j, sampling)
            rows.append(
                {
                    "text": text,
                    "label": label,
                    "label_name": label_names[label],
                    "method": "few-shot",
                    "uses_private_data": True,
                }
            )
    return rows
