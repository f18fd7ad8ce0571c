"""The DP optimizer: Gaussian noise once per logical step, then the wrapped optimizer's update.

At :meth:`DPOptimizer.step`, every trainable parameter's gradient is *replaced* by
(Σ_i c_i g_i + N(0, σ²C² I)) / (q·N): the clipped sum the clipper accumulated over all physical
micro-batches of the logical batch, plus noise drawn once, divided by the expected batch size. Whatever
``.grad`` held before (e.g. from a stray un-clipped ``loss.backward()``) is discarded, never released.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from privlm.dpsgd.clipping import PerSampleClipper


class DPOptimizer:
    """Wraps ``optimizer``; ``on_step`` is called after each noisy step (the engine's accountant)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        clipper: PerSampleClipper,
        *,
        noise_multiplier: float,
        expected_batch_size: float,
        generator: torch.Generator,
        on_step: Callable[[], None] | None = None,
    ) -> None:
        if noise_multiplier < 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
        if expected_batch_size <= 0:
            raise ValueError(f"expected_batch_size must be > 0, got {expected_batch_size}")
        self.optimizer = optimizer
        self.clipper = clipper
        self.noise_multiplier = float(noise_multiplier)
        self.expected_batch_size = float(expected_batch_size)
        self.generator = generator
        self.on_step = on_step

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
        """Start a logical batch: clear ``.grad`` and the clipper's accumulated clipped sums."""
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self.clipper.summed_grads = {}

    def privatize_grads(self) -> None:
        """Set every trainable parameter's ``.grad`` to (clipped sum + σC·N(0, I)) / expected batch size."""
        std = self.noise_multiplier * self.clipper.max_grad_norm
        with torch.profiler.record_function("privlm.noise"):
            self._add_noise(std)

    def _add_noise(self, std: float) -> None:
        for p, summed in self.clipper.pop_summed_grads().items():
            noise = torch.randn(p.shape, generator=self.generator, device=self.generator.device, dtype=summed.dtype)
            p.grad = summed.add_(noise.to(summed.device), alpha=std).div_(self.expected_batch_size)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One private step: noise, update, then accounting (even for an empty logical batch)."""
        if closure is not None:
            raise ValueError("closures are not supported: call model.clipped_backward(batch) before step()")
        self.privatize_grads()
        result = self.optimizer.step()
        if self.on_step is not None:
            self.on_step()
        return result
