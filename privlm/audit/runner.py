"""The audit grid: mechanism × mode × accounted ε → one-run lower bound, cell by cell.

Each cell runs its mechanism (:mod:`privlm.audit.registry`) once with fresh canaries and keeps the
canaries' scores; :func:`verdicts` turns them into lower bounds (:mod:`privlm.audit.bound`).

**Caching.** Each cell's outcome is cached as one JSON file under ``cells/`` of the output folder
(scores and inclusion bits included), so an interrupted grid resumes where it stopped. The file is
reused only when its key (:func:`privlm.audit.provenance.cell_key`: the cell, δ, seed, the scale
fields its mechanism reads, library versions and a hash of the source code the mechanism runs) equals
today's; a stale cell is run again, never reused.

**Family-wise error.** A grid tests K claims at once. Each cell's *verdict* is decided at level
0.05/K (Bonferroni over the K cells of the run): if every mechanism is correct, the probability that
the grid reports any violation is at most 5 %. The per-cell 95 % bound is reported beside it, to read
how tight each cell is; under a correct mechanism it exceeds that cell's claim with probability ≤ 5 %.

**Ceiling.** With m canaries the bound cannot exceed the value all-correct guesses give
(:func:`privlm.audit.bound.perfect_guess_ceiling`). A cell whose ceiling (at its verdict's level) is
not above its accounted ε *cannot detect a violation*, whatever the mechanism does; it is marked so.

Every run is seeded (reproducible, but for the mechanisms that draw their own OS noise keys), so no
audit run is a private release.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from privlm.atomic import write_text_atomic
from privlm.audit.bound import DEFAULT_CONFIDENCE, best_lower_bound, perfect_guess_ceiling
from privlm.audit.provenance import cell_key
from privlm.audit.registry import MECHANISMS, get
from privlm.audit.scale import QUICK, Scale
from privlm.errors import UserError
from privlm.privacy.validation import check_epsilon

__all__ = ["QUICK", "Cell", "Scale", "grid", "run_grid", "verdict", "verdicts", "violations"]

EPSILONS = (1.0, 4.0, 8.0)
FAMILY_CONFIDENCE = DEFAULT_CONFIDENCE


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
    for name in mechanisms:
        mechanism = get(name)
        chosen = mechanism.modes if modes is None else [m for m in modes if m in mechanism.modes]
        if modes is not None and not chosen:
            raise UserError(
                f"mechanism {name} has none of the modes {', '.join(modes)} (it has {', '.join(mechanism.modes)})"
            )
        for epsilon in epsilons:
            check_epsilon(epsilon, "--epsilons")
            cells.extend(Cell(name, mode, float(epsilon)) for mode in chosen)
    return cells


def _scale_read(cell: Cell, scale: Scale) -> dict:
    return {f: getattr(scale, f) for f in MECHANISMS[cell.mechanism].scale_fields}


def key(cell: Cell, scale: Scale, delta: float, seed: int) -> str:
    """The cell's cache key (:func:`privlm.audit.provenance.cell_key`)."""
    return cell_key(asdict(cell), _scale_read(cell, scale), delta, seed, MECHANISMS[cell.mechanism].module)


def audit_cell(cell: Cell, scale: Scale, delta: float, seed: int, cell_key: str | None = None) -> dict:
    """Run the cell's mechanism once: its record (cell, key — ``cell_key`` if the caller computed it —,
    accounted ε, scores and inclusion bits, the run's public settings, wall time of building the canaries,
    the run and the scoring)."""
    start = time.perf_counter()
    outcome = MECHANISMS[cell.mechanism].run()(cell.mode, cell.epsilon, scale, delta, seed)
    return {
        **asdict(cell),
        "key": cell_key or key(cell, scale, delta, seed),
        "accounted_epsilon": outcome.accounted_epsilon,
        "delta": delta,
        "seed": seed,
        "seconds": time.perf_counter() - start,
        "private_release": False,
        "scale": _scale_read(cell, scale),
        "scores": np.asarray(outcome.scores, dtype=float).tolist(),
        "included": np.asarray(outcome.included, dtype=bool).tolist(),
        **{f"run_{k}": v for k, v in outcome.details.items()},
    }


def verdict(record: dict, family_size: int, confidence: float = FAMILY_CONFIDENCE) -> dict:
    """The result row of one cell of a grid of ``family_size`` cells (scores and inclusion bits left
    out): the 95 % lower bound and ceiling of the cell alone, the family-wise bound and ceiling (level
    (1 − confidence)/K), ``detectable`` (family ceiling above the accounted ε) and ``violation``
    (family bound above it)."""
    each = 1.0 - (1.0 - confidence) / max(family_size, 1)
    scores, included, delta = record["scores"], record["included"], record["delta"]
    alone = best_lower_bound(scores, included, delta, DEFAULT_CONFIDENCE)
    family = best_lower_bound(scores, included, delta, each)
    family_ceiling = perfect_guess_ceiling(len(scores), delta, each)
    return {
        **{k: v for k, v in record.items() if k not in ("scores", "included")},
        **alone.to_dict(),
        "ceiling": perfect_guess_ceiling(len(scores), delta, DEFAULT_CONFIDENCE),
        "family_size": family_size,
        "family_confidence": confidence,
        "family_lower_bound": family.epsilon,
        "family_ceiling": family_ceiling,
        "detectable": family_ceiling > record["accounted_epsilon"],
        "violation": family.epsilon > record["accounted_epsilon"],
    }


def verdicts(records: Sequence[dict], confidence: float = FAMILY_CONFIDENCE) -> list[dict]:
    """:func:`verdict` of every record, the family being the K = len(records) cells together."""
    return [verdict(r, len(records), confidence) for r in records]


def run_grid(
    cells: Sequence[Cell],
    scale: Scale,
    delta: float,
    seed: int,
    cache: Path | None = None,
    on_cell: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Audit every cell, reusing ``cache/<cell>.json`` only when its key is today's (module docstring);
    ``on_cell`` sees each cell's row as it finishes. Returns :func:`verdicts` of the cells, in cell order."""
    records = []
    for cell in cells:
        path = None if cache is None else cache / f"{cell.name}.json"
        expected = key(cell, scale, delta, seed)
        record = _cached(path, expected)
        if record is None:
            record = audit_cell(cell, scale, delta, seed, expected)
            if path is not None:
                write_text_atomic(path, json.dumps(record, sort_keys=True))
        records.append(record)
        if on_cell is not None:
            on_cell(verdict(record, len(cells)))
    return verdicts(records)


def _cached(path: Path | None, expected: str) -> dict | None:
    if path is None or not path.exists():
        return None
    record = json.loads(path.read_text())
    return record if record.get("key") == expected and "scores" in record else None


def violations(rows: Sequence[dict]) -> list[str]:
    """One line per cell whose family-wise lower bound exceeds its accounted ε, naming the mechanism."""
    return [
        f"{r['mechanism']} ({r['mode']}, target ε={r['epsilon']:g}): audited lower bound "
        f"{r['family_lower_bound']:.3f} > accounted ε {r['accounted_epsilon']:.3f}"
        for r in rows
        if r["violation"]
    ]
