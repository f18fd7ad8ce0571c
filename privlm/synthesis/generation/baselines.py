"""Generation baselines: zero-shot (public instructions only) and few-shot (private examples in the prompt).

Zero-shot sees no private data: one instruction per class, wrapped in the tokenizer's chat template
when it has one (else the bare instruction and a newline), sampled ``n`` times in pieces of :data:`PIECE`
texts (:func:`sample_pieces`: kept on disk as each is done, so a long run resumes, and shown on a progress
bar; DP fine-tune-then-generate samples its trained model the same way). Few-shot puts ``k``
examples of the class, drawn from the private pool, into every prompt: it is NOT private, and its
rows say so (``uses_private_data: true``). Sampling is seeded: same seed, same texts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.atomic import json_once
from privlm.digest import digest
from privlm.errors import UserError
from privlm.lm.generation import chat_prompt, class_instructions, sample_texts
from privlm.lm.sampling import Sampling
from privlm.lm.scoring import Example
from privlm.progress import SILENT, Progress, Task
from privlm.training.fingerprint import model_fingerprint

PIECE = 100  # texts per sampling call, and per file kept by sample_pieces


def piece_seed(seed: int, index: int) -> int:
    """The sampling seed of piece ``index`` of a run seeded by ``seed``: ``seed`` itself for the first piece
    (so n ≤ :data:`PIECE` samples exactly as one :func:`~privlm.lm.generation.sample_texts` call), a 63-bit
    hash of both for the others (distinct from every other run's and piece's seeds)."""
    return seed if index == 0 else int(digest({"seed": seed, "piece": index}), 16) % 2**63


def sample_pieces(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    n: int,
    seed: int,
    sampling: Sampling,
    *,
    keep: Path | None = None,
    task: Task | None = None,
) -> list[str]:
    """``n`` cleaned, non-empty continuations of ``prompt``, sampled :data:`PIECE` at a time: piece ``i`` is
    ``sample_texts(..., count, piece_seed(seed, i), sampling)``, so a run of n texts begins with the texts of
    every shorter run whose n is a multiple of :data:`PIECE` (n = 100 per class is the start of n = 1,000).

    ``keep``: a folder where each piece is saved as it is done (JSON, named by the digest of the model's
    fingerprint — every parameter, LoRA adapters included —, the prompt, the sampling settings, the seed and
    the piece), so an interrupted run resumes at its first missing piece and never repeats one. The texts are
    what the model writes: keep them where its outputs may be kept (a DP-trained generator's samples are
    post-processing of its release). ``task``: advanced by each piece's count."""
    bound: dict[str, object] = {}
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        bound = {"model": model_fingerprint(model), "prompt": prompt, "sampling": dataclasses.asdict(sampling)}
    texts: list[str] = []
    for index in range(math.ceil(n / PIECE)):
        count, seeded = min(PIECE, n - index * PIECE), piece_seed(seed, index)
        path = None if keep is None else keep / f"sample-{digest({**bound, 'seed': seeded, 'count': count})}.json"
        texts += json_once(path, lambda: sample_texts(model, tokenizer, prompt, count, seeded, sampling))  # noqa: B023
        if task is not None:
            task.advance(count)
    return texts


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
    keep: Path | None = None,
    progress: Progress = SILENT,
) -> list[dict[str, object]]:
    """``n_per_class`` generated rows per class from public instructions only (no private data): class
    ``label`` is :func:`sample_pieces` seeded by ``seed + 1000 * label``, its pieces kept in ``keep`` (None:
    not kept), the texts counted on one ``progress`` bar."""
    rows: list[dict[str, object]] = []
    prompts = [chat_prompt(tokenizer, i) for i in class_instructions(label_names, instructions)]
    task = progress.task(f"sampling {n_per_class} texts per class", total=n_per_class * len(prompts))
    for label, prompt in enumerate(prompts):
        for text in sample_pieces(
            model, tokenizer, prompt, n_per_class, seed + 1000 * label, sampling, keep=keep, task=task
        ):
            rows.append(
                {
                    "text": text,
                    "label": label,
                    "label_name": label_names[label],
                    "method": "zero-shot",
                    "uses_private_data": False,
                }
            )
    task.done()
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
