"""The DP labeller: the K-way head-only classifier (the LM head's label-token rows) trained with DP-SGD on the
private examples' last hidden states, in GRADMM's matching layout (``prefix + text + suffix``,
:class:`~privlm.synthesis.gradmm.release.PrivateFactors`), so that it labels public candidates in that same layout
(:func:`~privlm.synthesis.gradmm.select.candidate_hidden`).

**Guarantee**: the trained rows are the DP-SGD run's (ε, δ)-DP release under add/remove-one adjacency (privlm's
engine and training loop: Poisson sampling, per-sample clipping, the PLD accountant, the write-ahead ledger,
checkpoints and exact resume, noise keys from the OS); whatever is computed from them and public inputs is
post-processing. The run's public settings (``run.json``: ε, δ, the recipe, the model's fingerprint and the
prompt) are checked on resume; a run whose rows are saved is reused, never retrained.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from privlm.atomic import atomic_path
from privlm.dpsgd.sampling import physical_batches
from privlm.errors import UserError
from privlm.privacy.ledger import Ledger
from privlm.runfolder import LEDGER, MANIFEST, check_or_write_settings, hold
from privlm.synthesis.gradmm.prompt import Prompt, head_weight
from privlm.synthesis.gradmm.release import PrivateFactors, head_fingerprint
from privlm.training.checkpoint import FINISHED, retire_checkpoints
from privlm.training.head import LabelWordHead, head_losses
from privlm.training.loop import TrainConfig, prepare, train_loop
from privlm.training.prefix_cache import cached_rows, collate_cached

ROWS = "labeller.pt"  # in the run folder: the trained K × d rows (the DP release)
OnProgress = Callable[[int, int, float | None, float | None], None]  # train_loop's on_progress(step, total, loss, ε)


@dataclass(frozen=True)
class LabellerConfig:
    """The DP-SGD recipe of the labeller: the head-only recipe of DP training directly on Rotten Tomatoes
    (``research/dp_finetune_rotten_tomatoes``: 40 epochs, expected batch 512, AdamW lr 0.01, clip 1), chosen there
    before this method existed and not tuned on its sets. All public."""

    epochs: float = 40.0
    batch_size: int = 512
    lr: float = 0.01
    max_grad_norm: float = 1.0
    norm_mode: str = "mixed"

    def train_config(self, epsilon: float, delta: float) -> TrainConfig:
        """The DP-SGD settings (validated by :class:`TrainConfig`); the noise keys come from the OS."""
        return TrainConfig(
            task="classify",
            head_only=True,
            epsilon=epsilon,
            delta=delta,
            batch_size=self.batch_size,
            epochs=self.epochs,
            lr=self.lr,
            max_grad_norm=self.max_grad_norm,
            norm_mode=self.norm_mode,
            checkpoint_every=50,
            log_every=10,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)

    @classmethod
    def split(cls, params: Mapping[str, Any]) -> tuple[LabellerConfig, dict[str, Any]]:
        """The recipe set by ``params`` (its fields; defaults for the rest) and the other parameters."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in names}), {
            k: v for k, v in params.items() if k not in names
        }


def train_labeller(
    model: PreTrainedModel,
    prompt: Prompt,
    load_factors: Callable[[], PrivateFactors],
    *,
    epsilon: float,
    delta: float,
    config: LabellerConfig,
    max_tokens: int,
    run_dir: Path,
    on_progress: OnProgress | None = None,
) -> tuple[torch.Tensor, Ledger]:
    """The label-token rows (K × d, float64) DP-SGD trained from the zero-shot rows on the private factors
    (``load_factors``, read only when the run has not finished; ``max_tokens``: the truncation they were computed
    with, part of the run's settings) and the run's ledger; trained in ``run_dir`` (resumed from its last
    checkpoint, locked while in use: another process waits) or reloaded from it. ``model`` is frozen in place (its
    gradients turned off): only the K label-token rows are trained, on the cached features."""
    if epsilon is None:
        raise UserError("the DP labeller needs an ε (it is a DP-SGD run)")
    run_dir.mkdir(parents=True, exist_ok=True)
    with hold(run_dir, wait=True):
        settings = {
            "epsilon": epsilon,
            "delta": delta,
            "labeller": config.to_dict(),
            "model_fingerprint": head_fingerprint(model),
            "prompt": prompt.to_dict(),
            "max_tokens": max_tokens,
        }
        check_or_write_settings(run_dir / MANIFEST, settings)
        saved = run_dir / ROWS
        if (run_dir / FINISHED).exists() and saved.exists():
            return torch.load(saved, weights_only=True), Ledger.load(run_dir / LEDGER)
        factors = load_factors()
        trained, _, _ = _fit(
            model,
            prompt,
            factors.hidden,
            factors.labels.tolist(),
            epsilon=epsilon,
            delta=delta,
            config=config,
            run_dir=run_dir,
            on_progress=on_progress,
        )
        with atomic_path(saved) as tmp:
            torch.save(trained, tmp)
        retire_checkpoints(run_dir)  # they hold the noise keys: never beside the release
        return trained, Ledger.load(run_dir / LEDGER)


def noise_labeller(
    model: PreTrainedModel,
    prompt: Prompt,
    size: int,
    *,
    epsilon: float,
    delta: float,
    config: LabellerConfig,
    on_progress: OnProgress | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The labeller's noise-only control: K × d rows (float64) and the run's public settings (``noise_multiplier``,
    ``clip``, ``steps``, ``examples``). It is the same DP-SGD run as :func:`train_labeller` (the recipe, the σ of
    (ε, δ), Poisson sampling over ``size`` examples, AdamW from the zero-shot rows) on ``size`` examples whose
    hidden states are zero. A zero hidden state gives logits 0 and a K-way loss gradient (p − y)·hᵀ = 0 in the
    label-token rows (they have no bias: :func:`~privlm.training.head.label_word_rows`), so every clipped
    per-sample gradient is zero and each step's noised gradient is the engine's Gaussian noise alone (the update
    is AdamW's, weight decay included: data-independent).

    It reads no private data but ``size``, the pool's length. **Assumption**: N is public, as in every DP-SGD
    run of privlm (the ledger's sampling rate q = B/N states it; ``docs/accounting.md``). Under that assumption it
    spends no privacy. It runs without a run folder (no ledger, no checkpoint): a grid composes every ledger it
    finds, and must not count this one."""
    width = head_weight(model).shape[1]
    rows, steps, sigma = _fit(
        model,
        prompt,
        torch.zeros(size, width),
        [0] * size,
        epsilon=epsilon,
        delta=delta,
        config=config,
        run_dir=None,
        on_progress=on_progress,
    )
    return rows, {"noise_multiplier": sigma, "clip": config.max_grad_norm, "steps": steps, "examples": size}


def _fit(
    model: PreTrainedModel,
    prompt: Prompt,
    hidden: torch.Tensor,
    labels: list[int],
    *,
    epsilon: float,
    delta: float,
    config: LabellerConfig,
    run_dir: Path | None,
    on_progress: OnProgress | None,
) -> tuple[torch.Tensor, int, float | None]:
    """The label-token rows (float64) DP-SGD trained by privlm's engine on cached hidden states ``hidden`` (N × d)
    with classes ``labels`` (resumed in ``run_dir``; without one, nothing is written), the steps taken and σ."""
    head = LabelWordHead(model, list(prompt.label_token_ids))
    rows = cached_rows(hidden.to(head.rows.weight.dtype), labels)
    run = prepare(
        head,
        rows,
        collate_cached,
        config.train_config(epsilon, delta),
        loss_fn=head_losses,
        micro_batches=physical_batches,
    )
    result = train_loop(run, run_dir, resume=run_dir is not None, on_progress=on_progress)
    return head.rows.weight.detach().to(torch.float64).clone(), result.steps, run.noise_multiplier
