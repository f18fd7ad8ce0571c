"""Per-sample clipping: norms (any mode), clip factors, and the clipped sum.

One call handles one physical micro-batch: forward with the layer hooks on, one backward that asks
autograd only for the gradients of the hooked layers' outputs (no weight gradients are formed),
per-sample squared norms n̂²_i summed over parameters, factors c_i = min(1, C / n̂_i), and the clipped
sum Σ_i c_i g_i, either by book-keeping (Σ_i c_i L_iᵀR_i from the stored factors, no second backward)
or by a second backward of Σ_i c_i ℓ_i. The clipped sum is accumulated in :attr:`summed_grads`
(never in ``.grad``) until the optimizer adds the noise. With a ``loss_bound`` L, the sum of the
clamped losses Σ_i clamp(ℓ_i, 0, L) is accumulated in :attr:`summed_loss` the same way, for the DP
loss release (:mod:`privlm.dpsgd.loss_release`).

Assumption behind the guarantee: the per-sample loss ℓ_i depends only on sample i (no batch
statistics, e.g. BatchNorm; dimension 0 of every hooked layer indexes samples). Then g_i computed
here is ∇ℓ_i and ‖c_i g_i‖ ≤ C whenever n̂_i is the exact norm; with a randomized mode ‖c_i g_i‖ ≤
C·n_i/n̂_i, which the randomized-clipping accountant covers. The second backward additionally assumes
that every use of a trainable parameter is a hooked layer call; the first micro-batch checks it and a
parameter used outside its layer (functionally) is refused. Book-keeping needs no such assumption.

Probes of the randomized modes, and why they keep the proof. For logical step t and trainable parameter
j, the probe matrix P_{t,j} is the draw at address (t, j) of the clipper's probe stream: *one* matrix
per parameter for the whole logical step, the same for every micro-batch and — with the same key,
broadcast from rank 0 — on every rank, drawn independently of the data. Given the probes of step t,
example i's clipped gradient c_i(P_t) g_i is a function of example i alone; so adding or removing one
example changes exactly one term of the step's clipped sum, by c(P_t)·g with norm ≤ C·max(1, n/n̂(P_t)),
whatever the batch composition, the micro-batch cut or the shard an example lands in. Over the draw of
P_t, n̂²/n² is distributed as Q_w = Σ_j w_j χ²_k/k for the added example's spectrum w, which is what the
randomized-clipping accountant's envelope dominates (:mod:`privlm.privacy.randomized`; the revealed-scale
analysis treats P_t as public). Probes drawn per micro-batch from one running stream would not do:
adding an example shifts later examples into other micro-batches and so changes *their* probes and
clip factors (a crafted ±e_i pair attack measured a true ε ≥ 13 against 5.5 accounted).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.profiler import record_function

from privlm.dpsgd.hooks import LayerCapture, trainable_parameters
from privlm.dpsgd.norms import Factor, sq_norms, weighted_sum
from privlm.dpsgd.sharding import check_sharding
from privlm.errors import UserError
from privlm.norm_modes import norm_mode as norm_mode_spec
from privlm.randomness import SecureRandom

LossFn = Callable[[nn.Module, Any], Tensor]


def clip_factors(sq_norms: Tensor, max_grad_norm: float) -> Tensor:
    """``c_i = min(1, C / n_i)`` from squared norms (B,); a zero norm gives 1, a non-finite one (a NaN or
    infinite per-sample gradient, an overflowed norm) gives 0: that example is left out of the clipped sum
    (the book-keeping sums exclude it exactly, :meth:`OuterFactor.weighted_sum`), which keeps the
    sensitivity at C; a NaN compared with C would otherwise have passed it unclipped."""
    norms = sq_norms.clamp(min=0).sqrt()
    factors = torch.where(norms > max_grad_norm, max_grad_norm / norms.clamp(min=1e-300), torch.ones_like(norms))
    return torch.where(torch.isfinite(sq_norms), factors, torch.zeros_like(norms))


@dataclass
class ClipStats:
    """What one micro-batch produced: per-sample losses, squared norms (estimated in randomized modes)
    and clip factors, all (B,) and detached. Plain statistics of private examples: never log them; the
    DP loss is ``DPOptimizer.released_loss``."""

    losses: Tensor
    sq_norms: Tensor
    factors: Tensor


def _filler_row(batch: Any) -> Any:
    """One row of ones with the structure of ``batch`` (a tensor or a mapping of them; rows on dimension 0)."""
    if isinstance(batch, Tensor):
        return torch.ones((1, *batch.shape[1:]), dtype=batch.dtype, device=batch.device)
    if isinstance(batch, dict):
        return {key: _filler_row(value) for key, value in batch.items()}
    raise UserError(
        f"an FSDP2 filler pass needs a tensor or a dict of tensors as the batch, got {type(batch).__name__}"
    )


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision parameters, else the parameter's dtype (float32 or float64)."""
    return torch.promote_types(dtype, torch.float32)


class PerSampleClipper:
    """Clips per-sample gradients of ``model``'s trainable parameters and accumulates their sum.

    ``loss_fn(model, batch)`` must return per-sample losses (B,). ``randomness`` is the probe stream of
    the randomized modes (default: a fresh OS key); :meth:`begin_step` selects the logical step whose
    probes every following micro-batch uses (module docstring). ``loss_bound``: accumulate the clamped
    loss sum for the DP loss release (None: losses are not accumulated)."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        *,
        max_grad_norm: float,
        norm_mode: str = "mixed",
        probes: int = 32,
        bookkeeping: bool = True,
        randomness: SecureRandom | None = None,
        loss_bound: float | None = None,
    ) -> None:
        norm_mode_spec(norm_mode)
        if max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        self.model = model
        self.loss_fn = loss_fn
        self.max_grad_norm = float(max_grad_norm)
        self.norm_mode = norm_mode
        self.probes = probes
        self.bookkeeping = bookkeeping
        self.randomness = randomness if randomness is not None else SecureRandom.from_os()
        self.capture = LayerCapture(model)
        self.params = trainable_parameters(model)
        self.sharded = check_sharding(self.params, bookkeeping)  # FSDP2 (privlm.dpsgd.sharding)
        self._index = {p: j for j, p in enumerate(self.params)}
        self.step = 0
        self.summed_grads: dict[nn.Parameter, Tensor] = {}
        self.loss_bound = loss_bound
        self.summed_loss = torch.zeros((), dtype=torch.float64)
        self._uses_checked = False

    def _forward_backward(
        self, batch: Any, keep_graph: bool
    ) -> tuple[Tensor, dict[nn.Parameter, list[Factor]], Tensor]:
        with self.capture.recording() as calls, record_function("privlm.forward"):
            losses = self.loss_fn(self.model, batch)
            recorded = list(calls)
        batch_size = losses.shape[0]
        for call in recorded:
            if call.output_batch != batch_size:
                raise UserError(
                    f"a {type(call.module).__name__} layer produced an output with batch dimension "
                    f"{call.output_batch} for a batch of {batch_size}: its per-sample gradients are not "
                    "separable (e.g. position ids shared across the batch; pass them per sample)"
                )
        edges = [c.output_edge for c in recorded]
        with record_function("privlm.backprops"):
            grads = torch.autograd.grad(losses.sum(), edges, retain_graph=keep_graph, allow_unused=True)
            factors = self.capture.factors(recorded, list(grads))
        return losses, factors, self.total_sq_norms(factors, losses.shape[0])

    def begin_step(self, step: int) -> None:
        """Use the probes of logical step ``step`` (≥ 1) for every micro-batch until the next call."""
        if step < 1 or step >= 2**32:
            raise ValueError(f"a step index is in [1, 2^32), got {step}")
        self.step = step

    def probe_matrix(self, param: nn.Parameter, columns: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """N(0, 1) probes (rows × ``columns``) of ``param`` for the current step: the draw at address
        (step, parameter index). Every micro-batch of the step redraws exactly the same matrix (the draw
        is a function of key and address), so none is kept alive between micro-batches."""
        if self.step < 1:
            raise RuntimeError("call begin_step(step) before estimating norms (DPOptimizer.zero_grad does)")
        address = (self.step, self._index[param])
        return self.randomness.normal((param.shape[0], columns), address, dtype=dtype, device=device)

    def total_sq_norms(self, factors: dict[nn.Parameter, list[Factor]], batch_size: int) -> Tensor:
        """n̂²_i = Σ over trainable parameters of their per-sample squared norms (B,), in the clipper's mode."""
        with record_function("privlm.norms"):
            parts = [
                sq_norms(f, self.norm_mode, self.probes, functools.partial(self.probe_matrix, p))
                for p, f in factors.items()
            ]
        return torch.stack(parts).sum(0) if parts else torch.zeros(batch_size)

    def sq_norms(self, batch: Any) -> Tensor:
        """Per-sample squared gradient norms (B,) in the clipper's mode (accumulates nothing)."""
        return self._forward_backward(batch, keep_graph=False)[2].detach()

    def idle_pass(self, batch: Any) -> None:
        """A forward and backward of one filler row shaped like ``batch``'s rows (every tensor entry 1: token
        id 1, mask 1, label 1), its result dropped — nothing is accumulated: on a sharded model it runs the
        collectives a real micro-batch runs, so that a rank with fewer micro-batches keeps step."""
        self._forward_backward(_filler_row(batch), keep_graph=False)

    def clipped_backward(self, batch: Any) -> ClipStats:
        """Add ``Σ_i c_i g_i`` over ``batch`` to :attr:`summed_grads` (and, with a loss bound L,
        ``Σ_i clamp(ℓ_i, 0, L)`` to :attr:`summed_loss`)."""
        if not self.bookkeeping and torch.is_autocast_enabled(self.params[0].device.type):
            raise UserError(  # its clipped sum would be the half-precision backward itself
                "the second-backward clipped sum under autocast would be computed in half precision, where one "
                "example's clipped gradient can exceed C; use book-keeping (the default) or float32"
            )
        losses, factors, total = self._forward_backward(batch, keep_graph=not self.bookkeeping)
        if not self.bookkeeping and not self._uses_checked:
            self._check_every_use_is_hooked(losses, factors)
        c = clip_factors(total.detach(), self.max_grad_norm)
        keep = None if bool((c != 0).all()) else c != 0  # c_i = 0 only for a non-finite norm; one check per micro-batch
        # torch types autograd.grad as tuple[Tensor, ...]; with allow_unused=True an entry may be None
        clipped: Sequence[Tensor | None]
        with record_function("privlm.clipped_sum"):
            if self.bookkeeping:  # masks (copies factors) only when a sample is left out
                clipped = [weighted_sum(factors[p], c, p.shape, keep) if p in factors else None for p in self.params]
            else:
                if keep is not None:  # 0 · NaN is NaN in the backward: the second backward cannot leave it out
                    raise UserError(
                        "a per-sample gradient is not finite (overflow?) and the second-backward clipped sum cannot "
                        "leave it out; lower the learning rate, use float32, or use book-keeping (the default)"
                    )
                clipped = torch.autograd.grad((losses * c).sum(), self.params, allow_unused=True)
            for p, g in zip(self.params, clipped):
                if g is not None:
                    g = g.detach().to(_accumulation_dtype(g.dtype))  # summed in at least float32
                    if p in self.summed_grads:
                        self.summed_grads[p].add_(g)
                    else:
                        self.summed_grads[p] = g
        if self.loss_bound is not None:
            bound = self.loss_bound  # a non-finite loss counts as L (+inf, nan) or 0 (-inf): sensitivity stays L
            clamped = torch.nan_to_num(losses.detach().double(), nan=bound, posinf=bound, neginf=0.0).clamp(0, bound)
            self.summed_loss = self.summed_loss + clamped.sum().cpu()
        return ClipStats(losses.detach(), total.detach(), c)

    def _check_every_use_is_hooked(self, losses: Tensor, factors: dict[nn.Parameter, list[Factor]]) -> None:
        """Best-effort check of the second backward's assumption, on the first micro-batch: for random
        signs w_i, ∇Σ w_i ℓ_i must equal Σ w_i (hooked per-sample factors) for every parameter. A use
        outside a hooked call (e.g. ``F.linear(x, layer.weight)``) would enter the second-backward clipped
        sum without entering the norms, so it is refused by name. Not seen: a use that only other inputs
        trigger, or one too small to stand out of the parameter dtype's rounding."""
        signs = torch.randint(0, 2, losses.shape, generator=torch.Generator().manual_seed(0)).to(losses) * 2 - 1
        full: Sequence[Tensor | None] = torch.autograd.grad(  # None for an unused parameter (allow_unused)
            (losses * signs).sum(), self.params, retain_graph=True, allow_unused=True
        )
        names = {p: name for name, p in self.model.named_parameters()}
        for p, g in zip(self.params, full):
            if g is None:
                continue
            hooked = weighted_sum(factors[p], signs.double(), p.shape) if p in factors else torch.zeros_like(g)
            scale = float(g.double().norm())
            gap = float((g.double() - hooked.double()).norm())
            if not math.isfinite(gap + scale):
                raise UserError(
                    "the first micro-batch has a non-finite per-sample gradient, so the check that every "
                    "use of a parameter is hooked cannot run; use book-keeping (the default) or float32"
                )
            rtol = max(1e-3, 8 * torch.finfo(p.dtype).eps)  # measured bf16 rounding: ≤ 9e-3 (tiny GPT-2)
            if gap > rtol * scale + 1e-12:
                raise UserError(
                    f"trainable parameter {names[p]} ({p.dtype}) has a gradient the hooked layer calls do not "
                    "explain (the sizes are private-data statistics: not shown): it is used outside its layer's forward call "
                    "(e.g. F.linear(x, layer.weight)), and a second backward would release that use unclipped; "
                    "use book-keeping (the default) or route every use through the layer"
                )
        self._uses_checked = True

    def pop_summed_grads(self) -> dict[nn.Parameter, Tensor]:
        """The accumulated clipped sums, in at least float32 (zeros for parameters no sample touched); resets
        the accumulator."""
        out = {
            p: self.summed_grads.get(p, torch.zeros(p.shape, dtype=_accumulation_dtype(p.dtype), device=p.device))
            for p in self.params
        }
        self.summed_grads = {}
        return out

    def pop_summed_loss(self) -> Tensor:
        """The accumulated clamped loss sum (float64 scalar); resets the accumulator."""
        out, self.summed_loss = self.summed_loss, torch.zeros((), dtype=torch.float64)
        return out
