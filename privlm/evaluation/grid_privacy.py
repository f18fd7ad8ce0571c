"""What a whole experiment grid spends: every noisy release its cells drew from the private pool, composed.

Each DP cell is its own (ε, δ) release of the same pool; its ε is what a user of that one set pays. Whoever
publishes the sets of several cells pays their composition, which this module states for the report.

Where the numbers come from. Every mechanism books each draw in a write-ahead ledger (``privacy.json`` in
its run folder) before the draw, and a method keeps its run folders under its cell's ``workdir`` or the
experiment's ``private_cache`` (:class:`privlm.synthesis.registry.MethodContext`), both under ``DIR/work``;
a cell set aside when its method's parameters changed moves, ledger and all, to ``DIR/stale``. So the
ledgers found under those two hold every draw the experiment made, published or not (a cell interrupted
after its draw, or set aside after its set was published, included), and their PLD composition never
under-reports what any subset of the grid's sets costs. A run folder shared by several cells (dp-finetune-gen trains once per (ε, seed) for every n) is one
ledger and counts once; a ledger inside another run folder (a training checkpoint's copy, a prefix of its
run's) is not counted again.

The check behind the number (ASSUMPTION made explicit): every finished DP cell's set is accounted by one
write-ahead ledger under ``DIR/work`` that begins with the ledger its sidecar (``synthetic.privacy.json``)
reports — the one its ``ledger_file`` names (:func:`privlm.runfolder.ledger_pointer`) or, for sidecars
written before that field, one inside the cell's own folder. Distinct cells are accounted by distinct
ledgers unless they name the same shared run. A cell without one (a set from an older privlm, a deleted
run folder, a run folder outside ``DIR/work``) is named and the grid's ε is not stated at all rather than
stated too small; so is it when any ledger holds seeded draws (``private_release`` false: noise a user
seed reproduces, no guarantee). Noise-only controls read no private data and no-DP cells are NOT private; neither enters
the composition.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privlm.privacy.events import Event, event_from_dict
from privlm.privacy.ledger import Ledger, LedgerEntry
from privlm.runfolder import LEDGER
from privlm.synthesis.registry import SET_FILE

SIDECAR = Path(SET_FILE).with_suffix(".privacy.json").name


@dataclass(frozen=True)
class GridPrivacy:
    """The grid's composed privacy: ``epsilon`` at ``delta`` over ``releases`` draws in ``ledgers`` run
    folders, for ``dp_cells`` finished DP cells; ``epsilon`` is None when ``unaccounted`` names cells whose
    draws could not be found or ``seeded`` ledgers hold reproducible noise."""

    epsilon: float | None
    delta: float
    ledgers: int
    releases: int
    dp_cells: int
    unaccounted: tuple[str, ...]
    seeded: int = 0

    def statement(self) -> str:
        """One sentence for the report."""
        if not self.dp_cells:
            return "No finished cell released anything about the private data under DP."
        each = (f"The {self.dp_cells} finished DP cells are {self.dp_cells} separate (ε, δ) releases of the same "
                "private data; each cell's ε is what one of its sets costs.")
        if self.seeded:
            return (f"{each} Their composition is NOT stated: {self.seeded} ledgers under work/ or stale/ hold seeded "
                    "draws (noise reproducible from a user seed), which carry no guarantee.")
        if self.epsilon is None:
            shown = ", ".join(self.unaccounted[:5]) + (" …" if len(self.unaccounted) > 5 else "")
            return (f"{each} Their composition is NOT stated: {len(self.unaccounted)} DP cells have no write-ahead "
                    f"ledger under work/ that accounts for their set ({shown}).")
        return (f"{each} Published together they cost at most ε = {self.epsilon:.2f} at δ = {self.delta:g}: the "
                f"PLD composition of all {self.releases} noisy releases in the {self.ledgers} write-ahead ledgers "
                "under work/ (every draw made, published or not). Noise-only controls read no private data; "
                "no-DP cells are NOT private.")


def grid_privacy(out: Path, rows: Sequence[dict[str, Any]], delta: float) -> GridPrivacy:
    """Compose every write-ahead ledger under ``out/work`` and ``out/stale`` (``out``: an experiment's folder) at
    ``delta`` after checking that they account for each finished DP cell of ``rows`` (module docstring)."""
    work = Path(out) / "work"
    found = {path.resolve() for folder in (work, Path(out) / "stale") for path in _run_ledgers(folder)}
    dp_cells, unaccounted = 0, []
    for row in rows:
        if row.get("epsilon") is None:
            continue
        cell = work / row["cell"]
        sidecar = _sidecar(cell / SIDECAR)
        if sidecar.get("noise_only"):
            continue
        dp_cells += 1
        accounting = _accounting_ledger(cell, sidecar, work)
        if accounting is None:
            unaccounted.append(row["cell"])
        else:
            found.add(accounting)
    ledgers = [Ledger.load(path) for path in sorted(found)]
    merged = Ledger([entry for ledger in ledgers for entry in ledger])
    seeded = sum(not ledger.private_release for ledger in ledgers)
    epsilon = None if unaccounted or seeded or not dp_cells else merged.epsilon(delta)
    return GridPrivacy(epsilon, delta, len(ledgers), merged.count, dp_cells, tuple(unaccounted), seeded)


def _run_ledgers(folder: Path) -> list[Path]:
    """The write-ahead ledgers under ``folder``, less those inside a folder whose own ledger is counted."""
    kept: list[Path] = []
    for path in sorted(folder.rglob(LEDGER), key=lambda p: (len(p.parts), p)) if folder.is_dir() else []:
        if not any(run.parent in path.parents for run in kept):
            kept.append(path)
    return kept


def _accounting_ledger(cell: Path, sidecar: dict[str, Any], work: Path) -> Path | None:
    """The write-ahead ledger under ``work`` that accounts for the cell's set (module docstring), or None."""
    reported = [_release(item) for item in sidecar.get("ledger") or []]
    if not reported:
        return None
    pointer = sidecar.get("ledger_file")
    candidates = [cell / pointer] if isinstance(pointer, str) else sorted(cell.rglob(LEDGER))
    for path in candidates:
        path = path.resolve()
        if path.is_file() and work.resolve() in path.parents:
            held = [(entry.event, entry.count) for entry in Ledger.load(path)]
            if held[: len(reported)] == reported:
                return path
    return None


def _release(item: dict[str, Any]) -> tuple[Event, int]:
    """A sidecar ledger item as (event, count): an entry (``{"event": …, "count": …}``) or, in sidecars written
    before entries had counts and labels, the bare event (count 1)."""
    if "event" in item:
        entry = LedgerEntry.from_dict(item)
        return entry.event, entry.count
    return event_from_dict(item), 1


def _sidecar(path: Path) -> dict[str, Any]:
    """The cell's privacy sidecar, or an empty dict when it has none (an unaccounted cell)."""
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
