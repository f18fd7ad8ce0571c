"""What a whole experiment grid spends: every noisy release its cells drew from the private pool, composed.

Each DP cell is its own (ε, δ) release of the same pool; its ε is what a user of that one set pays. Whoever
publishes the sets of several cells pays their composition, which this module states for the report.

Where the numbers come from. Every mechanism books each draw in a write-ahead ledger (``privacy.json`` in
its run folder) before the draw, and a method keeps its run folders under its cell's ``workdir`` or the
experiment's ``private_cache`` (:class:`privlm.synthesis.registry.MethodContext`), both under ``DIR/work``;
a cell set aside when its method's parameters changed moves, ledger and all, to ``DIR/stale``. So the
ledgers found under those two (symbolic links followed) hold every draw the experiment made, published or
not (a cell interrupted after its draw, or set aside after its set was published, included), and their PLD
composition never under-reports what any subset of the grid's sets costs. Those folders are private and
ignored by git, and a new machine starts without them: after every cell the runner copies every ledger and
sidecar found there into ``DIR/accounting.json`` (:func:`keep_accounting`; public: events and privacy statements
only), which is committed with the results, and a ledger whose run folder is gone is read from that copy.

Runs are told apart by their identity (``run`` in the ledger, a random token drawn when the run starts; the
sidecar's ``ledger_run`` names it), not by their events: a run made again at the same path after its folder was
lost has the same settings and the same events, and another identity. A ledger in the private cache that several
finished cells claim (dp-finetune-gen trains once per (ε, seed) for every n) counts once for the cells whose
sidecars name its identity, and once more for each cell whose sidecar names none (written by an older privlm,
or read from a ledger without one): such a cell may have been served by a lost run with the same events, so
sharing is not assumed for it (an over-count where it did share). A ledger replaces its kept copy, or stands
for it, only when it begins with the copy's releases and has the copy's identity (none for both counts as the
same: ledgers of an older privlm). A ledger inside another run folder counts again unless it is a prefix of that
run's ledger with its identity (a training checkpoint's copy).

The check behind the number (ASSUMPTION made explicit): every finished DP cell's set is accounted by a
write-ahead ledger that begins with the ledger its sidecar (``synthetic.privacy.json``) reports — the one
its ``ledger_file`` names (:func:`privlm.runfolder.epsilon_statement`), of the run its ``ledger_run`` names when
it names one, or, for sidecars written before ``ledger_file``, one inside the cell's own folder — and a ledger
outside ``DIR/work/private-cache`` accounts for one cell only (two cells claiming one such ledger would hide a
draw: a copied sidecar or run folder). A cell
that fails (a set from an older privlm, a deleted run folder), an unreadable ledger or sidecar, or a ledger
of seeded draws (``private_release`` false: noise a user seed reproduces, no guarantee) is named, and the
grid's ε is then not stated from its ledgers rather than stated too small. Noise-only controls read no private
data and no-DP cells are NOT private; neither enters the composition.

Where only cells without a ledger stand in the way (their run folders lost with a machine before the runner kept
copies) and their rows state their (ε, δ), the report gives a bound that rests on one more ASSUMPTION, said
beside it: each such cell's set came from a single draw at its stated budget. The bound adds those budgets to
the ledgers' PLD composition by basic composition (ε and δ add), never less than the truth when the
assumption holds. A cell whose sidecar was lost with its folder counts this way even if it was a noise-only
control: the sidecar that would say so is gone.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import posixpath
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from privlm.atomic import write_text_atomic
from privlm.digest import digest
from privlm.errors import UserError
from privlm.privacy.events import Event, event_from_dict
from privlm.privacy.ledger import Ledger, LedgerEntry
from privlm.runfolder import LEDGER, claim, sidecar_path
from privlm.synthesis.registry import SET_FILE

SIDECAR = sidecar_path(Path(SET_FILE)).name
SHARED = "private-cache"  # the experiment's cache folder under work/: runs there may serve several cells
KEPT = "accounting.json"  # the public copies of the grid's ledgers and sidecars (keep_accounting)
KEPT_FORMAT = "privlm-grid-accounting"
KEPT_KEY = KEPT + ":"
KEPT_RUNS = "kept-runs"  # the public state of unfinished runs, paths as under DIR/work (privlm.experiments.kept_runs)
KEEP_LOCK = ".keep.lock"  # under DIR/work: one keep_accounting at a time
DISPLACED = "#displaced-"


@dataclass(frozen=True)
class GridPrivacy:
    """The grid's composed privacy: ``epsilon`` at ``delta`` over ``releases`` draws in ``ledgers`` run
    folders, for ``dp_cells`` finished DP cells. ``epsilon`` is None when ``unaccounted`` names cells whose
    draws could not be found, ``unreadable`` names files that could not be read, or ``seeded`` ledgers hold
    reproducible noise. ``kept``: how many of the ledgers were read from the copies in ``accounting.json``, their
    run folders being gone. ``ledger_epsilon``: the ledgers' PLD ε at ``delta``, also when cells are unaccounted
    (None with unreadable files or seeded draws); ``stated``: per distinct unaccounted cell, the largest (ε, δ)
    its row and sidecar state (None: none stated). Those two make :meth:`bound`."""

    epsilon: float | None
    delta: float
    ledgers: int
    releases: int
    dp_cells: int
    unaccounted: tuple[str, ...]
    seeded: int = 0
    unreadable: tuple[str, ...] = ()
    kept: int = 0
    ledger_epsilon: float | None = None
    stated: tuple[tuple[float, float] | None, ...] = ()

    def bound(self) -> tuple[float, float] | None:
        """``(ε, δ)`` of the sets published together when only ledger-less cells stand in the way: the ledgers'
        PLD ε at ``delta`` plus each unaccounted cell's stated budget, by basic composition (module docstring:
        it ASSUMES each such cell drew once at its stated budget). None when the ledgers state ``epsilon``
        themselves, or when an unreadable file, seeded draws or a cell without a stated budget stand in the way."""
        budgets = [b for b in self.stated if b is not None]
        if self.epsilon is not None or self.ledger_epsilon is None or not budgets or len(budgets) != len(self.stated):
            return None
        return self.ledger_epsilon + sum(e for e, _ in budgets), self.delta + sum(d for _, d in budgets)

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
                f"ledgers under work/ and stale/{self._kept()} (every draw made, published or not). Noise-only "
                "controls read no private data; no-DP cells are NOT private."
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
        found = "Their composition is NOT stated from their ledgers alone: " + "; ".join(reasons) + "."
        bound = self.bound()
        if bound is None:
            return f"{each} {found}"
        return (
            f"{each} Published together they cost at most ε = {bound[0]:.2f} at δ = {bound[1]:.3g} IF each of the "
            f"{len(self.stated)} cells without a ledger of their own drew once at its stated (ε, δ) (an ASSUMPTION: "
            f"their ledgers, which would show it, are gone). {found} The bound adds their stated budgets by basic "
            f"composition to the PLD composition of the {self.releases} noisy releases in the {self.ledgers} ledgers "
            f"found (ε = {self.ledger_epsilon:.2f} at δ = {self.delta:g}). Draws lost with both their ledger and "
            "their row (a run lost before any copy of its ledger was kept) are in neither part."
        )

    def _kept(self) -> str:
        if not self.kept:
            return ""
        return f" ({self.kept} of them from the copies kept in {KEPT}, their run folders being gone)"


class _Ledgers:
    """Every ledger the composition may count, read once each: the live files under ``out/work`` and ``out/stale``
    (key: the resolved path) and the copies kept in ``out/accounting.json`` (key: ``accounting.json:<path>``);
    ``position`` maps each key to its path relative to ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.read: dict[str, Ledger | None] = {}
        self.position: dict[str, str] = {}
        self.alias: dict[str, str] = {}  # a kept copy's key -> the key of the live ledger that begins with it
        self.counted: set[str] = set()
        self.unreadable: list[str] = []
        self.kept_ledgers, self.kept_sidecars = _read_kept(out / KEPT, self.unreadable)

    def get(self, key: str) -> Ledger | None:
        """The ledger under ``key`` (None, and named unreadable, when it cannot be read)."""
        if key not in self.read:
            try:
                if key.startswith(KEPT_KEY):
                    self.read[key] = Ledger.from_dict(self.kept_ledgers[key.removeprefix(KEPT_KEY)], key)
                else:
                    self.read[key] = Ledger.load(key)
            except UserError:
                self.read[key] = None
                self.unreadable.append(key)
        return self.read[key]

    def live_key(self, rel: str) -> str | None:
        """The key of the live ledger at ``rel`` (relative to ``out``); None when there is no such file."""
        path = self.out / rel
        if not path.is_file():
            return None
        key = str(path.resolve())
        self.position.setdefault(key, rel)
        return key

    def count_runs(self) -> None:
        """Count every write-ahead ledger under ``out/work`` and ``out/stale`` (symbolic links followed) and every
        kept copy that the live ledger at its path does not continue (:func:`continues`: its folder was lost, or a
        new run was made there), less those inside a run folder whose own counted ledger continues theirs (a
        checkpoint's copy)."""
        found = [key for rel in _live_ledgers(self.out) if (key := self.live_key(rel)) is not None]
        for rel in self.kept_ledgers:
            kept = KEPT_KEY + rel
            self.position[kept] = rel.split(DISPLACED, 1)[0]
            live = None if DISPLACED in rel else self.live_key(rel)
            copy, now = self.get(kept), None if live is None else self.get(live)
            if copy is not None and now is not None and continues(now, copy):
                self.alias[kept] = str(live)
            else:
                found.append(kept)
        runs: list[tuple[PurePosixPath, Ledger]] = []
        for key in sorted(set(found), key=lambda k: (len(PurePosixPath(self.position[k]).parts), self.position[k], k)):
            ledger = self.get(key)
            if ledger is None:
                continue
            where = PurePosixPath(self.position[key])
            if _a_copy_inside(where, ledger, runs):
                continue
            runs.append((where, ledger))
            self.counted.add(key)

    def counted_key(self, key: str) -> str:
        """The key under which ledger ``key`` counts (a kept copy that a live ledger begins with: the live one's)."""
        return self.alias.get(key, key)


def _read_kept(path: Path, unreadable: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The kept ledgers and sidecars of ``path`` (``accounting.json``) by path relative to its folder; empty when
    there is no such file; an unreadable one is named in ``unreadable`` (which leaves the grid's ε unstated)."""
    if not path.exists():
        return {}, {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != KEPT_FORMAT:
            raise ValueError(f"not {KEPT_FORMAT!r}")
        return dict(data["ledgers"]), dict(data["sidecars"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        unreadable.append(str(path))
        return {}, {}


def kept_copy(out: Path, rel: str, *, strict: bool = False) -> dict[str, Any] | None:
    """The copy of the ledger or set sidecar ``rel`` (relative to ``out``) kept in ``out/accounting.json``; None
    when there is none or the file cannot be read (``strict``: :class:`UserError` when it cannot be read)."""
    unreadable: list[str] = []
    ledgers, sidecars = _read_kept(Path(out) / KEPT, unreadable)
    if strict and unreadable:
        raise UserError(f"{unreadable[0]}: not a readable {KEPT_FORMAT} file")
    found = sidecars.get(rel, ledgers.get(rel))
    return dict(found) if isinstance(found, dict) else None


def _live_ledgers(out: Path) -> list[str]:
    """The paths, relative to ``out``, of the ledgers under ``out/work`` and ``out/stale`` (links followed)."""
    return [rel for rel, name in _live_files(out) if name == LEDGER]


def _live_files(out: Path) -> list[tuple[str, str]]:
    """(path relative to ``out``, file name) of every ledger and set sidecar under ``out/work`` and ``out/stale``."""
    found = []
    for folder in (out / "work", out / "stale"):
        for root, _, files in os.walk(folder, followlinks=True):
            rel = Path(root).relative_to(out).as_posix()
            found += [(f"{rel}/{name}", name) for name in (LEDGER, SIDECAR) if name in files]
    return sorted(found)


def keep_accounting(out: Path) -> tuple[int, int]:
    """Copy every write-ahead ledger and set sidecar under ``out/work`` and ``out/stale`` into ``out/accounting.json``
    (by path relative to ``out``), so that :func:`grid_privacy` can still state the grid's ε when the private work
    folder is lost (a new machine, a deleted cache): commit it with ``results.jsonl``.

    Public: a ledger holds the mechanisms' events (noise multipliers, sampling rates, counts, labels) and a sidecar
    the privacy statement published beside a set; neither holds a row, a statistic or a hash of the data (a run's
    identity is a random token). A DP-SGD step's sampling rate q = B/N tells the number of private examples N,
    which privlm's DP-SGD accounting assumes public (``docs/accounting.md``); GRADMM's and PE's events do not
    depend on N. A kept ledger is replaced by the live one only when that continues it (:func:`continues`: the
    run went on); otherwise (the folder was lost and a new run made at the same path) the old copy stays, as
    ``<path>#displaced-<digest>``, and counts beside the new one. A checkpoint's copy inside a run folder whose
    ledger continues it is not kept. The runner calls this as soon as a cell's set is written (its evaluation
    releases nothing) and at the end of a run: draws still being made (a DP-SGD run in its steps) are kept by
    the next call, so a machine lost in the middle of making a set loses those draws' ledger together with
    their outputs; call it by hand (``privlm experiment CONFIG --out DIR --keep-accounting``) before a machine
    goes to keep them too. Returns how many ledgers and sidecars ``out/accounting.json`` now holds.

    The ledgers mirrored under ``out/kept-runs`` (:mod:`privlm.experiments.kept_runs`: unfinished runs' public state,
    restored on a new machine) are folded in like live ones where no live ledger is at their path, except that a
    kept copy that goes on from a mirrored ledger stays as it is (the mirror is behind: one run). One process keeps
    at a time (:func:`keeping`)."""
    with keeping(out) as keep:
        return keep()


@contextlib.contextmanager
def keeping(out: Path) -> Iterator[Callable[[], tuple[int, int]]]:
    """Hold the lock of ``out``'s keeps (an ``flock`` on ``out/work/.keep.lock``) and yield the call that makes
    :func:`keep_accounting`'s copy (once), so that a caller can read what it mirrors before the ledgers are copied
    and write the mirror after (:func:`privlm.experiments.kept_runs.keep_runs`). ``accounting.json`` is found
    readable before anything is yielded. Nothing inside may take the lock again (``flock`` is per open file: it
    would wait for itself)."""
    out = Path(out)
    with claim(out / "work" / KEEP_LOCK, wait=True):
        unreadable: list[str] = []
        ledgers, sidecars = _read_kept(out / KEPT, unreadable)
        if unreadable:
            raise UserError(
                f"{unreadable[0]}: not a readable {KEPT_FORMAT} file; move it aside to keep the ledgers again"
            )
        yield lambda: _keep(out, ledgers, sidecars)


def _keep(out: Path, ledgers: dict[str, Any], sidecars: dict[str, Any]) -> tuple[int, int]:
    """:func:`keep_accounting`'s copy, under its lock."""
    live: dict[str, Ledger] = {}
    for rel, name in _live_files(out):
        try:
            if name == LEDGER:
                live[rel] = Ledger.load(out / rel)
            else:
                sidecars[rel] = json.loads((out / rel).read_text(encoding="utf-8"))
        except (UserError, OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # grid_privacy names an unreadable live file
    mirrored: dict[str, Ledger] = {}
    for path in sorted((out / KEPT_RUNS).rglob(LEDGER)):
        rel = f"work/{path.relative_to(out / KEPT_RUNS).as_posix()}"
        if rel not in live:
            try:
                mirrored[rel] = Ledger.load(path)
            except UserError:
                continue  # kept_runs refuses to restore from it
    runs = [(PurePosixPath(rel), ledger) for rel, ledger in live.items()]
    for rel, ledger in [*live.items(), *mirrored.items()]:
        if rel in live and _a_copy_inside(PurePosixPath(rel), ledger, runs):
            continue
        old = ledgers.get(rel)
        if old is not None:
            try:
                copy = Ledger.from_dict(old, rel)
                grown, behind = continues(ledger, copy), rel in mirrored and continues(copy, ledger)
            except UserError:
                grown, behind = False, False
            if behind:
                continue
            if not grown:
                ledgers[f"{rel}{DISPLACED}{digest(old)}"] = old
        ledgers[rel] = ledger.to_dict()
    body = {"format": KEPT_FORMAT, "ledgers": ledgers, "sidecars": sidecars}
    write_text_atomic(out / KEPT, json.dumps(body, indent=1, sort_keys=True) + "\n")
    return len(ledgers), len(sidecars)


def grid_privacy(out: Path, rows: Sequence[dict[str, Any]], delta: float) -> GridPrivacy:
    """Compose every write-ahead ledger under ``out/work`` and ``out/stale`` (``out``: an experiment's folder), and
    every copy kept in ``out/accounting.json`` that no live ledger stands for (:func:`keep_accounting`), at ``delta``
    after checking that they account for each finished DP cell of ``rows`` (module docstring)."""
    ledgers = _Ledgers(Path(out))
    ledgers.count_runs()
    claims: dict[str, list[tuple[str, str | None]]] = defaultdict(list)  # ledger key -> (cell, the run it names)
    dp_cells, unaccounted = 0, []
    budgets: dict[str, tuple[float, float] | None] = {}
    for row in rows:
        if row.get("epsilon") is None:
            continue
        cell = f"work/{row['cell']}"
        sidecar = _sidecar(ledgers, f"{cell}/{SIDECAR}")
        if sidecar is None or sidecar.get("noise_only"):
            continue
        dp_cells += 1
        budgets[row["cell"]] = _stated_budget(row, sidecar)
        accounting = _accounting_ledger(cell, sidecar, ledgers)
        if accounting is None:
            unaccounted.append(row["cell"])
        else:
            claims[accounting].append((row["cell"], sidecar.get("ledger_run")))
            ledgers.counted.add(accounting)
    for key, claimed in claims.items():
        if len(claimed) > 1 and not ledgers.position[key].startswith(f"work/{SHARED}/"):
            unaccounted.extend(cell for cell, _ in claimed)
    counted = [ledgers.read[key] for key in sorted(ledgers.counted)]  # only ledgers that were read are counted
    times = [_runs_served([run for _, run in claims.get(key, [])]) for key in sorted(ledgers.counted)]
    merged = Ledger(
        [entry for ledger, k in zip(counted, times) if ledger is not None for _ in range(k) for entry in ledger]
    )
    seeded = sum(ledger is not None and not ledger.private_release for ledger in counted)
    composed = merged.epsilon(delta) if dp_cells and not (ledgers.unreadable or seeded) else None
    stated = [budgets[cell] for cell in dict.fromkeys(unaccounted)]
    return GridPrivacy(
        None if unaccounted else composed,
        delta,
        len(counted),
        merged.count,
        dp_cells,
        tuple(unaccounted),
        seeded,
        tuple(ledgers.unreadable),
        kept=sum(key.startswith(KEPT_KEY) for key in ledgers.counted),
        ledger_epsilon=composed,
        stated=tuple(stated),
    )


def _runs_served(claims: Sequence[str | None]) -> int:
    """How many runs a ledger claimed by finished cells (each claim: the run identity its sidecar names) counts
    for: one per distinct identity the claims name (:func:`_accounting_ledger` matched each to the ledger's, so
    at most one), one more for each claim that names none (module docstring); one for a ledger no finished cell
    claims."""
    unnamed = sum(run is None for run in claims)
    return max(1, unnamed + len({run for run in claims if run is not None}))


def _stated_budget(row: dict[str, Any], sidecar: dict[str, Any]) -> tuple[float, float] | None:
    """The largest (ε, δ) a DP cell's row and sidecar state for its set (the target ε, the ε spent, the sidecar's);
    None when no finite, non-negative ε and δ are stated."""

    def valid(values: list[Any]) -> list[float]:
        numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return [v for v in numbers if math.isfinite(v) and v >= 0]

    epsilons = valid([row.get("epsilon"), row.get("epsilon_spent"), sidecar.get("epsilon")])
    deltas = valid([row.get("delta"), sidecar.get("delta")])
    return (max(epsilons), max(deltas)) if epsilons and deltas else None


def _sidecar(ledgers: _Ledgers, rel: str) -> dict[str, Any] | None:
    """The set sidecar at ``rel`` (relative to the experiment's folder), else its kept copy, else ``{}``; None (and
    named unreadable) when the live file cannot be read."""
    path = ledgers.out / rel
    if not path.exists():
        return dict(ledgers.kept_sidecars.get(rel) or {})
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError, ValueError):
        ledgers.unreadable.append(str(path))
        return None


def _accounting_ledger(cell: str, sidecar: dict[str, Any], ledgers: _Ledgers) -> str | None:
    """The key of the write-ahead ledger that accounts for the set of the cell whose folder is ``cell`` (relative to
    the experiment's folder; module docstring): the live file or a kept copy of it. None: no such ledger."""
    try:
        reported = [_release(item) for item in sidecar.get("ledger") or []]
    except UserError:
        return None
    if not reported:
        return None
    run = sidecar.get("ledger_run")  # the identity of the run the set came from (None: not stated)
    pointer = sidecar.get("ledger_file")
    if isinstance(pointer, str):
        places = [posixpath.normpath(f"{cell}/{pointer}")]
    else:  # sidecars written before ledger_file: a ledger inside the cell's own folder
        folder = ledgers.out / cell
        live = [p.relative_to(ledgers.out).as_posix() for p in folder.rglob(LEDGER)] if folder.is_dir() else []
        places = sorted({*live, *(rel for rel in ledgers.kept_ledgers if rel.startswith(f"{cell}/"))})
    for place in places:
        live_key = ledgers.live_key(place)
        kept = [KEPT_KEY + rel for rel in ledgers.kept_ledgers if rel == place or rel.startswith(place + DISPLACED)]
        for key in [*([live_key] if live_key else []), *kept]:
            ledger = ledgers.get(key)
            if ledger is not None and (run is None or ledger.run == run) and _starts_with(ledger, reported):
                return ledgers.counted_key(key)
    return None


def _a_copy_inside(where: PurePosixPath, ledger: Ledger, runs: Sequence[tuple[PurePosixPath, Ledger]]) -> bool:
    """Whether the ledger at ``where`` lies inside the folder of one of ``runs`` (path, ledger) whose ledger
    continues it: a checkpoint's copy, which counts no draw of its own."""
    return any(run != where and run.parent in where.parents and continues(outer, ledger) for run, outer in runs)


def continues(ledger: Ledger, earlier: Ledger) -> bool:
    """Whether ``ledger`` is ``earlier`` gone on (or equal to it): the same run's identity (none for both: ledgers
    of an older privlm) and ``earlier``'s releases first (consecutive releases of one event merged, however
    their entries were cut)."""
    return ledger.run == earlier.run and _starts_with(ledger, _releases(earlier))


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
