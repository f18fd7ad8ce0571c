"""Per-sample gradients in factored form, and their squared norms and clipped sums.

A hooked layer describes the per-sample gradient of each trainable parameter it uses as a factor:

- :class:`OuterFactor`: ``g_i = L_iᵀ R_i`` (shape ``rows × cols``, the parameter's shape), with
  ``L_i ∈ R^{T×rows}`` dense or one-hot token ids (embeddings) and ``R_i ∈ R^{T×cols}``;
- :class:`DenseFactor`: ``g_i`` instantiated (biases, LayerNorm/RMSNorm weights: cheap).

A parameter used by several layers (tied embedding = LM head) has one factor per use; its per-sample
gradient is the *sum* of the uses, and every mode here computes the norm of that sum (randomized modes
project all uses with the same probe matrix). Batch dimension 0 indexes samples throughout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from privlm.dpsgd import estimators
from privlm.norm_modes import norm_mode

NormMode = str
"""A name in :data:`privlm.norm_modes.NORM_MODES`."""


def _tensor_sum(tensors: Iterable[Tensor]) -> Tensor:
    """``sum(tensors)`` exactly as the builtin computes it (``0 + t₁ + t₂ …``), for at least one tensor."""
    total = sum(tensors)
    if not isinstance(total, Tensor):
        raise TypeError("nothing to sum (the builtin gave the int 0): a parameter needs at least one factor")
    return total


@dataclass
class OuterFactor:
    """``g_i = L_iᵀ R_i``. ``left``: (B, T, rows) floats, or (B, T) token ids standing for one-hot rows;
    ``right``: (B, T, cols); ``rows``: number of rows of the parameter."""

    left: Tensor
    right: Tensor
    rows: int

    @property
    def onehot(self) -> bool:
        return not self.left.is_floating_point()

    @property
    def cols(self) -> int:
        return self.right.shape[-1]

    def left_gram(self, other: OuterFactor) -> Tensor:
        """``L_i L'_iᵀ`` per sample, shape (B, T, T')."""
        if self.onehot and other.onehot:
            return (self.left[:, :, None] == other.left[:, None, :]).to(self.right.dtype)
        if self.onehot:
            return other.left_gram(self).transpose(1, 2)
        if other.onehot:
            idx = other.left[:, None, :].expand(-1, self.left.shape[1], -1)
            return torch.gather(self.left, 2, idx)
        return self.left @ other.left.transpose(1, 2)

    def left_times(self, x: Tensor) -> Tensor:
        """``L_i X`` (B, T, k) for X shared (rows, k) or per sample (B, rows, k)."""
        if not self.onehot:
            return self.left @ x
        if x.dim() == 2:
            return x[self.left]
        idx = self.left[:, :, None].expand(-1, -1, x.shape[-1])
        return torch.gather(x, 1, idx)

    def left_t_times(self, y: Tensor) -> Tensor:
        """``L_iᵀ Y_i`` (B, rows, k) for Y (B, T, k)."""
        if not self.onehot:
            return self.left.transpose(1, 2) @ y
        out = y.new_zeros(y.shape[0], self.rows, y.shape[-1])
        return out.scatter_add_(1, self.left[:, :, None].expand(-1, -1, y.shape[-1]), y)

    def right_op(self, x: Tensor) -> Tensor:
        """``g_iᵀ X = R_iᵀ (L_i X)`` (B, cols, k)."""
        return self.right.transpose(1, 2) @ self.left_times(x)

    def left_op(self, y: Tensor) -> Tensor:
        """``g_i Y_i = L_iᵀ (R_i Y_i)`` (B, rows, k) for Y (B, cols, k)."""
        return self.left_t_times(self.right @ y)

    def instantiate(self) -> Tensor:
        """Per-sample gradients (B, rows, cols)."""
        return self.left_t_times(self.right)

    def weighted_sum(self, c: Tensor, keep: Tensor | None = None) -> Tensor:
        """``Σ_i c_i L_iᵀ R_i`` (rows, cols) from the stored factors (book-keeping); with ``keep`` (B,) bool, over
        the kept samples only, exactly (copies the factors: only a micro-batch with a left-out sample pays)."""
        right = self.right * c[:, None, None].to(self.right.dtype)
        left = self.left
        if keep is not None:
            right = right.masked_fill_(~keep[:, None, None], 0)
            left = left if self.onehot else torch.where(keep[:, None, None], left, 0)
        right = right.reshape(-1, self.cols)
        if self.onehot:
            out = right.new_zeros(self.rows, self.cols)
            return out.index_add_(0, left.reshape(-1), right)
        return left.reshape(-1, self.rows).transpose(0, 1) @ right


@dataclass
class DenseFactor:
    """Instantiated per-sample gradients ``(B, *param.shape)``."""

    per_sample: Tensor

    def weighted_sum(self, c: Tensor, keep: Tensor | None = None) -> Tensor:
        """``Σ_i c_i g_i``; with ``keep`` (B,) bool, over the kept samples only, exactly."""
        per_sample = self.per_sample
        if keep is not None:
            per_sample = torch.where(keep.reshape(-1, *[1] * (per_sample.dim() - 1)), per_sample, 0)
        return torch.tensordot(c.to(per_sample.dtype), per_sample, dims=1)


Factor = OuterFactor | DenseFactor
ProbeSource = Callable[[int, torch.dtype, torch.device], Tensor]
"""``draw(columns, dtype, device)``: this parameter's N(0, 1) probe matrix (rows × columns) for the step."""


class ParameterOperator:
    """The per-sample gradient of one parameter, ``M_i = Σ_u g_{u,i}``, as a linear operator."""

    def __init__(self, factors: list[OuterFactor]) -> None:
        self.factors = factors
        self.rows = factors[0].rows
        self.dtype = factors[0].right.dtype
        self.device = factors[0].right.device

    def right(self, x: Tensor) -> Tensor:
        return _tensor_sum(f.right_op(x) for f in self.factors)

    def left(self, y: Tensor) -> Tensor:
        return _tensor_sum(f.left_op(y) for f in self.factors)


def _exact_sparse(factors: list[OuterFactor]) -> Tensor:
    """Exact squared norms when every use is an embedding lookup: sum rows per (sample, token id)."""
    first = factors[0]
    batch = first.right.shape[0]
    keys = torch.cat([f.left + first.rows * torch.arange(batch, device=f.left.device)[:, None] for f in factors], 1)
    values = torch.cat([f.right for f in factors], 1).reshape(-1, first.cols)
    unique, inverse = torch.unique(keys.reshape(-1), return_inverse=True)
    summed = values.new_zeros(unique.numel(), first.cols).index_add_(0, inverse, values)
    sq = summed.pow(2).sum(1)
    return sq.new_zeros(batch).index_add_(0, torch.div(unique, first.rows, rounding_mode="floor"), sq)


def _exact_dense(factors: list[OuterFactor]) -> Tensor:
    total = _tensor_sum(f.instantiate() for f in factors)
    return total.pow(2).sum((1, 2))


def _ghost(factors: list[OuterFactor]) -> Tensor:
    """``Σ_{u,v} ⟨L_u L_vᵀ, R_u R_vᵀ⟩`` per sample: T×T Gram matrices, no instantiation."""

    def terms() -> Iterator[Tensor]:
        for a, fa in enumerate(factors):
            for b in range(a, len(factors)):
                fb = factors[b]
                term = (fa.left_gram(fb) * (fa.right @ fb.right.transpose(1, 2))).sum((1, 2))
                yield term if a == b else 2 * term

    return _tensor_sum(terms())


DenseEstimator = Callable[[list[OuterFactor], int, ProbeSource], Tensor]
"""``estimate(factors, probes, draw)``: per-sample squared norms (B,) of one dense parameter's gradient
(the sum of its uses), ``draw`` called only by randomized estimators."""

ESTIMATORS: dict[str, DenseEstimator] = {}


def norm_estimator(name: str) -> Callable[[DenseEstimator], DenseEstimator]:
    """Register the dense-parameter estimator of norm mode ``name`` (a name of
    :data:`privlm.norm_modes.NORM_MODES`, whose spec says how many probe columns it draws)."""
    norm_mode(name)

    def register(estimate: DenseEstimator) -> DenseEstimator:
        ESTIMATORS[name] = estimate
        return estimate

    return register


@norm_estimator("exact")
def _exact(factors: list[OuterFactor], probes: int, draw: ProbeSource) -> Tensor:
    return _exact_dense(factors)


@norm_estimator("ghost")
def _ghost_mode(factors: list[OuterFactor], probes: int, draw: ProbeSource) -> Tensor:
    return _ghost(factors)


@norm_estimator("mixed")
def _mixed(factors: list[OuterFactor], probes: int, draw: ProbeSource) -> Tensor:
    """Ghost when its T×T Gram matrices are smaller than the instantiated gradient (2T² < rows·cols)."""
    tokens = max(f.right.shape[1] for f in factors)
    if 2 * tokens * tokens < factors[0].rows * factors[0].cols:
        return _ghost(factors)
    return _exact_dense(factors)


def _probe_matrix(
    mode: str, factors: list[OuterFactor], probes: int, draw: ProbeSource
) -> tuple[ParameterOperator, Tensor]:
    op = ParameterOperator(factors)
    return op, draw(estimators.probe_columns(mode, probes), op.dtype, op.device)


@norm_estimator("hutchinson")
def _hutchinson(factors: list[OuterFactor], probes: int, draw: ProbeSource) -> Tensor:
    op, matrix = _probe_matrix("hutchinson", factors, probes, draw)
    return estimators.hutchinson(op, matrix)


@norm_estimator("hutchpp")
def _hutchpp(factors: list[OuterFactor], probes: int, draw: ProbeSource) -> Tensor:
    op, matrix = _probe_matrix("hutchpp", factors, probes, draw)
    return estimators.hutchpp(op, probes, matrix)


def outer_sq_norms(factors: list[OuterFactor], mode: str, probes: int, draw: ProbeSource) -> Tensor:
    """Per-sample squared norm (B,) of the sum of the uses of one parameter, in ``mode``.

    Untied embeddings are always exact (sparse rows, O(T·d)) except in ``ghost``; other parameters go
    to the mode's registered estimator (:data:`ESTIMATORS`). ``hutchinson``/``hutchpp`` are unbiased
    estimates with ``probes`` probes, the matrix from ``draw`` (called only in those modes)."""
    sparse = all(f.onehot for f in factors)
    if sparse and mode != "ghost":
        return _exact_sparse(factors)
    if mode not in ESTIMATORS:
        raise ValueError(f"unknown norm mode {mode!r}")
    return ESTIMATORS[mode](factors, probes, draw)


def _at_least_float32(factor: Factor) -> Factor:
    """The factor with float16/bfloat16 tensors cast to float32 (token ids untouched)."""

    def up(t: Tensor) -> Tensor:
        return t.float() if t.is_floating_point() and torch.finfo(t.dtype).bits < 32 else t

    if isinstance(factor, DenseFactor):
        return DenseFactor(up(factor.per_sample))
    return replace(factor, left=up(factor.left), right=up(factor.right))


def _no_autocast(factors: list[Factor]) -> torch.autocast:
    """Autocast switched off on the factors' device: inside a bf16 autocast region (``--precision bf16``) the
    matrix products of the norms and clipped sums would otherwise run in bf16 whatever their inputs' dtype."""
    first = factors[0]
    tensor = first.per_sample if isinstance(first, DenseFactor) else first.right
    return torch.autocast(tensor.device.type, enabled=False)


def sq_norms(factors: list[Factor], mode: str, probes: int, draw: ProbeSource) -> Tensor:
    """Per-sample squared gradient norm (B,) of one parameter from the factors of all its uses.

    Computed in at least float32, also inside an autocast region (a bf16 step's backward): in a
    half-precision model a norm rounded down by ~1e-2 would let the clipped gradient exceed C by as much."""
    factors = [_at_least_float32(f) for f in factors]
    dense = [f for f in factors if isinstance(f, DenseFactor)]
    outer = [f for f in factors if isinstance(f, OuterFactor)]
    with _no_autocast(factors):
        if len(dense) == len(factors):
            total = _tensor_sum(f.per_sample for f in dense)
            return total.reshape(total.shape[0], -1).pow(2).sum(1)
        if len(outer) == len(factors):
            return outer_sq_norms(outer, mode, probes, draw)
    raise TypeError("a parameter mixes factor kinds; no layer handler produces this")


def weighted_sum(factors: list[Factor], c: Tensor, shape: torch.Size, keep: Tensor | None = None) -> Tensor:
    """``Σ_i c_i g_i`` for one parameter, in the parameter's ``shape`` (book-keeping). ``keep`` (B,) bool: sum only
    those samples, exactly — a left-out sample's factors may be NaN (``c_i = 0`` alone would give 0 · NaN).

    Computed and returned in at least float32 (bf16 factors of a mixed-precision step are upcast first, and
    autocast is off here): a clipped sum rounded in bf16 would let one example's contribution exceed C by the
    rounding, and make it depend on its batch-mates, which the accountant's sensitivity C does not allow for."""
    factors = [_at_least_float32(f) for f in factors]
    with _no_autocast(factors):
        total = factors[0].weighted_sum(c, keep).reshape(shape)
        for f in factors[1:]:
            total.add_(f.weighted_sum(c, keep).reshape(shape))
    return total
