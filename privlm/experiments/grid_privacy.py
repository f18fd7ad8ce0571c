"""What a whole experiment grid spends: every noisy release its cells drew from the private pool, composed.

Each DP cell is its own (ε, δ) release of the same pool; its ε is what a user of that one set pays. Whoever
publishes the sets of several cells pays their composition, which this module states for the report.

Where the numbers come from. Every mechanism books each draw in a write-ahead ledger (``privacy.json`` in
its run folder) before the draw, and a method keeps its run folders under its cell's ``workdir`` or the
experiment's ``private_cache`` (:class:`privlm.synthesis.registry.MethodContext`), both under ``DIR/work``;
a cell set aside when its method's parameters changed moves, ledger and all, to ``DIR/stale``. So the
ledgers found under those two (symbolic links followed) hold every draw the experiment made, published or
not (a cell interrupted after its draw, or set aside after its set was published, included), and their PLD
composition never under-reports what any subset of the grid's sets costs. A run folder shared by several
cells (dp-finetune-gen trains once per (ε, seed) for every n, in the private cache) is one ledger and counts
once; a ledger inside another run folder counts again unless it is a prefix of that run's ledger (a
training checkpoint's copy).

The check behind the number (ASSUMPTION made explicit): every finished DP cell's set is accounted by a
write-ahead ledger that begins with the ledger its sidecar (``synthetic.privacy.json``) reports — the one
its ``ledger_file`` names (:func:`privlm.runfolder.epsilon_statement`) or, for sidecars written before that
field, one inside the cell's own folder — and a ledger outside ``DIR/work/private-cache`` accounts for one
cell only (two cells claiming one such ledger would hide a draw: a copied sidecar or run folder). A cell
that fails (a set from an older privlm, a deleted run folder), an unreadable ledger or sidecar, or a ledger
of seeded draws (``private_release`` false: noise a user seed reproduces, no guarantee) is named, and the
grid's ε is then not stated at all rather than stated too small. Noise-only controls read no private data
and no-DP cells are NOT private; neither enters the composition.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privlm.errors import UserError
from privlm.privacy.events import Event, event_from_dict
from privlm.privacy.ledger import Ledger, LedgerEntry
from privlm.runfolder import LEDGER, sidecar_path
from privlm.synthesis.registry import SET_FILE

SIDECAR = sidecar_path(Path(SET_FILE)).name
SHARED = "private-cache"  # the experiment's cache folder under work/: runs there may serve several cells


@dataclass(frozen=True)
class GridPrivacy:
    """The grid's composed privacy: ``epsilon`` at ``delta`` over ``releases`` draws in ``ledgers`` run
    folders, for ``dp_cells`` finished DP cells. ``epsilon`` is None when ``unaccounted`` names cells whose
    draws could not be found, ``unreadable`` names files that could not be read, or ``seeded`` ledgers hold
    reproducible noise."""

    epsilon: float | None
    delta: float
    ledgers: int
    releases: int
    dp_cells: int
    unaccounted: tuple[str, ...]
    seeded: int = 0
    unreadable: tuple[str, ...] = ()

    def statement(self) -> str:
        """One sentence for the report."""
        if not self.dp_cells:
            return "No finished cell released anything about the private data under DP."
        each = (
            f"The {self.dp_cells} finished DP cells are {self.dp_cells} separate (ε, δ) releases of the same "
            "private data; each cell's ε is what one of its sets costs."
        )
        if self.epsilon is not None:
            return (
                f"{each} Published together they cost at most ε = {self.epsilon:.2f} at δ = {self.delta:g}: "
                f"the PLD composition of all {self.releases} noisy releases in the {self.ledgers} write-ahead "
                "ledgers under work/ and stale/ (every draw made, published or not). Noise-only controls read "
                "no private data; no-DP cells are NOT private."
            )
        reasons = []
        if self.unaccounted:
            reasons.append(
                f"{len(self.unaccounted)} DP cells have no write-ahead ledger of their own that accounts "
                f"for their set ({_some(self.unaccounted)})"
            )
        if self.unreadable:
            reasons.append(f"{len(self.unreadable)} privacy files cannot be read ({_some(self.unreadable)})")
        if self.seeded:
            reasons.append(
                f"{self.seeded} ledgers hold seeded draws (noise reproducible from a user seed), "
                "which carry no guarantee"
            )
        return f"{each} Their composition is NOT stated: " + "; ".join(reasons) + "."


class _Ledgers:
    """The ledgers read so far (each file once) and those the composition counts."""

    def __init__(self) -> None:
        self.read: dict[Path, Ledger | None] = {}
        self.counted: set[Path] = set()
        self.unreadable: list[str] = []

    def get(self, path: Path) -> Ledger | None:
        """The ledger at ``path`` (None, and named unreadable, when it cannot be read)."""
        path = path.resolve()
        if path not in self.read:
            try:
                self.read[path] = Ledger.load(path)
            except UserError:
                self.read[path] = None
                self.unreadable.append(str(path))
        return self.read[path]

    def count_runs(self, folder: Path) -> None:
        """Count every write-ahead ledger under ``folder``, following symbolic links, less those inside a run
        folder whose own counted ledger starts with theirs (a checkpoint's copy)."""
        found = sorted(
            (Path(root) / LEDGER for root, _, files in os.walk(folder, followlinks=True) if LEDGER in files),
            key=lambda p: (len(p.parts), p),
        )
        kept: list[tuple[Path, Ledger]] = []
        for path in found:
            ledger = self.get(path)
            if ledger is None:
                continue
            if any(run.parent in path.parents and _starts_with(outer, _releases(ledger)) for run, outer in kept):
                continue
            kept.append((path, ledger))
            self.counted.add(path.resolve())


def grid_privacy(out: Path, rows: Sequence[dict[str, Any]], delta: float) -> GridPrivacy:
    """Compose every write-ahead ledger under ``out/work`` and ``out/stale`` (``out``: an experiment's folder) at
    ``delta`` after checking that they account for each finished DP cell of ``rows`` (module docstring)."""
    work = Path(out) / "work"
    ledgers = _Ledgers()
    for folder in (work, Path(out) / "stale"):
        ledgers.count_runs(folder)
    claims: dict[Path, list[str]] = defaultdict(list)
    dp_cells, unaccounted = 0, []
    for row in rows:
        if row.get("epsilon") is None:
            continue
        cell = work / row["cell"]
        try:
            sidecar = json.loads((cell / SIDECAR).read_text(encoding="utf-8")) if (cell / SIDECAR).exists() else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            ledgers.unreadable.append(str(cell / SIDECAR))
            continue
        if sidecar.get("noise_only"):
            continue
        dp_cells += 1
        accounting = _accounting_ledger(cell, sidecar, ledgers)
        if accounting is None:
            unaccounted.append(row["cell"])
        else:
            claims[accounting].append(row["cell"])
            ledgers.counted.add(accounting)
    shared = (work / SHARED).resolve()
    for path, cells in claims.items():
        if len(cells) > 1 and shared not in path.parents:
            unaccounted.extend(cells)
    counted = [ledgers.read[path] for path in sorted(ledgers.counted)]  # only ledgers that were read are counted
    merged = Ledger([entry for ledger in counted for entry in ledger])
    seeded = sum(not ledger.private_release for ledger in counted)
    stated = dp_cells and not (unaccounted or ledgers.unreadable or seeded)
    return GridPrivacy(
        merged.epsilon(delta) if stated else None,
        delta,
        len(counted),
        merged.count,
        dp_cells,
        tuple(unaccounted),
        seeded,
        tuple(ledgers.unreadable),
    )


def _accounting_ledger(cell: Path, sidecar: dict[str, Any], ledgers: _Ledgers) -> Path | None:
    """The write-ahead ledger that accounts for the cell's set (module docstring), or None."""
    try:
        reported = [_release(item) for item in sidecar.get("ledger") or []]
    except UserError:
        return None
    if not reported:
        return None
    pointer = sidecar.get("ledger_file")
    candidates = [cell / pointer] if isinstance(pointer, str) else sorted(cell.rglob(LEDGER))
    for path in candidates:
        ledger = ledgers.get(path) if path.is_file() else None
        if ledger is not None and _starts_with(ledger, reported):
            return path.resolve()
    return None


def _runs(releases: Sequence[tuple[Event, int]]) -> list[tuple[Event, int]]:
    """Consecutive releases of one event merged: the form in which two ledgers of one run compare, however
    their entries were cut (a checkpoint's ledger cuts an entry at its step)."""
    merged: list[tuple[Event, int]] = []
    for event, count in releases:
        if merged and merged[-1][0] == event:
            merged[-1] = (event, merged[-1][1] + count)
        else:
            merged.append((event, count))
    return merged


def _starts_with(ledger: Ledger, releases: Sequence[tuple[Event, int]]) -> bool:
    """Whether ``releases`` are the first releases of ``ledger``."""
    total = sum(count for _, count in releases)
    return total <= ledger.count and _runs(_releases(ledger.prefix(total))) == _runs(releases)


def _releases(ledger: Ledger) -> list[tuple[Event, int]]:
    return [(entry.event, entry.count) for entry in ledger]


def _release(item: dict[str, Any]) -> tuple[Event, int]:
    """A sidecar ledger item as (event, count): an entry (``{"event": …, "count": …}``) or, in sidecars written
    before entries had counts and labels, the bare event (count 1)."""
    if "event" in item:
        entry = LedgerEntry.from_dict(item)
        return entry.event, entry.count
    return event_from_dict(item), 1


def _some(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (" …" if len(names) > 5 else "")
