"""The registry of per-sample norm modes: every list of mode names in privlm is derived from it.

A mode is how DP-SGD computes each example's gradient norm before clipping. Exact modes (``exact``,
``ghost``, ``mixed``) give the same norms by different algebra; randomized modes (``hutchinson``,
``hutchpp``) estimate them from Gaussian probes, which makes the clipping scale random, and the
accountant then composes the χ²_k/k envelope of the estimator (:mod:`privlm.privacy.envelope`).

Each :class:`NormModeSpec` says what the rest of the package needs to know about a mode: whether it is
randomized, the fewest probes it accepts, the clipping kind the accountant books it under, the k of
the Hutchinson envelope that dominates it, and the probe columns it draws. The estimator itself is
registered beside the factor algebra (:func:`privlm.dpsgd.norms.factors.norm_estimator`); adding a
mode is one entry here plus its estimator there (``tests/test_norm_modes.py`` checks the two agree).

Standard library only: ``privlm --help`` reads the names without importing torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from privlm.errors import UserError


def _same(probes: int) -> int:
    return probes


def _tail_third(probes: int) -> int:
    return probes // 3


def _sketch_and_tail(probes: int) -> int:
    return probes - probes // 3


@dataclass(frozen=True)
class NormModeSpec:
    """One per-sample norm mode.

    ``min_probes``: fewest probes accepted (0: the mode takes none). ``clipping``: the kind the
    accountant books a step under (``"exact"`` for every exact mode, else the mode's own name).
    ``envelope_probes(p)``: k of the Hutchinson χ²_k/k envelope that dominates the mode with p probes
    (randomized modes only). ``probe_columns(p)``: columns of the N(0, 1) probe matrix it draws per
    parameter. ``audited``: whether ``privlm audit`` runs it as its own cell (an exact mode whose norms
    equal another audited mode's by a tested identity need not be).
    """

    name: str
    summary: str
    min_probes: int = 0
    envelope_probes: Callable[[int], int] | None = None
    probe_columns: Callable[[int], int] | None = None
    audited: bool = True

    @property
    def randomized(self) -> bool:
        """Whether the norms are estimates (a random clipping scale)."""
        return self.min_probes > 0

    @property
    def clipping(self) -> str:
        """The accountant's clipping kind for this mode."""
        return self.name if self.randomized else "exact"


_SPECS: tuple[NormModeSpec, ...] = (
    NormModeSpec("exact", "instantiate each example's gradient"),
    NormModeSpec("ghost", "Gram-matrix norms, O(T²) memory, no per-example gradient", audited=False),
    NormModeSpec("mixed", "per layer the cheaper of exact and ghost"),
    NormModeSpec("hutchinson", "Hutchinson trace estimate with k probes", 1, _same, _same),
    NormModeSpec("hutchpp", "Hutch++ with m probes (sketch m/3, deflated tail)", 3, _tail_third, _sketch_and_tail),
)
NORM_MODE_SPECS: dict[str, NormModeSpec] = {spec.name: spec for spec in _SPECS}
NORM_MODES: tuple[str, ...] = tuple(NORM_MODE_SPECS)
RANDOMIZED_MODES: tuple[str, ...] = tuple(s.name for s in _SPECS if s.randomized)
CLIPPING_KINDS: tuple[str, ...] = tuple(dict.fromkeys(s.clipping for s in _SPECS))
AUDITED_MODES: tuple[str, ...] = tuple(s.name for s in _SPECS if s.audited)


def norm_mode(name: object, what: str = "norm_mode") -> NormModeSpec:
    """The spec of mode ``name``. Raises :class:`UserError` naming ``what`` for an unknown name."""
    if not isinstance(name, str) or name not in NORM_MODE_SPECS:
        raise UserError(f"{what} must be one of {', '.join(NORM_MODES)}, got {name!r}")
    return NORM_MODE_SPECS[name]


def check_probes(name: str, probes: object, what: str = "probes") -> int:
    """``probes`` validated for mode ``name`` (an int ≥ the mode's minimum, at least 1 for any mode).

    Raises :class:`UserError` naming ``what``, the mode and the value."""
    minimum = max(norm_mode(name).min_probes, 1)
    if not isinstance(probes, int) or isinstance(probes, bool) or probes < minimum:
        raise UserError(f"{what} must be an integer >= {minimum} for norm mode {name!r}, got {probes!r}")
    return probes


def clipping_spec(kind: object, what: str = "clipping") -> NormModeSpec:
    """The spec of accountant clipping kind ``kind`` (``"exact"`` or a randomized mode's name).

    Raises :class:`UserError` naming ``what`` for any other value."""
    if kind not in CLIPPING_KINDS:
        raise UserError(f"{what} must be one of {', '.join(CLIPPING_KINDS)}, got {kind!r}")
    return NORM_MODE_SPECS[str(kind)]
