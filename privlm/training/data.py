"""Training data for private fine-tuning: a dataset's splits as token sequences of at most T tokens.

Three tasks:

- ``classify``: each labelled example ``(text, y)`` becomes the label-word prompt of
  :mod:`privlm.lm.prompts` (``fill(template, text) <word_y>``, context cut from the left to fit T);
  only the label-word tokens are targets, so the training loss is the negative of the score that
  test accuracy uses.
- ``lm``: each text, cut to its first T tokens; every token is a target.
- ``generate``: prompt → completion rows (:mod:`privlm.resources.completions`: ``bbc-headlines``, ``jsonl:`` /
  ``csv:`` files with ``prompt`` and ``completion``, or a :func:`~privlm.resources.completions.completion_spec`
  of split files), each encoded by :func:`privlm.lm.completion.encode_completion` in the task's template:
  the completion (and EOS) are the targets, the prompt is masked (label -100) and only the prompt's body is
  cut to fit T.

Splits are the datasets' own seeded 80/10/10 splits (:mod:`privlm.resources.splits`). For ``lm`` a
JSONL file may hold texts without labels (``jsonl:PATH`` with a ``text`` field per line).

**DP-SGD batch shapes: what holds bitwise and what does not.** :func:`make_collate` pads a batch to its
longest row, and the training loop collates each Poisson-sampled logical batch at once and cuts it into
micro-batches: consecutive ones (:func:`privlm.dpsgd.sampling.physical_batches`) or, for ``privlm train``,
rows sorted by length with each micro-batch cut to its own longest row (:func:`length_sorted_token_batches`,
and :func:`privlm.training.top_blocks.length_sorted_batches` over a cached prefix). A row's per-sample gradient
g_i, its norm and its clip factor c_i are thus computed in a shape that depends on the other sampled rows
(the width of the step's longest row, the size of the row's micro-batch), and may differ in their last
bits when one example is added. Measured in float32, every norm mode, on one micro-batch of 8 classify
rows with one example added in front: with the width unchanged (a shorter example: 9 rows) no norm or
factor moved. With the width raised (SmolLM2: 35 to 44 tokens), 1-3 of the 8 squared norms moved by up
to 3.8e-6 relative, clip factors by up to 1.9e-6 and one row's gradient vector by 2.1e-6 (LoRA r = 4 on
the last 2 blocks; head-only without a cache: 1.6e-6, 8.5e-7, 8.4e-7); on the tiny Llama (36 to 48
tokens) norms by up to 1.1e-7 (ghost only), factors not at all, gradients by up to 5e-10; a head-only
run on cached features (:mod:`privlm.training.prefix_cache`, rows fixed bitwise) moved nothing. For
scale: a SmolLM2 row's squared norm computed alone (a micro-batch of one, unpadded) differs from its
in-batch value by up to 7e-6, and by up to 3.7e-6 even on cached features.

What that does to the guarantee: adding example x changes the step's clipped sum by c_x g_x plus
e = Σ_{i≠x} (c'_i g'_i − c_i g_i) plus the rounding of the sum itself. Every term of e is a rounding-size
move of a clipped gradient (c_i = min(1, C/‖g_i‖) is continuous: no rounding flips a decision, unlike a
nearest-candidate vote), so with per-row relative moves ≤ δ, ‖e‖ ≤ δ·Σ_i ‖c_i g_i‖ ≤ δ·B·C over the B
sampled rows: the Gaussian step has sensitivity at most C·(1 + δB) where the accountant assumes C, i.e.
noise multiplier σ/(1 + δB) instead of σ — at the measured δ ≈ 2e-6 and B = 256, 0.05% in the worst
case (every move aligned). The length-sorted cut does not change this: adding x may move other rows to
another micro-batch of another width, and each such move is again a rounding-size move of one c_i g_i,
inside the same bound (the rows' own values never depend on the cut beyond rounding). Measured on SmolLM2 at B = 8: ‖e‖/C ≈ 1.0e-6 (head-only: 4.8e-7), the same
size as the difference between that very sum computed as one micro-batch of 8 and as two of 4 (1.1e-6;
6.0e-7) — a rounding of the reduction over the batch that no batching scheme removes. Fixed-shape
micro-batches (each row padded to its own :func:`privlm.resources.padding.shape_buckets` width, a fixed
row count with filler rows) would remove the per-row part of e but not that rounding; they are not used
here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.dpsgd.sampling import longest_first
from privlm.errors import UserError
from privlm.lm.completion import HEADLINE_TEMPLATE, EncodedCompletion, collate_completions, encode_completions
from privlm.lm.prompts import EncodedOption, collate, encode_option, pad_token_id
from privlm.names import TASKS
from privlm.resources.completions import CompletionRow, load_completions
from privlm.resources.corpus import Example
from privlm.resources.datasets import DataSpec, load_dataset
from privlm.resources.files import jsonl_records
from privlm.resources.splits import per_row_split
from privlm.resources.verbalizers import Verbalizer

GENERATE_TEMPLATE = HEADLINE_TEMPLATE  # "{text}\nHeadline: ": the default prompt of --task generate


@dataclass(frozen=True)
class TaskData:
    """Train and test splits of one task. ``classify``: labelled examples and the verbalizer;
    ``lm``: texts (labels, if any, are ignored) and ``verbalizer=None``; ``generate``: prompt/completion
    rows and the ``template`` that phrases each prompt (``{text}`` where the prompt goes)."""

    task: str
    train: tuple[Example, ...] | tuple[str, ...] | tuple[CompletionRow, ...]
    test: tuple[Example, ...] | tuple[str, ...] | tuple[CompletionRow, ...]
    verbalizer: Verbalizer | None
    template: str | None = None


def model_context_length(model: PreTrainedModel) -> int | None:
    """The longest sequence the model's position embeddings cover (``max_position_embeddings``), if known."""
    value = getattr(model.config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) else None


def check_max_length(model: PreTrainedModel, max_length: int) -> None:
    """Refuse a T below 2 or beyond the model's context length."""
    if max_length < 2:
        raise UserError(f"--max-length must be >= 2 tokens, got {max_length}")
    context = model_context_length(model)
    if context is not None and max_length > context:
        raise UserError(f"--max-length {max_length} is larger than the model's context of {context} tokens")


def load_task_data(
    name: str | DataSpec, task: str, seed: int = 0, labels: object = None, template: str | None = None
) -> TaskData:
    """Train and test splits of dataset ``name`` (or of a :class:`DataSpec`'s files) for ``task``.
    ``labels``: the public class names of user data (see :func:`privlm.resources.datasets.load_dataset`).
    ``lm`` on a ``jsonl:`` file reads the ``text`` of every row and nothing else (labels, if any, are
    ignored: whether a file is labelled is never decided from one of its private rows), split row by row
    like any user file, or whole when it is given as a split; ``classify`` needs every row labelled.
    ``generate`` reads completion data (:func:`privlm.resources.completions.load_completions`: ``name`` a
    completion data set or a :func:`~privlm.resources.completions.completion_spec`), phrased by ``template``
    (default :data:`GENERATE_TEMPLATE`); it takes no ``labels``, and ``template`` is for ``generate`` only."""
    if task not in TASKS:
        raise UserError(f"--task must be one of {', '.join(TASKS)}, got {task!r}")
    if task == "generate":
        if labels is not None:
            raise UserError(
                "--labels names the classes of a classify task; --task generate learns the completion of each "
                "prompt (rows with 'prompt' and 'completion') and has no classes: drop --labels"
            )
        return TaskData(
            task,
            load_completions(name, "train", seed).rows,
            load_completions(name, "test", seed).rows,
            None,
            template if template is not None else GENERATE_TEMPLATE,
        )
    if template is not None:
        raise UserError("a template is given with the labels for classify (--labels, --template needs them)")
    if task == "lm" and isinstance(name, DataSpec):
        return TaskData(task, _lm_texts(name, "train", seed, labels), _lm_texts(name, "test", seed, labels), None)
    if task == "lm" and name.startswith("jsonl:"):
        texts = _jsonl_texts(name)
        splits = per_row_split(texts, seed)
        return TaskData(task, tuple(texts[i] for i in splits["train"]), tuple(texts[i] for i in splits["test"]), None)
    train = load_dataset(name, "train", seed, labels)
    test = load_dataset(name, "test", seed, labels)
    if task == "lm":
        return TaskData(task, tuple(train.texts), tuple(test.texts), None)
    return TaskData(task, train.examples, test.examples, train.verbalizer)


def _lm_texts(spec: DataSpec, split: str, seed: int, labels: object) -> tuple[str, ...]:
    """One split's texts for ``lm``: the ``jsonl:`` file given for it, whole (labels ignored); else
    that split of ``spec.data`` as :func:`load_task_data` reads it; else the labelled file's texts."""
    given = getattr(spec, split)
    if given is not None and given.startswith("jsonl:"):
        return tuple(_jsonl_texts(given))
    if given is None and spec.data is not None:
        whole = load_task_data(spec.data, "lm", seed, labels)
        return whole.train if split == "train" else whole.test
    return tuple(load_dataset(spec, split, seed, labels).texts)


def _jsonl_texts(name: str) -> list[str]:
    """The ``text`` of every record of a ``jsonl:`` file."""
    path = Path(name[len("jsonl:") :])
    records = []
    for number, record in jsonl_records(path):
        if not isinstance(record.get("text"), str) or not record["text"].strip():
            raise UserError(f"{path}:{number}: expected a JSON object with a non-empty 'text'")
        records.append(record)
    if not records:
        raise UserError(f"{path}: no examples")
    return [r["text"] for r in records]


def encode(
    data: TaskData, tokenizer: PreTrainedTokenizerBase, max_length: int, split: str = "train"
) -> list[EncodedOption] | list[EncodedCompletion]:
    """Token ids (≤ ``max_length``) of every example of ``split``, with how many trailing ids are targets
    (``generate``: :class:`~privlm.lm.completion.EncodedCompletion` rows, labels -100 on the prompt)."""
    rows = data.train if split == "train" else data.test
    if data.task == "generate":
        return encode_completions(tokenizer, rows, max_length=max_length, template=data.template or GENERATE_TEMPLATE)
    if data.task == "classify":
        template, words = data.verbalizer.template, data.verbalizer.label_words
        return [encode_option(tokenizer, text, template, words[label], max_length) for text, label in rows]
    encoded = []
    for text in rows:
        ids = tokenizer(text, add_special_tokens=True)["input_ids"][:max_length]
        encoded.append(EncodedOption(ids, len(ids)))
    return encoded


def length_sorted_token_batches(
    batch: Mapping[str, torch.Tensor], max_size: int | None
) -> Iterator[dict[str, torch.Tensor]]:
    """Micro-batches of a :func:`make_collate` batch (right-padded ``input_ids``, ``attention_mask`` and ``labels``,
    each (B, T)) for the DP-SGD engine (``micro_batches``): rows longest first, at most ``max_size`` per
    micro-batch, each cut to its own longest row. Right padding sits after every real token and carries no
    label, so a row's loss, norm and clipped gradient are its own whatever the cut; the clipped sum is the
    whole batch's up to rounding (``tests/training/test_data.py``)."""
    if set(batch) != {"input_ids", "attention_mask", "labels"}:
        raise ValueError(f"a token batch holds input_ids, attention_mask and labels, got {sorted(batch)}")
    lengths = batch["attention_mask"].sum(1)
    for rows in longest_first(lengths, max_size):
        width = int(lengths[rows].max())
        yield {key: value[rows, :width] for key, value in batch.items()}


def make_collate(
    tokenizer: PreTrainedTokenizerBase,
) -> Callable[[Sequence[EncodedOption] | Sequence[EncodedCompletion]], dict[str, torch.Tensor]]:
    """Right-padded batches (``input_ids``, ``attention_mask``, ``labels``) of encoded examples, padded to
    the longest row of each batch (a DP-SGD step's logical batch; what that shape dependence does to the
    clipped sum: module docstring). Completion rows keep their own labels (-100 on the prompt)."""
    pad = pad_token_id(tokenizer)

    def collate_rows(rows: Sequence[EncodedOption] | Sequence[EncodedCompletion]) -> dict[str, torch.Tensor]:
        if rows and isinstance(rows[0], EncodedCompletion):
            return collate_completions(rows, pad)
        return collate(rows, pad)

    return collate_rows
