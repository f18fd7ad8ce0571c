"""Privacy auditing: empirical *lower* bounds on ε for privlm's mechanisms (``privlm audit``).

The one-run method of Steinke, Nasr and Jagielski (NeurIPS 2023): m canaries, each included with
probability ½, one run of the mechanism, a score per canary, guesses for the most confident, and a
lower bound on ε at 95 % confidence from the number of right guesses (:mod:`privlm.audit.bound`).
Canaries per mechanism: white-box gradient canaries for DP-SGD (:mod:`privlm.audit.gradient`, also
used with the DP loss release), black-box input canaries (:mod:`privlm.audit.inputs`), GRADMM release
canaries (:mod:`privlm.audit.gradmm`), Private Evolution histogram canaries (:mod:`privlm.audit.pe`),
and micro-batch shift canaries for the position-independence of clip factors (:mod:`privlm.audit.shift`);
the grid and its verdicts (:mod:`privlm.audit.runner`) and the results folder (:mod:`privlm.audit.report`).

A lower bound can only show that a mechanism leaks *at least* so much: a bound below the accounted ε
is consistent with the claim (it does not prove it), a bound above it proves the implementation or its
accounting wrong (with probability ≥ the confidence). Audit runs are seeded and are not private releases;
the canaries (inclusion bits, texts, crafted rows) come from seeded numpy and torch generators, not from
:class:`~privlm.randomness.SecureRandom`: an audit measures a mechanism and protects no one.
"""

from typing import Any

__all__ = ["AuditBound", "best_lower_bound", "epsilon_lower_bound", "p_value"]


def __getattr__(name: str) -> Any:
    """The bound's names, imported on first use (listing the audited mechanisms must not import scipy)."""
    if name in __all__:
        from privlm.audit import bound

        return getattr(bound, name)
    raise AttributeError(f"module 'privlm.audit' has no attribute {name!r}")
