"""The audit grid: mechanism × norm mode × accounted ε → one-run lower bound, cell by cell.

Each cell runs its mechanism once with fresh canaries, scores them, and turns the guesses into the
95 % lower bound of :mod:`privlm.audit.bound`. A cell whose lower bound exceeds the ε its accountant
claims is a *violation*: at the stated confidence, the implementation (or its accounting) is wrong.
Cells are cached one JSON file each under ``cells/`` of the output folder, so an interrupted grid
resumes where it stopped. Every run is seeded (reproducible), so no audit run is a private release.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from privlm.atomic import atomic_path
from privlm.audit.bound import DEFAULT_CONFIDENCE, best_lower_bound, perfect_guess_ceiling
from privlm.audit.gradient import GradientCanaries
from privlm.audit.gradmm import GradmmCanaries
from privlm.audit.inputs import InputCanaries
from privlm.audit.outcome import CanaryOutcome
from privlm.audit.pe import PECanaries
from privlm.audit.training import RunSettings
from privlm.dpsgd.loss_release import LossRelease
from privlm.errors import UserError

DPSGD_MODES = ("exact", "mixed", "hutchinson", "hutchpp")
MECHANISMS = {
    "dpsgd-whitebox": DPSGD_MODES,
    "dpsgd-blackbox": ("exact", "hutchinson"),
    "dp-loss": ("exact", "hutchinson"),
    "gradmm": ("label-rows", "full"),
    "smollm2-blackbox": ("exact", "hutchinson"),
    "pe": ("histograms",),
}
EPSILONS = (1.0, 4.0, 8.0)
_DPSGD_FIELDS = ("canaries", "steps", "sample_rate", "physical_batch_size", "probes")
# The Scale fields each mechanism's cells read (run_mechanism): a cached cell is reused when these match.
SCALE_FIELDS = {
    "dpsgd-whitebox": _DPSGD_FIELDS + ("real_examples", "canary_norm"),
    "dpsgd-blackbox": _DPSGD_FIELDS,
    "dp-loss": _DPSGD_FIELDS + ("real_examples", "canary_norm"),
    "gradmm": ("gradmm_canaries",),
    "smollm2-blackbox": ("smollm2_canaries", "smollm2_steps", "sample_rate", "probes"),
    "pe": ("pe_canaries",),
}


@dataclass(frozen=True)
class Scale:
    """How big each cell is: canaries per DP-SGD cell, steps, sampling rate, ordinary LM rows trained
    alongside the gradient canaries, canaries per GRADMM release, physical batch size, probes, the
    white-box canaries' norm (units of C), canaries and steps of the (slow) SmolLM2 black-box cells
    (LoRA r = 8 on the last 2 blocks), and canaries per PE run (T histograms)."""

    canaries: int = 1000
    steps: int = 50
    sample_rate: float = 0.5
    real_examples: int = 64
    gradmm_canaries: int = 1000
    physical_batch_size: int = 256
    probes: int = 32
    canary_norm: float = 2.0
    smollm2_canaries: int = 256
    smollm2_steps: int = 20
    pe_canaries: int = 1000


QUICK = Scale(canaries=200, steps=10, real_examples=16, gradmm_canaries=64, physical_batch_size=64,
              smollm2_canaries=32, smollm2_steps=2, pe_canaries=64)


@dataclass(frozen=True)
class Cell:
    """One grid cell: a mechanism, its mode (norm mode, GRADMM's released rows, PE's ``histograms``) and the target ε."""

    mechanism: str
    mode: str
    epsilon: float

    @property
    def name(self) -> str:
        """File-name-safe identifier."""
        return f"{self.mechanism}_{self.mode}_eps{self.epsilon:g}"


def grid(mechanisms: Sequence[str], modes: Sequence[str] | None, epsilons: Sequence[float]) -> list[Cell]:
    """Every (mechanism, mode, ε) asked for; ``modes=None``: each mechanism's modes. Unknown names
    and modes a mechanism does not have are a :class:`UserError`."""
    cells = []
    for mechanism in mechanisms:
        if mechanism not in MECHANISMS:
            raise UserError(f"unknown mechanism {mechanism!r}; choose from {', '.join(MECHANISMS)}")
        chosen = MECHANISMS[mechanism] if modes is None else [m for m in modes if m in MECHANISMS[mechanism]]
        if modes is not None and not chosen:
            raise UserError(f"mechanism {mechanism} has none of the modes {', '.join(modes)} (it has {', '.join(MECHANISMS[mechanism])})")
        for epsilon in epsilons:
            if not (math.isfinite(epsilon) and epsilon > 0):
                raise UserError(f"epsilon must be a finite number > 0, got {epsilon!r}")
            cells.extend(Cell(mechanism, mode, float(epsilon)) for mode in chosen)
    return cells


def run_mechanism(cell: Cell, scale: Scale, delta: float, seed: int) -> CanaryOutcome:
    """Run the cell's mechanism once on fresh canaries."""
    if cell.mechanism == "gradmm":
        return GradmmCanaries(canaries=scale.gradmm_canaries, release=cell.mode).run(cell.epsilon, delta, seed=seed)
    if cell.mechanism == "pe":
        return PECanaries(canaries=scale.pe_canaries).run(cell.epsilon, delta, seed=seed)
    settings = RunSettings(
        norm_mode=cell.mode, target_epsilon=cell.epsilon, delta=delta, sample_rate=scale.sample_rate,
        steps=scale.steps, probes=scale.probes, physical_batch_size=scale.physical_batch_size,
        loss_release=LossRelease() if cell.mechanism == "dp-loss" else None, seed=seed,
    )
    if cell.mechanism == "dpsgd-blackbox":
        return InputCanaries(canaries=scale.canaries).run(settings)
    if cell.mechanism == "smollm2-blackbox":
        smollm2 = InputCanaries(canaries=scale.smollm2_canaries, model="smollm2-135m", lora_rank=8, lora_layers=2)
        return smollm2.run(replace(settings, steps=scale.smollm2_steps, physical_batch_size=64))
    canaries = GradientCanaries(canaries=scale.canaries, canary_norm=scale.canary_norm, real_examples=scale.real_examples)
    return canaries.run(settings)


def audit_cell(cell: Cell, scale: Scale, delta: float, seed: int) -> dict:
    """The cell's result row: accounted ε, lower bound (95 %), guesses, canaries, the ceiling (the bound
    had every guess been right), wall time (building the canaries, the run and the scoring), verdict."""
    start = time.perf_counter()
    outcome = run_mechanism(cell, scale, delta, seed)
    seconds = time.perf_counter() - start
    bound = best_lower_bound(outcome.scores, outcome.included, delta, DEFAULT_CONFIDENCE)
    return {
        **asdict(cell),
        **bound.to_dict(),
        "accounted_epsilon": outcome.accounted_epsilon,
        "ceiling": perfect_guess_ceiling(bound.canaries, delta, DEFAULT_CONFIDENCE),
        "violation": bound.epsilon > outcome.accounted_epsilon,
        "seconds": seconds,
        "seed": seed,
        "private_release": False,
        "scale": asdict(scale),
        **{f"run_{k}": v for k, v in outcome.details.items()},
    }


def run_grid(
    cells: Sequence[Cell],
    scale: Scale,
    delta: float,
    seed: int,
    cache: Path | None = None,
    on_cell: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Audit every cell (reusing ``cache/<cell>.json`` written by an earlier run with the same δ, seed
    and values of the scale fields its mechanism reads, :data:`SCALE_FIELDS`); returns the rows in cell order."""
    rows = []
    for cell in cells:
        path = None if cache is None else cache / f"{cell.name}.json"
        row = _cached(path, cell, scale, delta, seed)
        if row is None:
            row = audit_cell(cell, scale, delta, seed)
            if path is not None:
                with atomic_path(path) as tmp:
                    tmp.write_text(json.dumps(row, indent=2, sort_keys=True))
        rows.append(row)
        if on_cell is not None:
            on_cell(row)
    return rows


def _cached(path: Path | None, cell: Cell, scale: Scale, delta: float, seed: int) -> dict | None:
    if path is None or not path.exists():
        return None
    row = json.loads(path.read_text())
    fields, cached = SCALE_FIELDS[cell.mechanism], row.get("scale") or {}
    same_scale = all(cached.get(f) == getattr(scale, f) for f in fields)
    return row if same_scale and row.get("delta") == delta and row.get("seed") == seed else None


def violations(rows: Sequence[dict]) -> list[str]:
    """One line per cell whose lower bound exceeds its accounted ε, naming the mechanism."""
    return [
        f"{r['mechanism']} ({r['mode']}, target ε={r['epsilon']:g}): audited lower bound "
        f"{r['epsilon_lower_bound']:.3f} > accounted ε {r['accounted_epsilon']:.3f}"
        for r in rows
        if r["violation"]
    ]
