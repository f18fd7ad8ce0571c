"""Atomic checkpoints of a training run and the files of its run folder.

A checkpoint is the folder ``RUN_DIR/checkpoint-<step>/`` holding

- ``trainable.safetensors``: every trainable parameter by name (the LoRA adapter, or the whole model);
- ``state.pt``: the optimizer state and the RNG states (Poisson sampler, noise, each rank's probes);
- ``privacy.json``: the privacy ledger of exactly the steps whose effect is in these weights;
- ``meta.json``: the step, the run's settings and the fingerprints of its training rows and initial model
  (:mod:`privlm.training.fingerprint`; a resume with other settings, data or model is refused). The data
  fingerprint is a function of the private data: like the RNG states, it never leaves the run folder.

It is written into a temporary folder and renamed into place (``os.replace``), so a checkpoint
folder either is complete or does not exist; older checkpoints are removed afterwards. The run's
ledger ``RUN_DIR/privacy.json`` is saved *before* the checkpoint (write-ahead, :mod:`privlm.training.loop`),
so it always covers at least the checkpoint's steps and a resume takes it as the truth (a run folder of
an older privlm, whose ledger could lag the checkpoint's, is read too). Steps run after the last
checkpoint and lost to a crash are re-run on resume with the same saved randomness (same batch, same
probes, same noise) on the same rows and model (fingerprints): nothing new is released, and steps the
ledger already covers are not recorded again, so the ledger counts every step exactly once.

The RNG states let anyone holding a checkpoint reproduce the noise: checkpoints are as secret as the
training data. The release is the final model/adapter folder and ``privacy.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from privlm.dpsgd.sharding import gathered, is_sharded, local_part
from privlm.errors import UserError
from privlm.privacy import Ledger

PREFIX = "checkpoint-"


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` returns."""

    path: Path
    step: int
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    ledger: Ledger
    meta: dict[str, Any]


def trainable_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every trainable parameter by name (a tied weight once), detached and contiguous; a sharded (FSDP2)
    parameter gathered whole (a collective: every rank calls it)."""
    return {name: gathered(p).contiguous() for name, p in module.named_parameters() if p.requires_grad}


def load_trainable_state(module: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy ``weights`` into ``module``'s trainable parameters; the names must match exactly."""
    params = {name: p for name, p in module.named_parameters() if p.requires_grad}
    if set(params) != set(weights):
        missing = sorted(set(params) ^ set(weights))[:3]
        raise UserError(f"checkpoint does not match the model's trainable parameters (e.g. {missing})")
    with torch.no_grad():
        for name, p in params.items():
            if is_sharded(p):  # this rank's rows of the whole saved weight
                p.to_local().copy_(local_part(p, weights[name]))
            else:
                p.copy_(weights[name])


FINISHED = "FINISHED"


def retire_checkpoints(run_dir: Path) -> None:
    """After the release is saved: delete every checkpoint (each holds the noise, probe and sampler RNG
    states, which would let anyone remove the noise from the released weights) and mark the run finished."""
    (run_dir / FINISHED).write_text("training finished; checkpoints (with RNG states) were deleted\n")
    for path in checkpoints(run_dir):
        shutil.rmtree(path)


def checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint folders of ``run_dir``, oldest first."""
    found = [p for p in run_dir.glob(f"{PREFIX}*") if p.is_dir() and p.name[len(PREFIX) :].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def remove_stale_temporaries(run_dir: Path) -> None:
    """Delete half-written checkpoint folders left by a killed writer."""
    for path in run_dir.glob(f".{PREFIX}*"):
        shutil.rmtree(path, ignore_errors=True)


def save_checkpoint(
    run_dir: Path,
    step: int,
    weights: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
    rng: dict[str, Any],
    ledger: Ledger,
    meta: dict[str, Any],
) -> Path:
    """Write ``RUN_DIR/checkpoint-<step>`` (``weights``: :func:`trainable_state`) atomically and remove older
    checkpoints; returns its path."""
    target = run_dir / f"{PREFIX}{step:08d}"
    if target.exists():
        raise UserError(f"{target} already exists; a run never writes the same step twice")
    tmp = Path(tempfile.mkdtemp(prefix=f".{PREFIX}", dir=run_dir))
    try:
        save_file(weights, str(tmp / "trainable.safetensors"))
        torch.save({"optimizer": optimizer_state, "rng": rng}, tmp / "state.pt")
        ledger.save(tmp / "privacy.json")
        (tmp / "meta.json").write_text(json.dumps({**meta, "step": step}, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in checkpoints(run_dir)[:-1]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def load_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint folder written by :func:`save_checkpoint`."""
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        state = torch.load(path / "state.pt", weights_only=True)
        weights = load_file(str(path / "trainable.safetensors"))
    except (OSError, ValueError, RuntimeError) as err:
        raise UserError(f"{path}: unreadable checkpoint ({err})") from err
    return Checkpoint(
        path, int(meta["step"]), weights, state["optimizer"], state["rng"], Ledger.load(path / "privacy.json"), meta
    )


def replace_folder(source: Path, target: Path) -> None:
    """Move the finished folder ``source`` to ``target``, replacing an older ``target`` if there is one."""
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
        os.replace(source, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(source, target)
