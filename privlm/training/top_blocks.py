"""Train only the last N decoder blocks of a causal LM, over a frozen prefix computed once per example.

With ``--train-layers N`` everything below decoder block L−N (the embeddings and blocks 0..L−N−1) is frozen,
so the hidden states entering block L−N are the same in every epoch. :func:`load_or_build` computes them
once per training example (forward passes of the frozen prefix, stopped at block L−N, no graph) into the
private cache of :mod:`privlm.training.prefix_cache` (same key, chunked build, refusal and deletion rules as
the head-only cache); each DP-SGD step then runs only :class:`TopBlocks` — the N blocks, the final norm and
the output layer — on the cached states. The blocks are trained in full (``train_top_blocks``), or through
LoRA adapters on their linear layers (``privlm.training.run.with_lora`` with ``blocks=N``); the final norm
and the output layer (tied to the embedding in SmolLM2 and the tiny models) stay frozen.

**What a cached row holds, and what its loss depends on.** Row i is ``PrefixRow(hidden, positions,
targets)``: the hidden states entering block L−N at example i's n_i real tokens (n_i × d values in the
cache dtype), computed in a batch of ``BATCH_ROWS`` rows × the public width ladder holding n_i, at least
one filler row — bitwise a function of example i and the public weights alone, whatever the other rows —
and, from example i's own labels, the positions whose logits carry loss and the tokens they predict. In a
step, :class:`TopBlocks` pads the sampled rows' states with zeros to the batch's longest row and builds the
same causal + padding attention mask as the model (``transformers``' ``create_causal_mask``), with position
ids 0..T−1 per row (the rotary embeddings are recomputed from them), so every real position of row i sees
only row i's own real positions; the output layer runs only at row i's loss positions (gathered before
the norm and the head: a completion's few dozen tokens instead of T × vocabulary logits). Row i's
per-sample loss is thus a function of example i alone, and its gradient flows only through hooked layer
types (``nn.Linear`` — LoRA's too — and the RMSNorm/LayerNorm weights of the blocks): the per-sample norms
of every norm mode and the clipped sum are those of the uncached model, up to the rounding of other batch
shapes (``tests/training/test_top_blocks.py``). Padding positions and filler rows carry no loss.

The cached states are private like the data (they are a deterministic function of it): the cache folder
holds them (≈ Σ n_i × d values: 1.2 KB per token for SmolLM2 in bfloat16) with the data fingerprint in its
``meta.json``, and is deleted with the checkpoints when it lives in the run folder.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers.masking_utils import create_causal_mask

from privlm.dpsgd.losses import IGNORE_INDEX, label_word_losses, token_losses
from privlm.dpsgd.sampling import longest_first
from privlm.errors import UserError
from privlm.lm.completion import EncodedCompletion, collate_completions
from privlm.lm.prompts import EncodedOption, collate
from privlm.resources.padding import padded_batch, shape_buckets
from privlm.training.prefix_cache import BATCH_ROWS, Features, FrozenPass, OnRows, load_or_build_pass

LAYOUT = "hidden states entering decoder block {first} of {depth} at every real token (privlm-prefix-v1)"
EncodedRow = EncodedOption | EncodedCompletion


@dataclass(frozen=True)
class DecoderParts:
    """The pieces of a decoder-only causal LM that :class:`TopBlocks` runs: the causal LM itself (inside a
    peft wrapper, if any), its backbone, its decoder ``blocks``, the final ``norm``, the ``rotary`` embedding
    module (None for learned positions, which the frozen prefix already added) and the ``output`` layer."""

    causal_lm: PreTrainedModel
    backbone: nn.Module
    blocks: nn.ModuleList
    norm: nn.Module
    rotary: nn.Module | None
    output: nn.Module


def decoder_parts(model: nn.Module) -> DecoderParts:
    """The :class:`DecoderParts` of a Llama-style (``model.layers``, ``model.norm``, ``model.rotary_emb``) or
    GPT-2-style (``transformer.h``, ``transformer.ln_f``) causal LM, or of a peft model wrapping one."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = getattr(causal_lm, "base_model", None)
    blocks = getattr(backbone, "layers", None) or getattr(backbone, "h", None)
    norm = getattr(backbone, "norm", None) or getattr(backbone, "ln_f", None)
    output = causal_lm.get_output_embeddings() if hasattr(causal_lm, "get_output_embeddings") else None
    if not isinstance(blocks, nn.ModuleList) or norm is None or output is None:
        raise UserError(
            f"{type(causal_lm).__name__}: --train-layers needs a decoder with blocks named 'layers' or 'h', a final "
            "norm ('norm' or 'ln_f') and an output layer"
        )
    return DecoderParts(causal_lm, backbone, blocks, norm, getattr(backbone, "rotary_emb", None), output)


def check_train_layers(model: nn.Module, blocks: int) -> int:
    """The model's number of decoder blocks L; :class:`UserError` unless 1 ≤ ``blocks`` ≤ L."""
    depth = len(decoder_parts(model).blocks)
    if not 1 <= blocks <= depth:
        raise UserError(f"--train-layers must be in 1..{depth} (the model's decoder blocks), got {blocks}")
    return depth


def train_top_blocks(model: PreTrainedModel, blocks: int) -> PreTrainedModel:
    """``model`` with only the weights of its last ``blocks`` decoder blocks trainable (embeddings, lower
    blocks, final norm and output layer frozen)."""
    depth = check_train_layers(model, blocks)
    model.requires_grad_(False)
    for block in decoder_parts(model).blocks[depth - blocks :]:
        block.requires_grad_(True)
    return model


_MASK_CACHE_ARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


class TopBlocks(nn.Module):
    """The last ``blocks`` decoder blocks of ``model`` (shared with it: training them trains ``model``), its
    final norm and output layer, run on cached hidden states.

    ``forward(batch)`` takes ``{"hidden": (B, T, d), "attention_mask": (B, T), "positions": (B, P), ...}``
    (:func:`collate_prefix`) and returns the logits (B, P, V) at ``positions`` only."""

    def __init__(self, model: nn.Module, blocks: int) -> None:
        super().__init__()
        depth = check_train_layers(model, blocks)
        parts = decoder_parts(model)
        self.first = depth - blocks
        self.depth = depth
        self.config = parts.causal_lm.config
        self.blocks = nn.ModuleList(list(parts.blocks[self.first :]))
        self.norm = parts.norm
        self.output = parts.output
        self.rotary = parts.rotary

    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        mask = batch["attention_mask"]
        hidden = batch["hidden"].to(self.output.weight.dtype)
        rows, width = mask.shape
        position_ids = torch.arange(width, device=hidden.device).expand(rows, width)
        causal = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden,
            attention_mask=mask,
            position_ids=position_ids,
            **{_MASK_CACHE_ARG: None},
        )
        extra: dict[str, Any] = {}
        if self.rotary is not None:
            extra["position_embeddings"] = self.rotary(hidden, position_ids)
        for block in self.blocks:
            out = block(hidden, attention_mask=causal, position_ids=position_ids, **extra)
            hidden = out[0] if isinstance(out, tuple) else out
        picked = hidden[torch.arange(rows, device=hidden.device)[:, None], batch["positions"]]
        return self.output(self.norm(picked))


@dataclass(frozen=True)
class PrefixRow:
    """One cached training row: the hidden states (n, d) entering the first trained block at the example's
    n tokens, the positions (P,) whose logits carry loss, and the token each predicts (``targets``, P)."""

    hidden: Tensor
    positions: Tensor
    targets: Tensor


class _Stop(Exception):
    """Raised by the pre-hook of the first trained block: the frozen prefix is done."""


def prefix_states(parts: DecoderParts, first: int, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """The hidden states (B, T, d) entering decoder block ``first`` of a right-padded batch (position ids
    0..T−1 per row, as :func:`privlm.dpsgd.losses.model_inputs` gives the uncached model), without running
    that block or any above it."""
    captured: list[Tensor] = []

    def grab(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured.append(args[0] if args else kwargs["hidden_states"])
        raise _Stop

    rows, width = input_ids.shape
    positions = torch.arange(width, device=input_ids.device).expand(rows, width)
    handle = parts.blocks[first].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            parts.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False)
    except _Stop:
        pass
    finally:
        handle.remove()
    if not captured:
        raise RuntimeError(f"decoder block {first} was never called")
    return captured[0].detach()


def prefix_pass(model: nn.Module, blocks: int, pad_id: int, max_length: int) -> FrozenPass:
    """The :class:`~privlm.training.prefix_cache.FrozenPass` of the hidden states entering block L−``blocks``:
    example i's n_i states, computed in a batch of ``BATCH_ROWS`` rows × the public width ladder holding n_i
    (capped at ``max_length``, the public bound the rows were encoded with), at least one filler row. Bound to
    the fingerprint of :class:`FrozenPrefix`: the configuration and every weight below that block."""
    depth = check_train_layers(model, blocks)
    parts = decoder_parts(model)
    first = depth - blocks

    def compute(rows: Sequence[EncodedRow], on_rows: OnRows | None) -> tuple[Tensor, Tensor]:
        lengths = [len(r.input_ids) for r in rows]
        out: list[Tensor | None] = [None] * len(rows)
        was_training = parts.causal_lm.training
        parts.causal_lm.eval()
        try:
            for indices, width in shape_buckets(lengths, BATCH_ROWS, max_length):
                ids, mask, _ = padded_batch([rows[i].input_ids for i in indices], pad_id, width=width, rows=BATCH_ROWS)
                states = prefix_states(parts, first, ids, mask)
                for j, i in enumerate(indices):
                    out[i] = states[j, : lengths[i]]
                if on_rows is not None:
                    on_rows(len(indices))
        finally:
            parts.causal_lm.train(was_training)
        width_d = parts.causal_lm.config.hidden_size
        values = torch.cat([t for t in out if t is not None]) if rows else torch.zeros(0, width_d)
        return values, torch.tensor(lengths, dtype=torch.long)

    layout = LAYOUT.format(first=first, depth=depth)
    return FrozenPass(layout, FrozenPrefix(parts, first), parts.causal_lm.config.hidden_size, compute)


class FrozenPrefix(nn.Module):
    """What the hidden states entering block ``first`` are a function of: the model's configuration and the
    backbone's modules below that block (embeddings, positions, blocks 0..first−1, any adapters on them),
    not the trained blocks above it, the final norm or the output layer. The prefix cache is bound to its
    fingerprint, so runs that differ only in what they train on top (their seed's LoRA initial values, the
    LoRA rank, full blocks or adapters) share one cache, and another base model is refused."""

    def __init__(self, parts: DecoderParts, first: int) -> None:
        super().__init__()
        self.config = parts.causal_lm.config
        for name, child in parts.backbone.named_children():
            if child is not parts.blocks and child is not parts.norm:
                self.add_module(name, child)
        self.below = nn.ModuleList(list(parts.blocks[:first]))


def load_or_build(
    cache_dir: Path,
    model: nn.Module,
    blocks: int,
    train: Sequence[EncodedRow],
    pad_id: int,
    max_length: int,
    dtype: str = "bfloat16",
    chunk: int = 128,
    on_build: Callable[[int], None] | None = None,
    on_rows: OnRows | None = None,
) -> Features:
    """The cached hidden states entering block L−``blocks`` of every training row, from ``cache_dir`` (built
    there first, chunk by chunk, resumable; refused when built for other rows, another model — weights,
    configuration, adapters' initial values — another block, ``max_length`` or dtype). ``model`` is the model
    as prepared for training (before any step). The test split is not cached (it is scored by the model).
    ``on_build(n)`` before a build of n examples, ``on_rows(n)`` as n more are done (progress)."""
    frozen = prefix_pass(model, blocks, pad_id, max_length)
    return load_or_build_pass(cache_dir, frozen, train, [], max_length, dtype, on_build, chunk, on_rows)


def loss_targets(row: EncodedRow, first_target_only: bool = False) -> tuple[Tensor, Tensor]:
    """``(positions, targets)`` of one encoded row, as the uncached loss reads them from its collated labels:
    position t carries loss when the label at t+1 is a target (not ``IGNORE_INDEX``), and predicts that
    token. ``first_target_only``: only the first such position (the label-word objective of ``classify``)."""
    labels = (collate_completions([row], 0) if isinstance(row, EncodedCompletion) else collate([row], 0))["labels"][0]
    shifted = labels[1:]
    positions = (shifted != IGNORE_INDEX).nonzero().flatten()
    if positions.numel() == 0:
        raise UserError("a training row has no target token")
    if first_target_only:
        positions = positions[:1]
    return positions, shifted[positions]


def cached_rows(
    features: Features, rows: Sequence[EncodedRow], label_ids: Sequence[int] | None = None
) -> list[PrefixRow]:
    """Training rows of a ``--train-layers`` run: each example's cached states with its loss positions and
    targets (``label_ids``: the classes' first label-word tokens — the label-word objective, one position)."""
    states = features.rows("train")
    if len(states) != len(rows):
        raise ValueError(f"{len(states)} cached rows for {len(rows)} training rows")
    out = []
    for i, (hidden, row) in enumerate(zip(states, rows)):
        if hidden.shape[0] != len(row.input_ids):
            raise ValueError(f"cached row {i} holds {hidden.shape[0]} states for {len(row.input_ids)} tokens")
        positions, targets = loss_targets(row, first_target_only=label_ids is not None)
        if label_ids is not None and int(targets[0]) not in label_ids:
            raise ValueError(f"row {i}: its first target token is not one of the label words' first tokens")
        out.append(PrefixRow(hidden, positions, targets))
    return out


def collate_prefix(rows: Sequence[PrefixRow]) -> dict[str, Tensor]:
    """``{"hidden": (B, T, d), "attention_mask": (B, T), "positions": (B, P), "targets": (B, P)}``: states
    right-padded with zeros to the longest row (mask 0), positions padded with 0 and targets with
    ``IGNORE_INDEX`` (no loss)."""
    width = max(r.hidden.shape[0] for r in rows)
    count = max(r.positions.numel() for r in rows)
    d = rows[0].hidden.shape[1]
    hidden = torch.zeros(len(rows), width, d, dtype=rows[0].hidden.dtype)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    positions = torch.zeros(len(rows), count, dtype=torch.long)
    targets = torch.full((len(rows), count), IGNORE_INDEX, dtype=torch.long)
    for i, r in enumerate(rows):
        n, p = r.hidden.shape[0], r.positions.numel()
        hidden[i, :n] = r.hidden
        mask[i, :n] = 1
        positions[i, :p] = r.positions
        targets[i, :p] = r.targets
    return {"hidden": hidden, "attention_mask": mask, "positions": positions, "targets": targets}


def length_sorted_batches(batch: Mapping[str, Tensor], max_size: int | None) -> Iterator[dict[str, Tensor]]:
    """Micro-batches of a :func:`collate_prefix` batch for the DP-SGD engine (``micro_batches``): its rows
    longest first, at most ``max_size`` per micro-batch, each cut to its own longest row and most loss
    positions. A logical batch padded to its longest row is about half padding on long documents (BBC
    articles: 535 real tokens on average, padded to 1,024); sorted, each micro-batch pads only to rows of
    similar length. Every row is in exactly one micro-batch and its loss, norm and clipped gradient do not
    depend on the others (see the module docstring), so the clipped sum is that of the whole batch up to
    rounding (``tests/training/test_top_blocks.py``); the order is a function of the sampled rows only."""
    lengths = batch["attention_mask"].sum(1)
    counts = (batch["targets"] != IGNORE_INDEX).sum(1)
    for rows in longest_first(lengths, max_size):
        width, count = int(lengths[rows].max()), int(counts[rows].max())
        yield {
            "hidden": batch["hidden"][rows, :width],
            "attention_mask": batch["attention_mask"][rows, :width],
            "positions": batch["positions"][rows, :count],
            "targets": batch["targets"][rows, :count],
        }


@dataclass(frozen=True)
class CachedTraining:
    """What :func:`privlm.training.loop.prepare` takes to train the top blocks over their cached prefix."""

    module: TopBlocks
    rows: list[PrefixRow]
    collate: Callable[[Sequence[PrefixRow]], dict[str, Tensor]]
    loss_fn: Callable[[TopBlocks, Mapping[str, Tensor]], Tensor]
    micro_batches: Callable[[Mapping[str, Tensor], int | None], Iterator[dict[str, Tensor]]]


def cached_training(
    module: nn.Module,
    blocks: int,
    features: Features,
    rows: Sequence[EncodedRow],
    label_ids: Sequence[int] | None = None,
) -> CachedTraining:
    """The top ``blocks`` of ``module`` over ``features`` (:func:`load_or_build`) for the encoded ``rows``: the
    cached rows, their collate, the per-sample loss (the mean token loss, or with ``label_ids`` the K-way
    label-word loss) and the length-sorted micro-batch cut."""
    loss_fn = (
        top_token_losses
        if label_ids is None
        else functools.partial(top_label_word_losses, label_ids=torch.tensor(list(label_ids), dtype=torch.long))
    )
    return CachedTraining(
        TopBlocks(module, blocks),
        cached_rows(features, rows, label_ids),
        collate_prefix,
        loss_fn,
        length_sorted_batches,
    )


def top_token_losses(top: TopBlocks, batch: Mapping[str, Tensor]) -> Tensor:
    """Per-sample mean next-token loss (B,) over each row's targets — the cached twin of
    :func:`privlm.dpsgd.losses.causal_lm_losses` with ``reduction="mean"`` (``lm`` and ``generate``)."""
    return token_losses(top(batch), batch["targets"], "mean")


def top_label_word_losses(top: TopBlocks, batch: Mapping[str, Tensor], label_ids: Tensor) -> Tensor:
    """Per-sample K-way label-word cross-entropy (B,) — the cached twin of
    :func:`privlm.dpsgd.losses.label_word_lm_losses` (one loss position per row)."""
    logits = top(batch)[:, 0]
    classes = (batch["targets"][:, :1] == label_ids[None, :]).int().argmax(1)
    return label_word_losses(logits[:, label_ids], classes)
