"""Privacy accounting for privlm (on Google's dp-accounting), including randomized clipping.

Public API (import from ``privlm.privacy``):

* Events (frozen dataclasses, ``to_dict``/``event_from_dict``):
  ``PoissonGaussianStep(sample_rate, noise_multiplier, clipping="exact"|"hutchinson"|"hutchpp", probes=None)``
  (one DP-SGD step) and ``GaussianRelease(noise_multiplier)`` (one Gaussian mechanism, e.g. GRADMM's
  per-class release).
* ``PrivacyAccountant(method="pld"|"rdp")`` (alias ``Accountant``): ``.record(event, count=1)``,
  ``.epsilon(delta)``, ``.delta(epsilon)``. PLD with pessimistic discretization by default.
* ``calibrate_noise_multiplier(target_epsilon, delta, sample_rate, steps, clipping, probes, method, rtol)``
  and ``dpsgd_epsilon(noise_multiplier, sample_rate, steps, delta, clipping, probes, method)``.
* One-shot Gaussian, exact (analytic Gaussian mechanism): ``gaussian_noise_multiplier(epsilon, delta)``,
  ``gaussian_epsilon(sigma, delta)``, ``gaussian_delta(sigma, epsilon)``.
* ``Ledger`` / ``LedgerEntry``: append-only JSON ledger; ``.append(entry)``, ``.record(event, count, label)``,
  ``.save(path)`` (atomic), ``Ledger.load(path)``, ``.accountant()``, ``.epsilon(delta)``.
* Randomized clipping internals: ``envelope_cdf(x, probes)`` (the χ²_k/k envelope, see ``envelope.py``),
  ``randomized_clipping_pld(sample_rate, noise_multiplier, probes, value_discretization)``,
  ``hutchinson_probes(clipping, probes)`` (Hutch++ m probes → k = ⌊m/3⌋).

Adjacency is add/remove-one everywhere. Every bad input raises :class:`privlm.errors.UserError`.
"""

from privlm.norm_modes import CLIPPING_KINDS
from privlm.privacy.accountant import Accountant, PrivacyAccountant
from privlm.privacy.calibration import calibrate_noise_multiplier, dpsgd_epsilon
from privlm.privacy.envelope import envelope_cdf
from privlm.privacy.events import (
    Event,
    GaussianRelease,
    PoissonGaussianStep,
    event_from_dict,
    hutchinson_probes,
)
from privlm.privacy.gaussian import gaussian_delta, gaussian_epsilon, gaussian_noise_multiplier
from privlm.privacy.ledger import Ledger, LedgerEntry
from privlm.privacy.randomized import randomized_clipping_pld

__all__ = [
    "Accountant",
    "CLIPPING_KINDS",
    "Event",
    "GaussianRelease",
    "Ledger",
    "LedgerEntry",
    "PoissonGaussianStep",
    "PrivacyAccountant",
    "calibrate_noise_multiplier",
    "dpsgd_epsilon",
    "envelope_cdf",
    "event_from_dict",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_noise_multiplier",
    "hutchinson_probes",
    "randomized_clipping_pld",
]
