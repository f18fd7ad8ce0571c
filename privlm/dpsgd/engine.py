"""``PrivacyEngine``: DP-SGD (with randomized clipping) for Hugging Face causal LMs in a few lines.

    engine = PrivacyEngine(norm_mode="hutchinson", probes=32)
    model, optimizer, loader = engine.make_private(
        model, optimizer, loader, noise_multiplier=1.0, max_grad_norm=1.0)
    for batch in loader:                    # Poisson-sampled logical batches (may be empty)
        optimizer.zero_grad()
        model.clipped_backward(batch)       # physical micro-batches, clipped sums accumulated
        optimizer.step()                    # noise once, / expected batch size, step is accounted
    engine.epsilon(delta=1e-5)

Each logical step is recorded in the accountant as a ``PoissonGaussianStep`` with the clipping kind of
the norm mode (``hutchinson``/``hutchpp`` for the randomized modes: randomized-clipping accounting).
Guarantee: (ε, δ)-DP under add/remove-one adjacency of *examples* (rows of the dataset), provided the
per-sample loss of an example depends on that example only and the loader is the Poisson loader
returned here (sampling rate q = loader batch size / dataset size).

With ``loss_release=LossRelease(bound, fraction)``, every step also releases a DP training loss
(``optimizer.released_loss``) through the same Gaussian mechanism as the gradient; the step is then
accounted at the effective noise multiplier σ/√(1+α²) (see :mod:`privlm.dpsgd.loss_release`), and a
target ε calibrates that effective multiplier (the noise drawn is σ = σ_eff·√(1+α²)). Without it,
nothing about the losses is released and the accounting is that of plain DP-SGD.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sized
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from privlm.dpsgd.clipping import ClipStats, LossFn, PerSampleClipper
from privlm.dpsgd.loss_release import LossRelease
from privlm.dpsgd.losses import Reduction, causal_lm_losses
from privlm.dpsgd.norms import NormMode
from privlm.dpsgd.optimizer import DPOptimizer
from privlm.dpsgd.sampling import MicroBatches, batch_size, physical_batches, poisson_loader, take_rows
from privlm.dpsgd.sharding import passes_behind
from privlm.errors import UserError
from privlm.norm_modes import check_probes
from privlm.norm_modes import norm_mode as norm_mode_spec
from privlm.privacy import PoissonGaussianStep, PrivacyAccountant, calibrate_noise_multiplier
from privlm.privacy.accountant import Method
from privlm.privacy.events import Clipping
from privlm.randomness import RunStreams


class PrivateModel(nn.Module):
    """The user's model (``.module``; ``forward`` unchanged) plus :meth:`clipped_backward`; ``micro_batches``
    cuts a logical batch into micro-batches of at most ``max_physical_batch_size`` rows (default: consecutive
    rows, :func:`~privlm.dpsgd.sampling.physical_batches`)."""

    def __init__(
        self,
        module: nn.Module,
        clipper: PerSampleClipper,
        max_physical_batch_size: int | None,
        micro_batches: MicroBatches = physical_batches,
    ) -> None:
        super().__init__()
        self.module = module
        self.clipper = clipper
        self.max_physical_batch_size = max_physical_batch_size
        self.micro_batches = micro_batches

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def clipped_backward(self, batch: Any) -> ClipStats:
        """Clip the per-sample gradients of a logical ``batch`` (split into physical micro-batches) and
        accumulate their sum for the next ``optimizer.step()``. Returns the stats of all its samples, in the
        order the micro-batches hold them.

        On an FSDP2-sharded model every rank must call it at every step, with its share of the batch (possibly
        empty): a rank with fewer micro-batches than another runs passes on zero rows, which add nothing."""
        micro = list(self.micro_batches(batch, self.max_physical_batch_size))
        if sum(batch_size(b) for b in micro) != batch_size(batch):  # a repeated row would count twice
            raise ValueError("the micro-batches must hold every row of the logical batch exactly once")
        # FSDP2 gathers inside every pass: all ranks agree on the count first, then run as many passes
        behind = passes_behind(self.clipper.params, len(micro)) if self.clipper.sharded else 0
        parts = [self.clipper.clipped_backward(b) for b in micro]
        for _ in range(behind):
            self.clipper.idle_pass(take_rows(batch, 0, 0))
        if not parts:
            empty = torch.zeros(0)
            return ClipStats(empty, empty, empty)
        return ClipStats(*(torch.cat([getattr(p, f) for p in parts]) for f in ("losses", "sq_norms", "factors")))


class PrivacyEngine:
    """DP-SGD with per-sample norms in ``norm_mode`` (exact, ghost, mixed, hutchinson, hutchpp).

    ``probes``: k for ``hutchinson`` (default 32), m for ``hutchpp``. ``bookkeeping``: clipped sum from
    stored activations/backprops (no second backward; the default). Assumption of the second-backward
    path (``bookkeeping=False``): every use of a trainable parameter goes through a hooked module call;
    a weight also used functionally (e.g. ``F.linear(x, layer.weight)``) would enter the clipped sum
    without entering the norm, so its per-sample contribution could exceed C (the first micro-batch is
    checked and such a parameter refused by name; a use that only some inputs trigger would not be seen).
    Book-keeping releases only the hooked uses, so it stays within C. ``accountant``: ``"pld"`` or ``"rdp"``.
    Randomness (:mod:`privlm.randomness`): ``streams`` gives the sampler, probe and noise keys (a
    distributed run broadcasts rank 0's); otherwise ``seed=None`` draws three independent keys from the
    OS, and an integer ``seed`` derives them from it — reproducible, and then not a private release
    (:attr:`private_release` is False)."""

    def __init__(
        self,
        norm_mode: NormMode = "mixed",
        probes: int = 32,
        bookkeeping: bool = True,
        accountant: Method = "pld",
        seed: int | None = None,
        streams: RunStreams | None = None,
    ) -> None:
        self._mode = norm_mode_spec(norm_mode)
        check_probes(norm_mode, probes)
        self.norm_mode = norm_mode
        self.probes = probes
        self.bookkeeping = bookkeeping
        self.accountant_method = accountant
        self.accountant = PrivacyAccountant(method=accountant)
        if seed is not None and streams is not None:
            raise UserError("give a seed or the streams, not both")
        self.streams = streams if streams is not None else RunStreams.create(seed)
        self.steps = 0
        self._event: PoissonGaussianStep | None = None
        self._made = False

    @property
    def clipping_kind(self) -> Clipping:
        """The accountant's clipping kind for this norm mode."""
        return self._mode.clipping

    @property
    def private_release(self) -> bool:
        """False when the randomness is reproducible from a seed: then nothing this engine trains is a
        private release, whatever ε says."""
        return self.streams.private

    @property
    def _event_probes(self) -> int | None:
        return self.probes if self.clipping_kind != "exact" else None

    def make_private(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        data_loader: DataLoader[Any],
        *,
        max_grad_norm: float,
        noise_multiplier: float | None = None,
        target_epsilon: float | None = None,
        delta: float | None = None,
        epochs: float | None = None,
        max_physical_batch_size: int | None = None,
        loss_fn: LossFn | None = None,
        loss_reduction: Reduction = "sum",
        loss_release: LossRelease | None = None,
        micro_batches: MicroBatches = physical_batches,
    ) -> tuple[PrivateModel, DPOptimizer, DataLoader[Any]]:
        """Wrap model, optimizer and loader for DP-SGD.

        Sampling rate q = ``data_loader.batch_size / len(dataset)``; the returned loader yields ⌈1/q⌉
        Poisson batches per pass (one epoch in expectation). Give ``noise_multiplier``, or
        ``target_epsilon`` with ``delta`` and ``epochs`` to calibrate it. ``loss_fn(model, batch)`` returns
        per-sample losses (default: token-level causal-LM loss with ``loss_reduction`` sum or mean).
        ``loss_release``: also release a DP loss per step (accounted; σ given is the noise actually drawn).

        Args:
            module: the model; its trainable parameters in hooked layers (:mod:`privlm.dpsgd.norms`) are trained.
            optimizer: any torch optimizer over those parameters (wrapped: noise is added before its step).
            data_loader: gives q = ``batch_size / len(dataset)``; its dataset and collate function are reused.
            max_grad_norm: the clipping norm C (> 0).
            noise_multiplier: σ (noise std = σ·C); or None with ``target_epsilon``.
            target_epsilon: the ε to reach after ``epochs``; σ is the smallest that does (with ``delta``).
            delta: δ of the target.
            epochs: planned passes (T = ⌈epochs / q⌉ steps) for the calibration.
            max_physical_batch_size: micro-batch cap (memory only; the logical batch is unchanged).
            loss_fn: ``loss_fn(model, batch) -> (B,)`` per-sample losses, each a function of its own example only.
            loss_reduction: ``"sum"`` or ``"mean"`` over tokens of the default causal-LM loss.
            loss_release: the DP loss release, or None.
            micro_batches: how a logical batch is cut into micro-batches (memory and speed only: any cut that
                holds every row once gives the same clipped sum), e.g. rows sorted by length and each
                micro-batch cut to its longest row (:func:`privlm.training.top_blocks.length_sorted_batches`).
                The guarantee assumes every row once, each in its own values: the row count is checked per
                step, a cut that repeated one row and dropped another is not caught.

        Returns:
            ``(private_model, dp_optimizer, poisson_loader)``: call ``private_model.clipped_backward(batch)``
            then ``dp_optimizer.step()`` per batch of the loader; each step is accounted (:meth:`epsilon`).

        Raises:
            UserError: a second call on one engine, both or neither of σ and ε, a bad C, reduction or
                micro-batch size, an unsized or empty data set, or a target ε without δ and epochs."""
        if self._made:
            raise UserError("this PrivacyEngine already made a model private; use one engine per training run")
        if (noise_multiplier is None) == (target_epsilon is None):
            raise UserError("give exactly one of noise_multiplier and target_epsilon")
        if not max_grad_norm > 0:
            raise UserError(f"max_grad_norm must be > 0, got {max_grad_norm!r}")
        if loss_reduction not in ("sum", "mean"):
            raise UserError(f"loss_reduction must be 'sum' or 'mean', got {loss_reduction!r}")
        if max_physical_batch_size is not None and max_physical_batch_size < 1:
            raise UserError(f"max_physical_batch_size must be >= 1, got {max_physical_batch_size!r}")
        dataset = data_loader.dataset
        if not isinstance(dataset, Sized):
            raise UserError("the data loader's dataset needs a length (q = batch_size / len(dataset))")
        if data_loader.batch_size is None or len(dataset) == 0:
            raise UserError(
                "the data loader needs a batch_size and a non-empty dataset (q = batch_size / len(dataset))"
            )
        sample_rate = min(1.0, data_loader.batch_size / len(dataset))
        steps_per_epoch = math.ceil(1 / sample_rate)
        snapped = 0 if loss_release is None else 1  # the DP loss is snapped; the gradient is not released itself
        if target_epsilon is not None:
            effective = self._calibrate(target_epsilon, delta, epochs, sample_rate, steps_per_epoch, snapped)
            noise_multiplier = effective if loss_release is None else loss_release.noise_multiplier(effective)
        elif noise_multiplier is not None:
            effective = (
                noise_multiplier if loss_release is None else loss_release.effective_multiplier(noise_multiplier)
            )
        else:  # excluded by the first check; narrows noise_multiplier to a float
            raise UserError("give exactly one of noise_multiplier and target_epsilon")
        self._made = True
        if effective > 0:  # σ = 0: clipping without noise, NOT private; nothing to account (ε = ∞)
            self._event = PoissonGaussianStep(
                sample_rate=sample_rate,
                noise_multiplier=effective,
                clipping=self.clipping_kind,
                probes=self._event_probes,
                snapped=snapped,
            )
        clipper = PerSampleClipper(
            module,
            loss_fn or functools.partial(causal_lm_losses, reduction=loss_reduction),
            max_grad_norm=max_grad_norm,
            norm_mode=self.norm_mode,
            probes=self.probes,
            bookkeeping=self.bookkeeping,
            randomness=self.streams.probes,
            loss_bound=None if loss_release is None else loss_release.bound,
        )
        dp_optimizer = DPOptimizer(
            optimizer,
            clipper,
            noise_multiplier=noise_multiplier,
            expected_batch_size=sample_rate * len(dataset),
            randomness=self.streams.noise,
            on_step=self._record_step if self._event is not None else None,
            loss_release=loss_release,
        )
        loader = poisson_loader(
            dataset,
            sample_rate,
            steps_per_epoch,
            self.streams.sampler,
            collate_fn=data_loader.collate_fn,
            num_workers=data_loader.num_workers,
        )
        return PrivateModel(module, clipper, max_physical_batch_size, micro_batches), dp_optimizer, loader

    def _calibrate(
        self,
        target_epsilon: float,
        delta: float | None,
        epochs: float | None,
        sample_rate: float,
        steps_per_epoch: int,
        snapped: int,
    ) -> float:
        if delta is None or epochs is None:
            raise UserError("target_epsilon needs delta and epochs")
        return calibrate_noise_multiplier(
            target_epsilon,
            delta,
            sample_rate=sample_rate,
            steps=math.ceil(epochs * steps_per_epoch),
            clipping=self.clipping_kind,
            probes=self._event_probes,
            method=self.accountant_method,
            snapped=snapped,
        )

    @property
    def event(self) -> PoissonGaussianStep | None:
        """What each step is accounted as (None before :meth:`make_private`, and for σ = 0: no noise, NOT
        private); its noise multiplier is the effective one, σ/√(1+α²) with a loss release."""
        return self._event

    def _record_step(self) -> None:
        if self._event is None:  # on_step is only wired up by make_private, after the event is set
            raise RuntimeError("a DP-SGD step was taken before make_private described it")
        self.accountant.record(self._event)
        self.steps += 1

    def epsilon(self, delta: float) -> float:
        """ε of all steps taken so far at ``delta`` (0 before the first step; ∞ without noise, σ = 0)."""
        return math.inf if self._made and self._event is None else self.accountant.epsilon(delta)
