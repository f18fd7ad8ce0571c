"""The DP optimizer: Gaussian noise once per logical step, then the wrapped optimizer's update.

At :meth:`DPOptimizer.step`, every trainable parameter's gradient is *replaced* by
(Σ_i c_i g_i + N(0, σ²C² I)) / (q·N): the clipped sum the clipper accumulated over all physical
micro-batches of the logical batch, plus noise drawn once, divided by the expected batch size. Whatever
``.grad`` held before (e.g. from a stray un-clipped ``loss.backward()``) is discarded, never released.

With a :class:`~privlm.dpsgd.loss_release.LossRelease`, the same step also releases a DP training loss
:attr:`DPOptimizer.released_loss` = snap(Σ_i clamp(ℓ_i, 0, L) + N(0, σ²L²/α²)) / (q·N) (snapped to a grid of
≈ 1/256 of its noise std, :mod:`privlm.privacy.snapping`, so its low-order bits say nothing): the loss coordinate of
the joint Gaussian mechanism described there. The engine accounts the step at σ/√(1+α²); a
``DPOptimizer`` built by hand must be accounted that way too.

Noise comes from a :class:`~privlm.randomness.SecureRandom` stream (its own OS key): step t's noise for
trainable parameter j is :meth:`~privlm.randomness.SecureRandom.gradient_noise` at (t, j) — blocks of
2²⁰ elements, block b the draw at (t, j, b), so a parameter up to that size is the draw at (t, j) itself —
and the loss noise the draw at (t, J) with J the number of trainable parameters; float64 Box–Muller from
53-bit uniforms, scaled by σC and cast to the gradient's dtype. On an FSDP2-sharded model each rank draws
only its shard's rows of that noise (:mod:`privlm.dpsgd.sharding`). Draws are addressed, not sequential,
so a resumed run or every rank of a distributed one draws exactly the same noise for a step, and no other
draw can shift it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from privlm.dpsgd.clipping import PerSampleClipper
from privlm.dpsgd.loss_release import LossRelease
from privlm.dpsgd.sharding import as_grad, noise_rows, reduce_to_shards
from privlm.privacy.snapping import snap
from privlm.privacy.validation import check_noise_multiplier_for_sampler
from privlm.randomness import SecureRandom


class DPOptimizer:
    """Wraps ``optimizer``; ``on_step`` is called after each noisy step (the engine's accountant).
    ``randomness``: the noise stream (module docstring). ``steps``: noisy steps taken so far (a resumed
    run sets it). ``loss_release``: also release a DP loss per step (needs ``clipper.loss_bound ==
    loss_release.bound``)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        clipper: PerSampleClipper,
        *,
        noise_multiplier: float,
        expected_batch_size: float,
        randomness: SecureRandom,
        on_step: Callable[[], None] | None = None,
        loss_release: LossRelease | None = None,
    ) -> None:
        if noise_multiplier < 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
        check_noise_multiplier_for_sampler(noise_multiplier)
        if expected_batch_size <= 0:
            raise ValueError(f"expected_batch_size must be > 0, got {expected_batch_size}")
        self.optimizer = optimizer
        self.clipper = clipper
        self.noise_multiplier = float(noise_multiplier)
        self.expected_batch_size = float(expected_batch_size)
        self.randomness = randomness
        self.steps = 0
        clipper.begin_step(1)
        if loss_release is not None and clipper.loss_bound != loss_release.bound:
            raise ValueError(
                f"the clipper's loss bound {clipper.loss_bound} differs from the release's {loss_release.bound}"
            )
        self.on_step = on_step
        self.loss_release = loss_release
        self.released_loss: float | None = None

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Start logical step ``steps + 1``: clear ``.grad`` and the clipper's accumulated clipped sums,
        and select the step's probes (:meth:`step` selects them too, and a resumed run that sets
        :attr:`steps` gets them here)."""
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self.clipper.begin_step(self.steps + 1)
        self.clipper.summed_grads = {}
        self.clipper.pop_summed_loss()
        self.released_loss = None

    def privatize_grads(self) -> None:
        """Set every trainable parameter's ``.grad`` to (clipped sum + σC·N(0, I)) / expected batch size
        and, with a loss release, :attr:`released_loss` to (clamped loss sum + N(0, σ²L²/α²)) / q·N."""
        std = self.noise_multiplier * self.clipper.max_grad_norm
        sums, loss_sum = self.clipper.pop_summed_grads(), self.clipper.pop_summed_loss()
        if self.clipper.sharded:  # FSDP2: sum over ranks, keep this rank's rows (privlm.dpsgd.sharding)
            sums, loss_sum = reduce_to_shards(sums, loss_sum)
        with torch.profiler.record_function("privlm.noise"):
            self._add_noise(sums, std)
            self.released_loss = self._release_loss(loss_sum)

    def _release_loss(self, summed_loss: torch.Tensor) -> float | None:
        summed = float(summed_loss)
        if self.loss_release is None:
            return None
        address = (self.steps + 1, len(self.clipper.params))
        std = self.loss_release.loss_noise_std(self.noise_multiplier)
        noisy = torch.tensor(summed, dtype=torch.float64) + self.randomness.normal(
            (), address, std=std, dtype=torch.float64
        )
        return float(snap(noisy, std) if std > 0 else noisy) / self.expected_batch_size  # std 0: noise off

    def _add_noise(self, sums: dict[torch.nn.Parameter, torch.Tensor], std: float) -> None:
        for j, (p, summed) in enumerate(sums.items()):
            noise = self.randomness.gradient_noise(
                p.shape, (self.steps + 1, j), rows=noise_rows(p), std=std, dtype=summed.dtype, device=summed.device
            )
            local = summed.add_(noise).div_(self.expected_batch_size).to(p.dtype)  # noise added in ≥ float32
            p.grad = as_grad(p, local)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One private step: noise, update, then accounting (even for an empty logical batch); sets
        :attr:`released_loss` (None without a loss release)."""
        if closure is not None:
            raise ValueError("closures are not supported: call model.clipped_backward(batch) before step()")
        self.privatize_grads()
        result = self.optimizer.step()
        self.steps += 1
        self.clipper.begin_step(self.steps + 1)  # also for loops that never call zero_grad (HF Trainer)
        if self.on_step is not None:
            self.on_step()
        return result
