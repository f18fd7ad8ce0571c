"""``transformers.Trainer`` integration: swap ``Trainer`` for :class:`PrivateTrainer` and pass ``privacy=``.

    from privlm.training.trainer import PrivacyArguments, PrivateTrainer      # added line 1
    trainer = PrivateTrainer(                                                  # was: Trainer(
        model=model, args=args, train_dataset=train, data_collator=collate,
        privacy=PrivacyArguments(epsilon=3.0, delta=1e-5),              # added line 2
    )
    trainer.train()
    trainer.epsilon()                                                          # ε spent so far

What changes inside the Trainer: the training data loader is the DP-SGD engine's Poisson loader
(rate q = ``per_device_train_batch_size`` / N, ⌈1/q⌉ steps per epoch, batches of varying size); each
training step clips per-sample gradients (:meth:`PrivateModel.clipped_backward`) instead of
``loss.backward()``; the optimizer is the engine's :class:`DPOptimizer` (noise once per step, then the
Trainer's own optimizer, learning-rate schedule and logging); the Trainer's global-norm clipping is
switched off (per-sample clipping replaces it). σ is calibrated from ``epsilon`` for the steps
the Trainer will take, and training stops before a step that would exceed the budget.

Logs: the Trainer's plain ``loss`` / ``train_loss`` (statistics of the private batches) are removed;
``dp_loss`` — the mean, over the steps since the last log, of the DP losses released with each step
(:mod:`privlm.dpsgd.loss_release`, accounted with the gradient) — and ``epsilon`` are added.
``train()``'s ``training_loss`` is the mean released DP loss of the run (NaN with
``loss_noise_fraction=0``, which releases and logs no loss at all).

Ledger: ``OUTPUT_DIR/privacy.json`` accounts for every step taken, written (durably) before each log
line and each checkpoint or saved model that those steps produced; it says ``"private_release": false``
when ``PrivacyArguments.seed`` made the noise reproducible. The Trainer's own per-batch statistics of
the private data are kept out: ``total_flos`` stays 0 (it would count the tokens of the secret Poisson
batches) and ``include_num_input_tokens_seen`` is refused.

Not supported (refused with :class:`UserError`): gradient accumulation (make the batch size the
logical batch and use ``physical_batch_size`` for memory), several processes (use ``privlm train`` or
:mod:`privlm.training.loop` under ``torchrun``), and ``resume_from_checkpoint`` (the Trainer's
checkpoints do not hold the noise RNG and the ledger; use ``privlm train --resume``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import TrainOutput

from privlm.dpsgd.clipping import LossFn
from privlm.dpsgd.engine import PrivacyEngine, PrivateModel
from privlm.dpsgd.settings import DPSGDSettings
from privlm.errors import UserError
from privlm.privacy import Ledger
from privlm.privacy.ledger import new_run_id
from privlm.training.loop import steps_within_budget


@dataclass(frozen=True, kw_only=True)
class PrivacyArguments(DPSGDSettings):
    """DP-SGD settings of a :class:`PrivateTrainer`: the shared
    :class:`~privlm.dpsgd.settings.DPSGDSettings` (give ``epsilon`` — σ calibrated — or
    ``noise_multiplier``; with both, training stops when the budget is spent), plus the per-example
    ``loss_fn`` (default: the causal-LM token loss) and its ``loss_reduction`` over tokens."""

    loss_fn: LossFn | None = None
    loss_reduction: str = "mean"


def _mean(values: list[float]) -> float | None:
    """Mean of released DP losses (post-processing); None when none was released."""
    return sum(values) / len(values) if values else None


class _BudgetCallback(TrainerCallback):
    """Collects each step's released DP loss; stops training when the next step would exceed the budget."""

    def __init__(self, trainer: PrivateTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        released = getattr(self.trainer.optimizer, "released_loss", None)
        if released is not None:
            self.trainer.released_losses.append(released)
        if self.trainer.engine is not None and self.trainer.engine.steps >= self.trainer.budget_steps:
            control.should_training_stop = True
        return control


class PrivateTrainer(Trainer):
    """A ``transformers.Trainer`` that trains with DP-SGD (see the module docstring).

    Args:
        *args, **kwargs: as for ``transformers.Trainer`` (model, ``TrainingArguments``, train data set,
            data collator, ...); ``per_device_train_batch_size`` is the expected Poisson batch size.
        privacy: the DP-SGD settings (:class:`PrivacyArguments`).

    Raises:
        UserError: gradient accumulation, several processes or GPUs, or a logged token count (each
            would break the accounting or leak batch sizes); at :meth:`train`, a bad loss release, a
            Trainer checkpoint to resume, or an output folder that already holds a ledger.
    """

    def __init__(self, *args: Any, privacy: PrivacyArguments, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.args.gradient_accumulation_steps != 1:
            raise UserError("PrivateTrainer needs gradient_accumulation_steps=1 (the batch size is the logical batch)")
        if self.args.world_size > 1 or self.args.n_gpu > 1:
            raise UserError("PrivateTrainer runs on one process; for several use `privlm train` under torchrun")
        if getattr(self.args, "include_num_input_tokens_seen", "no") not in (False, "no", None):
            raise UserError(
                "include_num_input_tokens_seen would log the token count of the private batches; switch it off"
            )
        self.privacy = privacy
        self.args.max_grad_norm = 0.0
        self.engine: PrivacyEngine | None = None
        self.private_model: PrivateModel | None = None
        self.budget_steps = 0
        self.released_losses: list[float] = []  # every step's released DP loss
        self._logged_upto = 0
        self.ledger: Ledger | None = None
        self.add_callback(_BudgetCallback(self))

    def train(self, resume_from_checkpoint: Any = None, **kwargs: Any) -> Any:
        """``Trainer.train``; ``resume_from_checkpoint`` is refused (see the module docstring). The
        returned ``training_loss`` is the mean released DP loss (NaN when none is released)."""
        if resume_from_checkpoint:
            raise UserError("PrivateTrainer cannot resume a Trainer checkpoint; use `privlm train --resume`")
        self.privacy.loss_release()  # refuse a bad loss release before any training
        if (Path(self.args.output_dir) / "privacy.json").exists():
            raise UserError(
                f"{self.args.output_dir} already holds a privacy ledger (another run); choose a new output_dir"
            )
        output = super().train(**kwargs)
        dp_loss = _mean(self.released_losses)
        metrics = {k: v for k, v in output.metrics.items() if k != "train_loss"}
        if dp_loss is not None:
            metrics["train_dp_loss"] = dp_loss
        return TrainOutput(output.global_step, float("nan") if dp_loss is None else dp_loss, metrics)

    def get_train_dataloader(self) -> DataLoader:
        """The engine's Poisson loader; makes model and optimizer private on first use."""
        if self.engine is None:
            self._make_private()
        return self._private_loader

    def _make_private(self) -> None:
        p = self.privacy
        loader = DataLoader(self.train_dataset, batch_size=self._train_batch_size, collate_fn=self.data_collator)
        steps_per_epoch = math.ceil(len(self.train_dataset) / min(self._train_batch_size, len(self.train_dataset)))
        epochs = self.args.max_steps / steps_per_epoch if self.args.max_steps > 0 else self.args.num_train_epochs
        self.create_optimizer()
        self.engine = p.privacy_engine()
        self.private_model, self.optimizer, self._private_loader = p.make_private(
            self.engine,
            self.model,
            self.optimizer,
            loader,
            epochs=epochs,
            loss_fn=p.loss_fn,
            loss_reduction=p.loss_reduction,
        )
        sampler = self._private_loader.batch_sampler
        planned = math.ceil(epochs * len(sampler)) if self.args.max_steps <= 0 else self.args.max_steps
        self.budget_steps = planned
        if p.noise_multiplier is not None and p.epsilon is not None:
            self.budget_steps = steps_within_budget(self.engine.event, p.epsilon, p.delta, planned, p.accountant)

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """The Trainer's schedule, on the optimizer inside the DP wrapper (its learning rates)."""
        inner = self.optimizer.optimizer if self.engine is not None and optimizer is None else optimizer
        return super().create_scheduler(num_training_steps, inner)

    def training_step(self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        """Clip this logical batch's per-sample gradients (summed for the optimizer's noisy step).
        Returns 0: the plain loss of the private batch never reaches the Trainer's logs (the DP loss
        is released by the optimizer's step and logged by :meth:`log`)."""
        model.train()
        inputs = self._prepare_inputs(inputs)
        self.private_model.clipped_backward(inputs)
        return torch.zeros((), device=self.args.device)

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """The Trainer's logs without its plain ``loss``/``train_loss``, plus ``dp_loss`` (mean released
        DP loss of the steps since the last log) and ε spent so far."""
        logs = {k: v for k, v in logs.items() if k not in ("loss", "train_loss")}
        if "train_runtime" in logs:  # the end-of-training summary: the whole run
            run_mean = _mean(self.released_losses)
            if run_mean is not None:
                logs["train_dp_loss"] = run_mean
        elif (window_mean := _mean(self.released_losses[self._logged_upto :])) is not None:
            logs["dp_loss"] = window_mean
            self._logged_upto = len(self.released_losses)
        if self.engine is not None:
            logs = {**logs, "epsilon": round(self.epsilon(), 4)}
            self.write_ledger()
        super().log(logs, *args, **kwargs)

    def write_ledger(self) -> None:
        """Make ``OUTPUT_DIR/privacy.json`` account for every step taken so far (write-ahead: called before
        anything those steps produced is logged or saved)."""
        if self.engine is None:
            return
        if self.ledger is None:
            self.ledger = Ledger(private_release=self.engine.private_release, run=new_run_id())
        first, last = self.ledger.count + 1, self.engine.steps
        if last < first:
            return
        self.ledger.record(self.engine.event, last - first + 1, f"steps {first}-{last}")
        Path(self.args.output_dir).mkdir(parents=True, exist_ok=True)
        self.ledger.save(Path(self.args.output_dir) / "privacy.json")

    def _save_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        self.write_ledger()
        return super()._save_checkpoint(*args, **kwargs)

    def save_model(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.save_model`` after the ledger covers every step taken."""
        self.write_ledger()
        return super().save_model(*args, **kwargs)

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """0: the Trainer's FLOP count is a function of the private batches' token counts."""
        return 0

    def epsilon(self, delta: float | None = None) -> float:
        """ε spent so far at ``delta`` (default: the privacy arguments' δ)."""
        if self.engine is None:
            return 0.0
        return self.engine.epsilon(self.privacy.delta if delta is None else delta)
