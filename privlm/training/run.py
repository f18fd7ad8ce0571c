"""One fine-tuning run from names: model + dataset + settings → trained model, ledger, metrics.

Used by ``privlm train`` and by Python callers alike; under ``torchrun`` every rank calls it (rank 0
writes the run folder and evaluates).
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.pytorch_utils import Conv1D

from privlm.atomic import write_text_atomic
from privlm.dpsgd.losses import label_word_lm_losses
from privlm.dpsgd.sampling import physical_batches
from privlm.errors import UserError
from privlm.evaluation.generation_metrics import PREDICTIONS_FILE, write_predictions
from privlm.lm.completion import count_cut, encode_prompt
from privlm.lm.prompts import check_label_words, pad_token_id
from privlm.progress import SILENT, Progress
from privlm.resources.completions import BUILTIN as COMPLETION_BUILTINS
from privlm.resources.datasets import DataSpec
from privlm.resources.models import load_model
from privlm.training import fsdp, prefix_cache, top_blocks
from privlm.training.checkpoint import replace_folder, retire_checkpoints
from privlm.training.data import (
    TaskData,
    check_max_length,
    encode,
    length_sorted_token_batches,
    load_task_data,
    make_collate,
)
from privlm.training.distributed import barrier, init_from_env
from privlm.training.evaluate import classify_report, generation_report, label_word_scores, test_metrics
from privlm.training.head import LabelWordHead, head_losses, label_token_ids
from privlm.training.loop import Run, TrainConfig, append_metrics, prepare, train_loop

SPLIT_SEED = 0  # the datasets' standard seeded splits, whatever the training seed
LORA_ALPHA = 16


_BLOCK = re.compile(r"\.(?:layers|h)\.(\d+)\.")


def top_block_linears(model: PreTrainedModel, blocks: int) -> list[str]:
    """Names of the linear layers (``nn.Linear``, GPT-2 ``Conv1D``) inside the last ``blocks`` decoder blocks."""
    found = [
        (int(m.group(1)), name)
        for name, module in model.named_modules()
        if isinstance(module, (torch.nn.Linear, Conv1D)) and (m := _BLOCK.search(name))
    ]
    if not found:
        raise UserError(f"{type(model).__name__}: no decoder blocks named '.layers.N.' or '.h.N.' to restrict LoRA to")
    depth = max(i for i, _ in found) + 1
    if not 1 <= blocks <= depth:
        raise UserError(f"--lora-layers must be in 1..{depth} (the model's decoder blocks), got {blocks}")
    return [name for i, name in found if i >= depth - blocks]


def with_lora(model: PreTrainedModel, rank: int, seed: int | None, blocks: int | None = None) -> torch.nn.Module:
    """LoRA adapters of rank ``rank`` on all linear layers (base frozen), or only on those of the last
    ``blocks`` decoder blocks — the backward pass then stops there, which makes a step much cheaper;
    ``rank == 0``: train everything."""
    if rank == 0:
        if blocks is not None:
            raise UserError("--lora-layers needs --lora R > 0")
        return model.requires_grad_(True)
    targets = "all-linear" if blocks is None else top_block_linears(model, blocks)
    config = LoraConfig(r=rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=targets)
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)  # peft draws the A matrices from the global generator
        return get_peft_model(model, config)


def save_model(
    module: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    run_dir: Path,
    lora: bool,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``RUN_DIR/adapter`` (LoRA, safetensors) or ``RUN_DIR/model`` (+ tokenizer) atomically;
    ``state_dict``: the weights to write (the gathered ones of a sharded model), else the module's own."""
    target = run_dir / ("adapter" if lora else "model")
    tmp = run_dir / f".{target.name}.tmp"
    module.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(tmp)
    replace_folder(tmp, target)
    return target


def save_head(head: LabelWordHead, data: TaskData, model_name: str, run_dir: Path) -> Path:
    """Write ``RUN_DIR/head`` atomically: ``label_rows.safetensors`` (the K × d trained rows) and ``head.json``
    (the label words, their first-token ids and the base model, all public)."""
    target = run_dir / "head"
    tmp = run_dir / ".head.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({"rows": head.rows.weight.detach().contiguous()}, str(tmp / "label_rows.safetensors"))
    info = {
        "base_model": model_name,
        "label_words": list(data.verbalizer.label_words),
        "template": data.verbalizer.template,
        "label_token_ids": head.label_ids.tolist(),
        "use": "replace these rows of the base model's output layer (untied) to get the trained classifier",
    }
    (tmp / "head.json").write_text(json.dumps(info, indent=2) + "\n")
    replace_folder(tmp, target)
    return target


@dataclass
class Session:
    """A run ready to train: the model (with LoRA if asked, or the label-word head) that is saved and
    scored (``module``), its tokenizer, the data, the prepared loop (whose ``run.module`` is ``module``, or
    the :class:`~privlm.training.top_blocks.TopBlocks` of a cached ``--train-layers`` run, sharing its
    trained weights), the cached features or hidden states (None when nothing is cached) with their folder,
    and for ``generate`` the number of training rows whose prompt was cut to fit (``rows_cut``)."""

    model_name: str
    data_name: str
    config: TrainConfig
    module: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    data: TaskData
    run: Run
    features: prefix_cache.Features | None = None
    cache_dir: Path | None = None
    rows_cut: int | None = None


CACHE_BUILD = "building the private prefix cache (frozen layers, once per example)"


def set_up(
    model_name: str,
    data_name: str | DataSpec,
    config: TrainConfig,
    max_train: int | None = None,
    labels: object = None,
    cache_dir: Path | None = None,
    on_cache_build: Callable[[int], None] | None = None,
    progress: Progress = SILENT,
) -> Session:
    """Load, check (T against the model's context, labels for ``classify``, the test prompts' room for
    ``generate``), encode, wrap for DP-SGD and calibrate σ; every bad input raises :class:`UserError` here,
    before any training. ``max_train`` keeps the first examples of the (seeded, shuffled) train split — a
    data-independent choice.

    ``classify`` trains on the label-word objective (K-way cross-entropy over the label words' first
    tokens); with ``config.head_only`` only the label-word rows are trained, on features read from (or
    built into) the private ``cache_dir`` when ``config.cache`` is set (:mod:`privlm.training.prefix_cache`).
    ``generate`` trains on the mean next-token loss of each row's completion (its prompt masked).
    ``config.train_layers`` N trains only the last N decoder blocks (full weights, or LoRA with ``config.lora``);
    with ``config.cache`` the hidden states entering them are read from (or built into) ``cache_dir`` and
    every step runs only those blocks (:mod:`privlm.training.top_blocks`). ``on_cache_build(n)`` is called
    before a cache build of n examples; ``progress`` shows the build (its count is private: not shown)."""
    ctx = init_from_env()
    if max_train is not None and max_train < 1:
        raise UserError(f"--max-train must be >= 1, got {max_train}")
    model, tokenizer = load_model(model_name, seed=config.seed or 0)
    check_max_length(model, config.max_length)
    if config.train_layers is not None:
        top_blocks.check_train_layers(model, config.train_layers)
    data = load_task_data(data_name, config.task, SPLIT_SEED, labels, config.template)
    if max_train is not None:
        data = replace(data, train=data.train[:max_train])
    rows = encode(data, tokenizer, config.max_length)
    collate, micro_batches = make_collate(tokenizer), length_sorted_token_batches
    rows_cut = None
    if config.task == "generate":
        rows_cut = count_cut(rows)
        _check_test_prompts(data, tokenizer, config)
    if config.task == "classify":
        check_label_words(tokenizer, data.verbalizer)
    label_ids = label_token_ids(tokenizer, data.verbalizer) if config.task == "classify" else None
    label_tensor = None if label_ids is None else torch.tensor(label_ids, dtype=torch.long)
    features = None
    cached = config.cache is not None and (config.head_only or config.train_layers is not None)
    if cached:
        if ctx.world > 1:
            raise UserError("a cached run runs on one process (the cache is built once); drop torchrun or --no-cache")
        if cache_dir is None:
            raise UserError("a cached run needs a cache folder")
    build = BuildProgress(progress, on_cache_build)
    if config.head_only:
        module = trained = LabelWordHead(model, label_ids)
        loss_fn = head_losses
        if config.cache is not None:
            test_rows = encode(data, tokenizer, config.max_length, split="test")
            features = prefix_cache.load_or_build(
                cache_dir,
                module,
                rows,
                test_rows,
                pad_token_id(tokenizer),
                config.max_length,
                config.cache,
                build.on_build,
                on_rows=build.on_rows,
            )
            rows = prefix_cache.cached_rows(features.train, [y for _, y in data.train])
            collate, micro_batches = prefix_cache.collate_cached, physical_batches  # one d-vector a row: no padding
    else:
        # The adapters' initial values are public and fixed (seed 0 without --seed, like the tiny models' weights):
        # a resume rebuilds the very model it started from, which the model fingerprint checks.
        if config.train_layers is not None and not config.lora:
            module = top_blocks.train_top_blocks(model, config.train_layers)
        else:
            blocks = config.train_layers if config.train_layers is not None else config.lora_layers
            module = with_lora(model, config.lora, config.seed or 0, blocks)
        trained = module
        loss_fn = None if label_tensor is None else functools.partial(label_word_lm_losses, label_ids=label_tensor)
        if config.train_layers is not None and config.cache is not None:
            features = top_blocks.load_or_build(
                cache_dir,
                module,
                config.train_layers,
                rows,
                pad_token_id(tokenizer),
                config.max_length,
                config.cache,
                on_build=build.on_build,
                on_rows=build.on_rows,
            )
            top = top_blocks.cached_training(module, config.train_layers, features, rows, label_ids)
            trained, rows, collate, loss_fn, micro_batches = (
                top.module,
                top.rows,
                top.collate,
                top.loss_fn,
                top.micro_batches,
            )
    build.done()
    trained.train()
    run = prepare(trained, rows, collate, config, ctx, loss_fn, micro_batches)
    return Session(model_name, str(data_name), config, module, tokenizer, data, run, features, cache_dir, rows_cut)


class BuildProgress:
    """Reports a cache build (opened only when one starts): ``on_cache_build(n)`` and a private progress task
    (its count, the number of private examples, is never shown)."""

    def __init__(self, progress: Progress, on_cache_build: Callable[[int], None] | None) -> None:
        self.progress, self.user, self.task = progress, on_cache_build, None

    def on_build(self, n: int) -> None:
        if self.user is not None:
            self.user(n)
        self.task = self.progress.task(CACHE_BUILD, total=n, private=True)

    def on_rows(self, n: int) -> None:
        if self.task is not None:
            self.task.advance(n)

    def done(self) -> None:
        if self.task is not None:
            self.task.done()


def _check_test_prompts(data: TaskData, tokenizer: PreTrainedTokenizerBase, config: TrainConfig) -> None:
    """Refuse, before training, a test prompt whose template leaves it no room next to ``max_new_tokens``
    (the message names the row, never its text)."""
    room = config.max_length - config.max_new_tokens
    for i, row in enumerate(data.test):
        encode_prompt(tokenizer, row.prompt, max_length=room, template=data.template, row=f"test row {i}")


def head_scores(session: Session, max_test: int | None) -> np.ndarray:
    """K-way log-softmax scores (M, K) of the trained head on the first ``max_test`` test examples."""
    head, data = session.module, session.data
    test = data.test[:max_test] if max_test else data.test
    if session.features is not None:
        features = session.features.test[: len(test)]
    else:
        rows = encode(replace(data, test=tuple(test)), session.tokenizer, session.config.max_length, split="test")
        features = prefix_cache.compute_features(head, rows, pad_token_id(session.tokenizer), session.config.max_length)
    with torch.inference_mode():
        return torch.log_softmax(head({"features": features}).double(), dim=1).numpy()


DECODING = "decoding the test prompts (greedy)"


def evaluate_session(
    session: Session, run_dir: Path, max_test: int | None, progress: Progress = SILENT, write: bool = True
) -> dict[str, Any]:
    """Test metrics of the trained model; for ``classify`` also ``RUN_DIR/predictions.jsonl`` (one line per
    test example: index, gold, predicted, per-class scores — K-way log-probabilities for a head-only run,
    label-word scores otherwise); for ``generate`` ROUGE-1/2/L F1 and exact match of the greedy completions
    of the test prompts (at most ``config.max_new_tokens`` tokens each) and ``predictions.jsonl`` (index,
    reference, generated), the decoding shown on ``progress``."""
    config, data = session.config, session.data
    if config.task == "generate":
        n = len(data.test[:max_test] if max_test else data.test)
        task = progress.task(DECODING, total=n)
        metrics, records = generation_report(
            session.module,
            session.tokenizer,
            data,
            config.max_length,
            config.max_new_tokens,
            max_examples=max_test,
            on_batch=task.advance,
        )
        task.done()
        if write:
            write_predictions(run_dir / PREDICTIONS_FILE, records)
        return metrics
    if config.task != "classify":
        return test_metrics(session.module, session.tokenizer, data, config.max_length, max_examples=max_test)
    if config.head_only:
        scores = head_scores(session, max_test)
    else:
        scores = label_word_scores(session.module, session.tokenizer, data, config.max_length, max_examples=max_test)
    metrics, records = classify_report(scores, [y for _, y in data.test])
    if write:
        write_text_atomic(run_dir / "predictions.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    return metrics


def fine_tune(
    session: Session,
    run_dir: Path,
    *,
    resume: bool = False,
    max_test: int | None = None,
    on_progress: Callable[[int, int, float | None, float | None], None] | None = None,
    progress: Progress = SILENT,
) -> dict[str, Any]:
    """Train (resuming from ``run_dir`` if asked), save the model, adapter or head, score the test split.

    Returns a JSON-ready summary (steps, why training stopped, σ drawn and σ accounted, ε spent, test
    metrics, wall time; ``generate``: ``rows_cut``, the training rows whose prompt was cut to fit). A cache
    inside ``run_dir`` is deleted with the checkpoints at the end (it holds the private data's features or
    hidden states); one elsewhere is kept for other runs on the same data. ``progress`` shows the decoding
    of a ``generate`` evaluation."""
    run, config = session.run, session.config
    result = train_loop(run, run_dir, resume, on_progress)
    summary: dict[str, Any] = {
        "model": session.model_name,
        "data": session.data_name,
        "task": config.task,
        "private": config.differentially_private,  # σ = 0 clips without noise: NOT private
        "private_release": config.differentially_private and run.streams.private,
        "norm_mode": config.norm_mode if config.private else None,
        "n_train": len(run.rows),
        "steps": result.steps,
        "planned_steps": result.total_steps,
        "stopped": result.stopped,
        "sample_rate": run.sample_rate,
        "noise_multiplier": run.noise_multiplier,
        "accounted_noise_multiplier": run.accounted_noise_multiplier,
        "epsilon": result.epsilon,
        "delta": config.delta if config.private else None,
        "resumed_from": result.resumed_from,
        "world_size": run.ctx.world,
        "train_wall_s": round(result.wall_s, 1),
    }
    if session.rows_cut is not None:
        # An exact count over the training rows: released only for a built-in (public) data set. For user
        # data it is a non-DP statistic of the private rows (one long row in or out changes it), so only
        # the public bound it was cut to is said; N itself is public by DP-SGD's documented assumption.
        public = session.data_name in COMPLETION_BUILTINS
        summary["rows_cut"] = session.rows_cut if public else None
        if not public:
            summary["rows_cut_note"] = (
                f"not released for private data: a count over the private rows; prompts longer than "
                f"max_length = {config.max_length} tokens were cut (their completions never)"
            )
    if session.features is not None:  # seconds spent computing the frozen features (None: read from the cache)
        summary["cache_build_s"] = None if session.features.build_s is None else round(session.features.build_s, 1)
    # --fsdp: the weights are gathered on every rank (a collective), and every rank runs the same evaluation
    # (the sharded forward needs all of them); rank 0 writes
    full = fsdp.full_state_dict(session.module) if config.fsdp else None
    if run.ctx.is_main:
        if config.head_only:
            summary["saved"] = str(save_head(session.module, session.data, session.model_name, run_dir))
        else:
            summary["saved"] = str(save_model(session.module, session.tokenizer, run_dir, config.lora > 0, full))
        retire_checkpoints(run_dir)  # they hold the noise and sampling RNG states: never beside the release
    barrier(run.ctx)
    if config.fsdp or run.ctx.is_main:
        test = evaluate_session(session, run_dir, max_test, progress, write=run.ctx.is_main)
    if run.ctx.is_main:
        summary["test"] = test
        if session.cache_dir is not None and session.cache_dir.resolve().parent == run_dir.resolve():
            shutil.rmtree(session.cache_dir, ignore_errors=True)
        append_metrics(run_dir, {"step": result.steps, "test": summary["test"]})
    barrier(run.ctx)
    return summary
