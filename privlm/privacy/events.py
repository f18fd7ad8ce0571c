"""Immutable descriptions of what was released; the accountant decides what they cost.

Two kinds of release happen in privlm:

* :class:`PoissonGaussianStep` — one DP-SGD step: every example is included independently with
  probability ``sample_rate`` (Poisson sampling), each included example's gradient is clipped to L2
  norm C, and N(0, σ²C²) is added to the sum (σ = ``noise_multiplier``). ``clipping`` says how the
  clip factor was computed: ``"exact"`` (true per-example norms), ``"hutchinson"`` (norms estimated
  with ``probes`` = k Gaussian probes) or ``"hutchpp"`` (Hutch++ with ``probes`` = m matrix-vector
  products, accounted conservatively as Hutchinson with k = ⌊m/3⌋ probes).
* :class:`GaussianRelease` — one Gaussian mechanism without subsampling (GRADMM's per-class noisy
  sum of clipped gradients: sensitivity C, noise N(0, σ²C²)).

Both carry ``snapped``: how many coordinates of the release went through
:func:`privlm.privacy.snapping.snap` (the DP loss of a step: 1; a GRADMM release: its dimension), whose
slack the accountant adds (:func:`privlm.privacy.snapping.snapped_guarantee`); 0 for releases that are
not snapped (DP-SGD's gradient, which is never released itself: only the weights after the optimizer).

Adjacency is add/remove-one throughout. Events are frozen dataclasses (hashable, comparable) and
round-trip through plain dicts (:meth:`to_dict`, :func:`event_from_dict`) for the JSON ledger.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from privlm.errors import UserError
from privlm.norm_modes import RANDOMIZED_MODES, check_probes, clipping_spec
from privlm.privacy.validation import check_count, check_noise_multiplier, check_sample_rate

Clipping = str
"""A name in :data:`CLIPPING_KINDS`: ``"exact"`` or a randomized norm mode (:mod:`privlm.norm_modes`)."""


def hutchinson_probes(clipping: str, probes: int) -> int:
    """Number k of i.i.d. Hutchinson probes whose envelope dominates the estimator.

    Hutchinson with k probes is itself; Hutch++ with m probes is, conditionally on its sketch, an exact
    trace of the head plus Hutchinson with ⌊m/3⌋ probes on the deflated tail, so k = ⌊m/3⌋ (conservative).
    Each randomized mode's rule is its registry entry's ``envelope_probes``.
    """
    envelope = clipping_spec(clipping).envelope_probes
    if envelope is None:
        raise UserError(f"clipping {clipping!r} has no probes; expected one of {', '.join(RANDOMIZED_MODES)}")
    return envelope(probes)


@dataclass(frozen=True)
class PoissonGaussianStep:
    """One Poisson-subsampled Gaussian step (DP-SGD): rate q, noise multiplier σ, clipping kind."""

    sample_rate: float
    noise_multiplier: float
    clipping: Clipping = "exact"
    probes: int | None = None
    snapped: int = 0

    kind: ClassVar[str] = "poisson_gaussian_step"

    def __post_init__(self) -> None:
        check_sample_rate(self.sample_rate)
        check_noise_multiplier(self.noise_multiplier)
        check_snapped(self.snapped)
        spec = clipping_spec(self.clipping)
        if not spec.randomized:
            if self.probes is not None:
                raise UserError(
                    f"probes only apply to {'/'.join(RANDOMIZED_MODES)} clipping, got probes={self.probes!r}"
                )
            return
        if self.probes is None:
            raise UserError(f"{self.clipping} clipping needs the number of probes")
        check_count(self.probes, "probes")
        check_probes(self.clipping, self.probes)

    @property
    def randomized(self) -> bool:
        """Whether the clipping scale is random (estimated norms)."""
        return self.clipping != "exact"

    @property
    def envelope_probes(self) -> int | None:
        """k of the χ²_k/k envelope used by the accountant (None for exact clipping)."""
        return None if self.probes is None else hutchinson_probes(self.clipping, self.probes)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form with a ``kind`` tag (for JSON)."""
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True)
class GaussianRelease:
    """One Gaussian mechanism (no subsampling) with noise multiplier σ = noise std / L2 sensitivity."""

    noise_multiplier: float
    snapped: int = 0

    kind: ClassVar[str] = "gaussian_release"

    def __post_init__(self) -> None:
        check_noise_multiplier(self.noise_multiplier)
        check_snapped(self.snapped)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form with a ``kind`` tag (for JSON)."""
        return {"kind": self.kind, **asdict(self)}


def check_snapped(value: Any) -> None:
    """A number of snapped coordinates: an integer ≥ 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"snapped must be an integer >= 0 (coordinates), got {value!r}")


Event = PoissonGaussianStep | GaussianRelease
_KINDS: dict[str, type[PoissonGaussianStep | GaussianRelease]] = {
    cls.kind: cls for cls in (PoissonGaussianStep, GaussianRelease)
}


def event_from_dict(data: Any) -> Event:
    """Inverse of ``to_dict``; raises :class:`UserError` naming the bad value on malformed input."""
    if not isinstance(data, dict) or data.get("kind") not in _KINDS:
        raise UserError(f"not a privacy event (unknown or missing 'kind'): {data!r}")
    fields = {key: value for key, value in data.items() if key != "kind"}
    try:
        return _KINDS[data["kind"]](**fields)
    except TypeError as err:
        raise UserError(f"malformed {data['kind']} event {data!r}: {err}") from err
