"""The public state of a grid's unfinished DP runs, kept so that a run longer than a machine's life resumes.

A DP run that takes longer than a machine lives (PE at n = 1,000: ten histograms, hours of rewriting) loses its
private work folder with the machine. Its ledger survives in ``DIR/accounting.json``
(:func:`~privlm.experiments.grid_privacy.keep_accounting`), so its draws stay counted, but a new machine would
start the run again and draw everything anew. Some run folders hold what a resume needs in public form: a
mechanism names those files (:meth:`privlm.runfolder.RunFolder.public_files`; PE: its settings, its noisy
histograms, its latest population and the rewrites journaled after it), each a function of the ledger's noisy
draws and of public inputs only.

:func:`keep_runs` mirrors them, for every cell whose set is not made yet, into ``DIR/kept-runs/`` (the same
relative paths as under ``DIR``; commit it with ``accounting.json``), the run's ledger last. :func:`restore_run`
writes a cell's mirrored run folders back where none exists (the runner calls it before a cell's method runs),
with the ledger of the two kept copies that goes further (the mirror's, or ``accounting.json``'s, which a later
:func:`keep_accounting` may have grown), and the run resumes: it draws only what it had not drawn.

**Why the count stays whole.** A file of the mirror was read before the ledger it was kept with, and a mechanism
books a draw in its ledger before the draw's output exists (write-ahead), so a mirrored output's draw is in the
mirrored ledger. The restored ledger begins with that one (:func:`~privlm.experiments.grid_privacy.continues`;
otherwise the restore is refused), has its run identity, and so stands for the copy in ``accounting.json``: the
resumed run's later draws are appended to the draws of the lost machine that anything published came from. A draw
the lost machine made after the last keep, whose output nothing published came from, may be drawn once more,
and is counted once or twice, never less than once per draw whose output was kept. The mirror holds no private
data (the mechanism's claim, stated in its ``public_files``); it is removed when the cell's set is made (the set
and its statement are then published) or the cell is set aside.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from privlm.atomic import fsync_folder, write_text_atomic
from privlm.errors import UserError
from privlm.experiments.grid_privacy import continues, kept_copy
from privlm.privacy.ledger import Ledger
from privlm.runfolder import LEDGER, RunFolder, claim
from privlm.synthesis.registry import SET_FILE, load_methods

KEPT_RUNS = "kept-runs"  # under DIR: the mirrored public state of unfinished runs (relative paths as under DIR)


def _run_folder_kinds() -> list[Callable[[Path], RunFolder]]:
    """How each registered method with a run folder finds it beside a set file."""
    return [m.command.folder for _, m in sorted(load_methods().items()) if m.command is not None]


def _cell_runs(work: Path) -> list[RunFolder]:
    """The run folders (with a ledger) of one cell's work folder."""
    folders = {kind(work / SET_FILE) for kind in _run_folder_kinds()}
    return sorted((f for f in folders if f.ledger.is_file()), key=lambda f: f.workdir.name)


def keep_runs(out: Path) -> int:
    """Mirror the public files of every unfinished cell's run folders under ``out/work`` into ``out/kept-runs``
    (module docstring), each folder's ledger read last; drop the mirrors of cells whose set is made. Returns how
    many run folders are mirrored now. Call :func:`~privlm.experiments.grid_privacy.keep_accounting` after it."""
    out = Path(out)
    mirror = out / KEPT_RUNS
    with claim(out / "work" / f"{KEPT_RUNS}.lock", wait=True):  # one mirror at a time: each a consistent snapshot
        for cell in sorted(mirror.glob("work/*")):
            if _set_made(out, cell.name):
                shutil.rmtree(cell)
        for cell in sorted((out / "work").glob("*/")):
            if not _set_made(out, cell.name):
                _mirror_cell(out, cell)
    return sum(1 for _ in mirror.glob("work/*/*"))


def _set_made(out: Path, cell: str) -> bool:
    return (out / "sets" / f"{cell}.jsonl").exists()


def _mirror_cell(out: Path, cell: Path) -> None:
    """Mirror the public files of ``cell``'s run folders, each ledger read after its folder's other files."""
    for run in _cell_runs(cell):
        files = {path.name: path.read_bytes() for path in run.public_files() if path.parent == run.workdir}
        if not files:
            continue
        files[LEDGER] = run.ledger.read_bytes()  # last: it books every draw behind the files read above
        target = out / KEPT_RUNS / run.workdir.relative_to(out)
        target.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            if not (target / name).is_file() or (target / name).read_bytes() != data:
                write_text_atomic(target / name, data.decode("utf-8"))
        for stale in target.iterdir():
            if stale.name not in files:
                stale.unlink()


def drop_kept_run(out: Path, cell: str) -> None:
    """Remove the mirror of cell ``cell`` (its set is made, or the cell is set aside)."""
    shutil.rmtree(Path(out) / KEPT_RUNS / "work" / cell, ignore_errors=True)


def restore_run(out: Path, cell: str) -> list[Path]:
    """Write back the mirrored run folders of cell ``cell`` that do not exist under ``out/work`` (module
    docstring); returns the folders restored. Each is built beside its place and renamed into it, so a kill leaves
    either nothing or the whole folder.

    Raises:
        UserError: the mirror's ledger and the copy kept in ``accounting.json`` are not one run's, one going on
            from the other (restoring either could leave a draw uncounted)."""
    out = Path(out)
    restored = []
    for kept in sorted((out / KEPT_RUNS / "work" / cell).glob("*")):
        rel = kept.relative_to(out / KEPT_RUNS)
        place = out / rel
        if place.exists() or not (kept / LEDGER).is_file():
            continue
        ledger = _further_ledger(Ledger.load(kept / LEDGER), kept_copy(out, f"{rel.as_posix()}/{LEDGER}"), kept)
        building = place.with_name(place.name + ".restoring")
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir(parents=True)
        for file in kept.iterdir():
            if file.name != LEDGER:
                shutil.copyfile(file, building / file.name)
        ledger.save(building / LEDGER)
        fsync_folder(building)
        os.rename(building, place)
        fsync_folder(place.parent)
        restored.append(place)
    return restored


def _further_ledger(mirrored: Ledger, accounted: dict[str, Any] | None, where: Path) -> Ledger:
    """Of the mirror's ledger and ``accounting.json``'s copy (None: none kept), the one that goes on from the other."""
    if accounted is None:
        return mirrored
    copy = Ledger.from_dict(accounted, f"{KEPT_RUNS}: accounting.json's copy for {where}")
    if continues(copy, mirrored):
        return copy
    if continues(mirrored, copy):
        return mirrored
    raise UserError(
        f"{where}: its ledger and the copy kept in accounting.json are not one run going on (run {mirrored.run} "
        f"with {mirrored.count} releases, run {copy.run} with {copy.count}); restoring either could leave a draw "
        f"uncounted: remove {where} to start the run afresh (the kept draws stay counted)"
    )
