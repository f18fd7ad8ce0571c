"""One private training run for an audit: a data set of canaries (and, optionally, ordinary examples)
through the real :class:`~privlm.dpsgd.engine.PrivacyEngine` (Poisson sampling, per-sample clipping in
the chosen norm mode, micro-batches, noise, accounting), with plain SGD at learning rate 1 so that the
final weights are the initial weights minus the sum of the noisy steps.

Audit runs are seeded (``PrivacyEngine(seed=...)``): reproducible, and therefore *not* private releases;
they measure the mechanism, they do not protect anyone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from privlm.audit.scale import Scale
from privlm.dpsgd.loss_release import LossRelease
from privlm.dpsgd.sampling import poisson_loader
from privlm.dpsgd.settings import DPSGDSettings
from privlm.errors import UserError


@dataclass(frozen=True)
class PrivateRun:
    """What an audit needs from the run: the trained model, the accounted ε (what the engine's
    accountant says after every step taken), the noise multiplier drawn, the sampling rate and steps."""

    model: nn.Module
    accounted_epsilon: float
    noise_multiplier: float
    sample_rate: float
    steps: int


@dataclass(frozen=True, kw_only=True)
class RunSettings(DPSGDSettings):
    """The public settings of the audited run: the shared DP-SGD settings plus the Poisson
    ``sample_rate`` and the number of ``steps``. σ is calibrated to ``epsilon`` unless
    ``noise_multiplier`` is given (then the claim is whatever the accountant makes of that σ). Audit runs
    are seeded (default seed 0) and release no loss unless ``loss_noise_fraction`` > 0."""

    sample_rate: float
    steps: int
    seed: int | None = 0
    loss_noise_fraction: float = 0.0


def cell_settings(
    mode: str, epsilon: float, scale: Scale, delta: float, seed: int, loss_release: LossRelease | None = None
) -> RunSettings:
    """The :class:`RunSettings` of a DP-SGD audit cell: norm ``mode``, target ε, and the DP-SGD fields of ``scale``."""
    loss = (
        {} if loss_release is None else {"loss_bound": loss_release.bound, "loss_noise_fraction": loss_release.fraction}
    )
    return RunSettings(
        norm_mode=mode,
        epsilon=epsilon,
        delta=delta,
        sample_rate=scale.sample_rate,
        steps=scale.steps,
        probes=scale.probes,
        physical_batch_size=scale.physical_batch_size,
        seed=seed,
        **loss,
    )


def null_mask(seq_len: int) -> torch.Tensor:
    """The attention mask of a null row: its first token only, so the row has no target (loss 0, zero
    gradient) yet is never all-masked; a canary slot left out keeps N, hence q, independent of the bits."""
    mask = torch.zeros(seq_len, dtype=torch.long)
    mask[0] = 1
    return mask


def train_private(
    model: nn.Module,
    examples: Sequence[Any],
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    settings: RunSettings,
) -> PrivateRun:
    """DP-SGD (SGD, lr 1) over ``examples`` for ``settings.steps`` Poisson-sampled steps at the rate
    ``settings.sample_rate`` (rounded to a whole expected batch), σ calibrated to the target ε (or given)."""
    if not examples:
        raise UserError("an audit run needs at least one example")
    if not 0 < settings.sample_rate <= 1:
        raise UserError(f"sample rate must be in (0, 1], got {settings.sample_rate}")
    batch_size = max(1, round(settings.sample_rate * len(examples)))
    loader = DataLoader(list(examples), batch_size=batch_size)
    steps_per_epoch = math.ceil(len(examples) / batch_size)
    engine = settings.privacy_engine()
    sgd = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    private, optimizer, _ = settings.make_private(
        engine, model, sgd, loader, epochs=settings.steps / steps_per_epoch, loss_fn=loss_fn
    )
    # One Poisson sampler over all T steps (one pass), on the engine's sampler key.
    poisson = poisson_loader(list(examples), engine.event.sample_rate, settings.steps, engine.streams.sampler)
    try:
        for batch in poisson:
            optimizer.zero_grad()
            private.clipped_backward(batch)
            optimizer.step()
    finally:
        private.clipper.capture.remove()
    return PrivateRun(
        model=model,
        accounted_epsilon=engine.epsilon(settings.delta),
        noise_multiplier=optimizer.noise_multiplier,
        sample_rate=engine.event.sample_rate,
        steps=engine.steps,
    )
