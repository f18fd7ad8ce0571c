"""The audited mechanisms: one record each, the only list ``privlm audit`` and the grid read.

A record names its modes, the :class:`~privlm.audit.scale.Scale` fields its cells read and its entry
point as ``"module:function"`` — resolved only when a cell runs, so listing the mechanisms (``privlm
--help``) imports no torch. The entry point is called as ``function(mode, epsilon, scale, delta, seed)``
and returns a :class:`~privlm.audit.outcome.CanaryOutcome`. The entry module is also what the audit's
cache key hashes (:mod:`privlm.audit.provenance`): its source and every privlm module it imports.

Adding a mechanism: write its canaries and an entry point in a module of its own, then either add a
record to :data:`BUILTIN` (the one shared line) or call :func:`register` from your own code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from privlm.errors import UserError
from privlm.norm_modes import AUDITED_MODES

DPSGD_MODES = AUDITED_MODES
_DPSGD_FIELDS = ("canaries", "steps", "sample_rate", "physical_batch_size", "probes")


@dataclass(frozen=True)
class AuditedMechanism:
    """``name`` (as ``--mechanisms`` spells it), its ``modes``, the ``scale_fields`` its cells read,
    ``entry`` (``"package.module:function"``), and a one-line ``summary`` for the help."""

    name: str
    modes: tuple[str, ...]
    scale_fields: tuple[str, ...]
    entry: str
    summary: str
    slow: bool = False

    @property
    def module(self) -> str:
        """The entry point's module (what the cache key hashes)."""
        return self.entry.partition(":")[0]

    def run(self) -> Callable[..., Any]:
        """The entry point (imports its module)."""
        module, _, function = self.entry.partition(":")
        return getattr(importlib.import_module(module), function)


BUILTIN = (
    AuditedMechanism(
        "dpsgd-whitebox",
        DPSGD_MODES,
        _DPSGD_FIELDS + ("real_examples", "canary_norm"),
        "privlm.audit.gradient:run_whitebox",
        "DP-SGD with crafted gradient canaries (tiny model)",
    ),
    AuditedMechanism(
        "dpsgd-blackbox",
        ("exact", "hutchinson"),
        _DPSGD_FIELDS,
        "privlm.audit.inputs:run_blackbox",
        "DP-SGD with random-text input canaries (tiny model)",
    ),
    AuditedMechanism(
        "dp-loss",
        ("exact", "hutchinson"),
        _DPSGD_FIELDS + ("real_examples", "canary_norm"),
        "privlm.audit.gradient:run_dp_loss",
        "DP-SGD plus the DP training-loss release",
    ),
    AuditedMechanism(
        "gradmm",
        ("label-rows", "full"),
        ("gradmm_canaries",),
        "privlm.audit.gradmm:run_cell",
        "GRADMM's DP last-layer release",
    ),
    AuditedMechanism(
        "pe", ("histograms",), ("pe_canaries",), "privlm.audit.pe:run_cell", "Private Evolution's noisy vote histograms"
    ),
    AuditedMechanism(
        "smollm2-blackbox",
        ("exact", "hutchinson"),
        ("smollm2_canaries", "smollm2_steps", "sample_rate", "probes"),
        "privlm.audit.inputs:run_smollm2",
        "DP-SGD on SmolLM2 (LoRA) with input canaries: slow",
        slow=True,
    ),
)
MECHANISMS: dict[str, AuditedMechanism] = {m.name: m for m in BUILTIN}


def register(mechanism: AuditedMechanism) -> None:
    """Add (or replace) an audited mechanism."""
    MECHANISMS[mechanism.name] = mechanism


def get(name: str) -> AuditedMechanism:
    """The record of ``name``; an unknown name is a :class:`UserError` listing the known ones."""
    if name not in MECHANISMS:
        raise UserError(f"unknown mechanism {name!r}; choose from {', '.join(MECHANISMS)}")
    return MECHANISMS[name]


def default_names() -> list[str]:
    """The mechanisms ``privlm audit`` runs by default: every one but the slow ones."""
    return [m.name for m in MECHANISMS.values() if not m.slow]
