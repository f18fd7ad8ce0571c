"""The public state of a grid's unfinished runs (DP runs and their noise-only controls), kept so that a run longer than
a machine's life resumes.

A DP run that takes longer than a machine lives (PE at n = 1,000: ten histograms, hours of rewriting) loses its
private work folder with the machine. Its ledger survives in ``DIR/accounting.json``
(:func:`~privlm.experiments.grid_privacy.keep_accounting`), so its draws stay counted, but a new machine would start
the run again and draw everything anew. Some run folders hold what a resume needs in public form: a mechanism names
those files (:meth:`privlm.runfolder.RunFolder.public_files`; PE: its settings, its noisy histograms, its latest
population and the rewrites journaled after it), each a function of the ledger's noisy draws and of public inputs
only.

:func:`keep_runs` mirrors them, for every cell whose set is not made yet, into ``DIR/kept-runs/`` (the same relative
paths as under ``DIR/work``, a name git ignores; commit it with ``accounting.json``), each run's ledger read after
its other files, and in the same call, under one lock, ``accounting.json`` gets every live ledger (read after the
mirrored files, so going at least as far) before the mirror is written: a mirror is never ahead of
``accounting.json``. :func:`restore_run` writes a cell's mirrored run folders back where none exists (the runner
calls it before a cell's method runs), with the ledger of the two kept copies that goes further (the mirror's, or
``accounting.json``'s), and the run resumes: it draws only what it had not drawn.

**Why the count stays whole.** A mechanism books a draw in its ledger before the draw's output exists (write-ahead),
and a mirrored file was read before the ledger it is mirrored with, so a mirrored output's draw is in the mirrored
ledger; the mirror's ledger is written before its files (a kill part-way leaves a ledger ahead of them), and
``accounting.json`` held it (or a ledger going further) before the mirror was written. The restored ledger begins
with it (:func:`~privlm.experiments.grid_privacy.continues`; otherwise, or when ``accounting.json`` cannot be read,
the restore is refused) and has its run identity, so it stands for the kept copy: the resumed run's later draws are
appended to those of the lost machine. A draw the lost machine made after the last keep, whose output nothing
published came from, may be drawn once more and is then counted once or twice. PE also refuses a folder holding more
histograms than its ledger books. ASSUMPTION (said in ``docs/synthesis.md``): a machine given up is not used again,
and one machine resumes a given mirror; two machines resuming one mirror would write two ledgers of one identity,
and ``accounting.json`` keeps only the one that goes further. The mirror holds no private data (the mechanism's
claim, stated in its ``public_files``; PE names none for a run without noise, whose histograms are exact counts). A
run that releases nothing (:meth:`privlm.runfolder.RunFolder.releases_nothing`: PE's noise-only control, which reads
no private data and never writes a ledger) is mirrored without one and resumes on a new machine like a DP run. The
mirror is removed when the cell's set is made (the set and its statement are then published) or the cell is set
aside, its ledger staying in ``accounting.json``. Beside a cell's mirrored runs lie its wall clock
(:mod:`privlm.experiments.wall_clock`), so the set's time counts every machine's, and the method hash its runs are
made with (:data:`METHOD_RECORD`, a hash of the public grid configuration), so a new machine resumes a run of the
grid's own parameters even when an older row of the cell is in the log; both are written back with the runs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from privlm.atomic import write_bytes_atomic
from privlm.errors import UserError
from privlm.experiments.grid_privacy import KEPT_RUNS, continues, keeping, kept_copy
from privlm.experiments.wall_clock import WALL
from privlm.privacy.ledger import Ledger
from privlm.runfolder import LEDGER, RunFolder
from privlm.synthesis.registry import SET_FILE, load_methods

RESTORING = ".restoring-"  # a restore being built: a folder under DIR, outside work/ and stale/ (whose ledgers count)
METHOD_RECORD = "method.json"  # in a cell's work folder: the method hash its unfinished run is made with
CELL_RECORDS = (WALL, METHOD_RECORD)  # kept beside a cell's mirrored runs and written back with them


def _run_folder_kinds() -> list[Callable[[Path], RunFolder]]:
    """How each registered method with a run folder finds it beside a set file."""
    return [m.command.folder for _, m in sorted(load_methods().items()) if m.command is not None]


def _cell_runs(work: Path) -> list[RunFolder]:
    """The run folders of one cell's work folder that have a ledger, or that release nothing (a noise-only control:
    :meth:`~privlm.runfolder.RunFolder.releases_nothing`)."""
    folders = {kind(work / SET_FILE) for kind in _run_folder_kinds()}
    return sorted((f for f in folders if f.ledger.is_file() or f.releases_nothing()), key=lambda f: f.workdir.name)


def keep_runs(out: Path) -> tuple[int, int, int]:
    """Under the lock of ``out``'s keeps (:func:`~privlm.experiments.grid_privacy.keeping`): read the public files of
    every unfinished cell's run folders under ``out/work`` (each run's ledger after its files), copy the ledgers
    and sidecars into ``accounting.json`` (read later, every live ledger goes at least as far as the one read with
    its files), then write the mirrors into ``out/kept-runs`` and drop those of cells whose set is made: a mirror
    is never ahead of ``accounting.json``. Returns how many run folders are mirrored and how many ledgers and
    sidecars ``accounting.json`` holds."""
    out = Path(out)
    with keeping(out) as keep_ledgers:
        snapshots = [
            (run, _snapshot(run))
            for cell in sorted((out / "work").glob("*/"))
            if not _set_made(out, cell.name)
            for run in _cell_runs(cell)
        ]
        ledgers, sidecars = keep_ledgers()
        for cell in sorted((out / KEPT_RUNS).glob("*/")):
            if _set_made(out, cell.name):
                shutil.rmtree(cell)  # accounting.json holds its ledger: it was copied before it was mirrored
        for run, files in snapshots:
            _mirror_run(out, run, files)
        for cell in sorted({run.workdir.parent for run, files in snapshots if files}):
            for record in CELL_RECORDS:  # the cell's time so far and the parameters its runs are made with
                _mirror_file(cell / record, out / KEPT_RUNS / cell.name / record)
    return sum(1 for _ in (out / KEPT_RUNS).glob("*/*/")), ledgers, sidecars


def _set_made(out: Path, cell: str) -> bool:
    return (out / "sets" / f"{cell}.jsonl").exists()


def _snapshot(run: RunFolder, tries: int = 3) -> dict[str, bytes]:
    """The run's public files and, read after them, its ledger (it books every draw behind them: write-ahead); read
    again when a file goes while being read (the run, in another process, moved on); {} when it names none. A run
    that releases nothing (its settings say so, and it never writes a ledger) is kept without one."""
    for attempt in range(tries):
        try:
            files = {
                p.name: p.read_bytes() for p in run.public_files() if p.parent == run.workdir and not p.is_symlink()
            }
            if files and not run.releases_nothing():
                files[LEDGER] = run.ledger.read_bytes()
            return files
        except FileNotFoundError:
            if attempt == tries - 1:
                raise
    return {}


def _mirror_run(out: Path, run: RunFolder, files: dict[str, bytes]) -> None:
    """Mirror one run folder from its snapshot (:func:`_snapshot`; {}: nothing public): its ledger (when it has
    one) written first (a kill part-way leaves a ledger ahead of the files: an over-count, never files whose draws
    it lacks), then its files; files it no longer names go."""
    if not files:
        return
    target = out / KEPT_RUNS / run.workdir.relative_to(out / "work")
    target.mkdir(parents=True, exist_ok=True)
    for name in [*([LEDGER] if LEDGER in files else []), *sorted(set(files) - {LEDGER})]:
        _write_if_changed(target / name, files[name])
    for stale in target.iterdir():
        if stale.name not in files:
            stale.unlink()


def _mirror_file(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` when it exists and differs."""
    try:
        data = source.read_bytes()
    except FileNotFoundError:  # none, or its cell's folder moved aside meanwhile
        return
    _write_if_changed(target, data)


def _write_if_changed(path: Path, data: bytes) -> None:
    if not path.is_file() or path.read_bytes() != data:
        write_bytes_atomic(path, data)


def drop_kept_run(out: Path, cell: str) -> None:
    """Remove the mirror of cell ``cell`` (set aside), under the lock of the keeps and after a copy of the ledgers
    (``accounting.json`` already holds its ledger, copied before it was mirrored: this is for a hand-made mirror)."""
    mirror = Path(out) / KEPT_RUNS / cell
    with keeping(Path(out)) as keep_ledgers:  # checked under the lock: a keep writing this mirror has finished
        if mirror.exists():
            keep_ledgers()
            shutil.rmtree(mirror, ignore_errors=True)


def restore_run(out: Path, cell: str) -> list[Path]:
    """Write back the mirrored run folders of cell ``cell`` that do not exist under ``out/work`` (module
    docstring); returns the folders restored. Each is built in ``out/.restoring-*`` (where no ledger counts),
    every file fsync'd, and renamed into its place, so a kill leaves either nothing or the whole folder. The
    cell's mirrored wall clock and method record (:data:`METHOD_RECORD`: the runner then knows the restored runs'
    parameters, not only its rows') are written back too where the cell has none. A mirror kept without a ledger
    (a run that releases nothing) is restored without one, whatever ``accounting.json`` holds at its path (another
    run's, set aside: it stays counted there).

    Raises:
        UserError: ``accounting.json`` cannot be read, or the mirror's ledger and the copy kept there are not one
            run's, one going on from the other (restoring either could leave a draw uncounted)."""
    out = Path(out)
    restored = []
    for kept in sorted((out / KEPT_RUNS / cell).glob("*/")):
        rel = Path("work") / kept.relative_to(out / KEPT_RUNS)
        place = out / rel
        if place.exists():
            continue
        ledger = None
        if (kept / LEDGER).is_file():
            accounted = kept_copy(out, f"{rel.as_posix()}/{LEDGER}", strict=True)
            ledger = _further_ledger(Ledger.load(kept / LEDGER), accounted, kept)
        building = Path(tempfile.mkdtemp(prefix=RESTORING, dir=out))  # this call's own: others may restore too
        try:
            for file in sorted(kept.iterdir()):
                if file.name != LEDGER and file.is_file() and not file.is_symlink():
                    write_bytes_atomic(building / file.name, file.read_bytes())
            if ledger is not None:
                ledger.save(building / LEDGER)
            place.parent.mkdir(parents=True, exist_ok=True)
            os.rename(building, place)
        finally:
            shutil.rmtree(building, ignore_errors=True)
        restored.append(place)
    for record in CELL_RECORDS:  # the earlier machines' time; the method hash the runs were made with
        if not (out / "work" / cell / record).exists():
            _mirror_file(out / KEPT_RUNS / cell / record, out / "work" / cell / record)
    return restored


def _further_ledger(mirrored: Ledger, accounted: dict[str, Any] | None, where: Path) -> Ledger:
    """Of the mirror's ledger and ``accounting.json``'s copy (None: none kept), the one that goes on from the other."""
    if accounted is None:
        return mirrored
    copy = Ledger.from_dict(accounted, f"accounting.json's copy for {where}")
    if continues(copy, mirrored):
        return copy
    if continues(mirrored, copy):
        return mirrored
    raise UserError(
        f"{where}: its ledger and the copy kept in accounting.json are not one run going on (run {mirrored.run} "
        f"with {mirrored.count} releases, run {copy.run} with {copy.count}); restoring either could leave a draw "
        f"uncounted: to start the run afresh, run `privlm experiment CONFIG --out DIR --keep-accounting` (it folds the "
        f"mirror's ledger into accounting.json, so its draws stay counted), then remove {where}"
    )
