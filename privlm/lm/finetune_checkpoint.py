"""Checkpoints of a label-word fine-tune, so that a killed evaluation resumes where it was last saved.

:func:`privlm.lm.finetune.finetune_classifier` given an :class:`EpochCheckpoint` writes, after every epoch
and within an epoch at the first step after every ``every_s`` seconds, one file (atomically,
:mod:`privlm.atomic`) holding everything the rest of the run reads: the trainable weights, the AdamW state,
the shuffling generator's and torch's global RNG states, the per-epoch history, the best epoch so far and
its weights, and within an epoch the epoch's example order, the next batch and the losses so far. A later
call with the same key continues from there and returns what the uninterrupted run returns (bitwise on the
same machine: the same tensors, the same random draws, whenever the saves fell). Only torch's CPU generator is
saved: a model on a GPU that uses dropout would resume with other dropout masks (the experiment runner loads
its models on the CPU). A file whose key differs is ignored and overwritten: the run starts from scratch.

The key binds a checkpoint to everything the run depends on: the caller's ``model_key`` (a fingerprint of
the model it fine-tunes, e.g. :func:`privlm.training.fingerprint.model_fingerprint`), the hyperparameters,
the training and validation rows in order, the template and the label words.

**A checkpoint is as private as its training rows**: its weights were fitted to them without noise, and its
key is a hash of them. Keep it beside the private data (the experiment runner puts it under the cell's
``work/`` folder and deletes it once the cell's row is written); never publish it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from privlm.atomic import atomic_path
from privlm.digest import digest
from privlm.lm.finetune_config import FinetuneConfig
from privlm.lm.scoring import Example


@dataclass(frozen=True)
class EpochCheckpoint:
    """Where a fine-tune keeps its state (``path``, one file), the fingerprint of the model it starts from
    (``model_key``) and how often it saves within an epoch (``every_s`` seconds; 0: after every step)."""

    path: Path
    model_key: str
    every_s: float = 600.0

    def numbered(self, index: int) -> EpochCheckpoint:
        """The checkpoint of the ``index``-th configuration of a grid (its own file beside this one)."""
        return replace(self, path=self.path.with_name(f"{self.path.stem}-{index}{self.path.suffix}"))

    def key(
        self,
        config: FinetuneConfig,
        train: list[Example],
        validation: list[Example],
        template: str,
        label_words: list[str],
    ) -> str:
        """The key a saved state must carry to be resumed (a hash of private rows: never publish it)."""
        return digest([self.model_key, asdict(config), train, validation, template, label_words])

    def load(self, key: str) -> dict[str, Any] | None:
        """The state saved under ``key``, or None (no file, or one saved for another run)."""
        if not self.path.exists():
            return None
        state = torch.load(self.path, weights_only=True)
        return state if state.get("key") == key else None

    def save(self, state: dict[str, Any]) -> None:
        """Write ``state`` (with its ``key``) atomically, replacing the previous one."""
        with atomic_path(self.path) as tmp:
            torch.save(state, tmp)
