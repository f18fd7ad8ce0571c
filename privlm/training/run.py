"""One fine-tuning run from names: model + dataset + settings → trained model, ledger, metrics.

Used by ``privlm train`` and by Python callers alike; under ``torchrun`` every rank calls it (rank 0
writes the run folder and evaluates).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.pytorch_utils import Conv1D

from privlm.errors import UserError
from privlm.resources.models import load_model
from privlm.training.checkpoint import replace_folder, retire_checkpoints
from privlm.training.data import TaskData, check_max_length, encode, load_task_data, make_collate
from privlm.training.distributed import barrier, init_from_env
from privlm.training.evaluate import test_metrics
from privlm.training.loop import Run, TrainConfig, append_metrics, prepare, train_loop

SPLIT_SEED = 0  # the datasets' standard seeded splits, whatever the training seed
LORA_ALPHA = 16


_BLOCK = re.compile(r"\.(?:layers|h)\.(\d+)\.")


def top_block_linears(model: PreTrainedModel, blocks: int) -> list[str]:
    """Names of the linear layers (``nn.Linear``, GPT-2 ``Conv1D``) inside the last ``blocks`` decoder blocks."""
    found = [(int(m.group(1)), name) for name, module in model.named_modules()
             if isinstance(module, (torch.nn.Linear, Conv1D)) and (m := _BLOCK.search(name))]
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


def save_model(module: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, run_dir: Path, lora: bool) -> Path:
    """Write ``RUN_DIR/adapter`` (LoRA, safetensors) or ``RUN_DIR/model`` (+ tokenizer) atomically."""
    target = run_dir / ("adapter" if lora else "model")
    tmp = run_dir / f".{target.name}.tmp"
    module.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    replace_folder(tmp, target)
    return target


@dataclass
class Session:
    """A run ready to train: the model (with LoRA if asked), its tokenizer, the data, the prepared loop."""

    model_name: str
    data_name: str
    config: TrainConfig
    module: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    data: TaskData
    run: Run


def set_up(
    model_name: str, data_name: str, config: TrainConfig, max_train: int | None = None, labels: object = None
) -> Session:
    """Load, check (T against the model's context, labels for ``classify``), encode, wrap for DP-SGD and
    calibrate σ; every bad input raises :class:`UserError` here, before any training. ``max_train``
    keeps the first examples of the (seeded, shuffled) train split — a data-independent choice."""
    ctx = init_from_env()
    if max_train is not None and max_train < 1:
        raise UserError(f"--max-train must be >= 1, got {max_train}")
    model, tokenizer = load_model(model_name, seed=config.seed or 0)
    check_max_length(model, config.max_length)
    data = load_task_data(data_name, config.task, SPLIT_SEED, labels)
    if max_train is not None:
        data = replace(data, train=data.train[:max_train])
    rows = encode(data, tokenizer, config.max_length)
    # The adapters' initial values are public and fixed (seed 0 without --seed, like the tiny models' weights):
    # a resume rebuilds the very model it started from, which the model fingerprint checks.
    module = with_lora(model, config.lora, config.seed or 0, config.lora_layers)
    module.train()
    run = prepare(module, rows, make_collate(tokenizer), config, ctx)
    return Session(model_name, data_name, config, module, tokenizer, data, run)


def fine_tune(
    session: Session,
    run_dir: Path,
    *,
    resume: bool = False,
    max_test: int | None = None,
    on_progress: Callable[[int, int, float | None, float | None], None] | None = None,
) -> dict[str, Any]:
    """Train (resuming from ``run_dir`` if asked), save the model or adapter, score the test split.

    Returns a JSON-ready summary (steps, why training stopped, σ drawn and σ accounted, ε spent, test
    metrics, wall time)."""
    run, config = session.run, session.config
    result = train_loop(run, run_dir, resume, on_progress)
    summary: dict[str, Any] = {
        "model": session.model_name, "data": session.data_name, "task": config.task, "private": config.private,
        "private_release": config.private and run.streams.private,
        "norm_mode": config.norm_mode if config.private else None, "n_train": len(run.rows),
        "steps": result.steps, "planned_steps": result.total_steps, "stopped": result.stopped,
        "sample_rate": run.sample_rate, "noise_multiplier": run.noise_multiplier,
        "accounted_noise_multiplier": run.accounted_noise_multiplier,
        "epsilon": result.epsilon, "delta": config.delta if config.private else None,
        "resumed_from": result.resumed_from, "world_size": run.ctx.world, "train_wall_s": round(result.wall_s, 1),
    }
    if run.ctx.is_main:
        summary["saved"] = str(save_model(session.module, session.tokenizer, run_dir, config.lora > 0))
        retire_checkpoints(run_dir)  # they hold the noise and sampling RNG states: never beside the release
        summary["test"] = test_metrics(session.module, session.tokenizer, session.data, config.max_length,
                                       max_examples=max_test)
        append_metrics(run_dir, {"step": result.steps, "test": summary["test"]})
    barrier(run.ctx)
    return summary
