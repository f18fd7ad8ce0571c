"""``privlm experiment CONFIG --out DIR [--resume]``: run an evaluation grid and write its report; with
``--keep-accounting``, only copy the folder's ledgers into its ``accounting.json``; with ``--pending``, only list
the cells still to run."""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import typer

from privlm.cli._common import console, err_console, print_json
from privlm.cli._progress import cli_progress
from privlm.errors import UserError
from privlm.progress import Task


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` as ``(K, N)``; :class:`UserError` for anything else (range checked by the runner)."""
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if match is None:
        raise UserError(f"--shard must look like K/N, e.g. 0/2 (got {text!r})")
    return int(match[1]), int(match[2])


def experiment_command(
    config_path: Path = typer.Argument(..., metavar="CONFIG", help="TOML experiment file (see experiments/)."),
    out: Path = typer.Option(..., "--out", help="Output folder: results.jsonl, sets/, report.md, report.html."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run; finished cells are kept."),
    only: list[str] | None = typer.Option(
        None, "--only", help="Run only this method's cells now (repeatable); the others wait for a later --resume."
    ),
    cell_patterns: list[str] | None = typer.Option(
        None,
        "--cells",
        metavar="GLOB",
        help="Run only the cells whose key matches this shell pattern, e.g. 'gradmm_n20_*_eps1' (repeatable).",
    ),
    shard: str = typer.Option(
        "0/1",
        "--shard",
        metavar="K/N",
        help="Run only the cells whose grid index is K mod N: start N processes on one --out to split the grid.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results rows as one JSON object."),
    pending: bool = typer.Option(
        False,
        "--pending",
        help="Run no cell: print the keys of the cells a --resume with the same --only, --cells and --shard would "
        "take up now (unfinished, or made with other method parameters; a cell another process is running "
        "included), one per line; nothing when none is left. Loads no model or data.",
    ),
    keep: bool = typer.Option(
        False,
        "--keep-accounting",
        help="Run no cell: copy the ledgers and privacy statements of every draw under DIR/work, a DP training "
        "still in its steps included, into DIR/accounting.json, and the public state of unfinished runs (PE) into "
        "DIR/kept-runs, from which a new machine resumes them (commit both before giving up a machine).",
    ),
) -> None:
    """Run every cell (method × ε × n per class × seed) of CONFIG: make the training set, fine-tune, score, attack."""
    shard_k_n = parse_shard(shard)
    if keep and pending:
        raise UserError("--keep-accounting and --pending each run no cell: give one of them")
    if keep:
        keep_command(out, chosen=bool(only or cell_patterns or shard_k_n != (0, 1)), as_json=as_json)
        return
    from privlm.experiments.config import load_config

    config = load_config(config_path)
    if pending:
        from privlm.experiments.finished import pending_cells  # imports no torch (tests/cli/test_help_imports.py)

        keys = [
            cell.key for cell in pending_cells(config, out, only=only, shard=shard_k_n, cells_matching=cell_patterns)
        ]
        if as_json:
            print_json({"config_hash": config.hash, "out": str(out), "pending": keys})
        else:
            for key in keys:
                print(key)
        return
    from privlm.experiments.runner import Hooks, run_experiment

    command = ["privlm", "experiment", str(config_path), "--out", str(out), *(["--resume"] if resume else [])]
    command += [arg for method in only or () for arg in ("--only", method)]
    command += [arg for pattern in cell_patterns or () for arg in ("--cells", pattern)]
    command += ["--shard", shard] if shard_k_n != (0, 1) else []
    start = time.perf_counter()
    with cli_progress(err_console) as progress:  # on stderr: --json output stays clean
        cells = progress.task("cells", total=len(config.cells()))
        current: list[Task] = []  # the stage of the cell being run

        def phase(text: str) -> None:
            for stage in current:
                stage.done()
            current[:] = [progress.task(text, transient=True)]

        def steps(total: int) -> None:
            for stage in current:
                stage.update(total=total, completed=0)

        def step(done: int, loss: float | None) -> None:
            for stage in current:
                stage.update(completed=done)

        def cell(done: int, total: int, key: str) -> None:
            for stage in current:
                stage.done()
            current.clear()
            cells.update(completed=done, description=f"cells (now: {key})")

        def warn(text: str) -> None:
            err_console.print(f"[yellow]warning:[/] {text}")

        hooks = Hooks(cell=cell, phase=phase, steps=steps, step=step, warn=warn, progress=progress)
        rows = run_experiment(
            config,
            out,
            resume=resume,
            hooks=hooks,
            only=only,
            shard=shard_k_n,
            command=shlex.join(command),
            cells_matching=cell_patterns,
        )
        cells.done()
    elapsed = time.perf_counter() - start
    if as_json:
        print_json({"config_hash": config.hash, "out": str(out), "wall_time_s": round(elapsed, 2), "rows": rows})
        return
    console.print(
        f"{len(rows)} cells in {out}/results.jsonl; report: {out}/report.md, {out}/report.html [{elapsed:.0f} s]"
    )


def keep_command(out: Path, chosen: bool, as_json: bool) -> None:
    """``--keep-accounting``: :func:`~privlm.experiments.kept_runs.keep_runs` on ``out``: the unfinished runs' public
    state, then :func:`~privlm.experiments.grid_privacy.keep_accounting` (CONFIG is not
    read: the copies are of whatever draws the folder holds). ``chosen``: whether cells were chosen too (refused:
    the copy is of the whole folder)."""
    from privlm.experiments.grid_privacy import KEPT, KEPT_RUNS
    from privlm.experiments.kept_runs import keep_runs

    if chosen:
        raise UserError("--keep-accounting copies the whole folder's accounting: drop --only, --cells and --shard")
    if not any((out / name).exists() for name in ("work", "stale", KEPT)):
        raise UserError(f"{out}: not an experiment folder (no work/, stale/ or {KEPT}): nothing to keep")
    runs, ledgers, sidecars = keep_runs(out)  # the mirrors, then accounting.json (it folds their ledgers in)
    if as_json:
        print_json(
            {
                "out": str(out),
                "accounting": str(out / KEPT),
                "ledgers": ledgers,
                "sidecars": sidecars,
                "kept_runs": str(out / KEPT_RUNS),
                "runs": runs,
            }
        )
        return
    console.print(
        f"{out / KEPT}: {ledgers} ledgers and {sidecars} set privacy statements kept; {out / KEPT_RUNS}: the public "
        f"state of {runs} unfinished runs; commit both"
    )


def register(app: typer.Typer) -> None:
    """Add ``privlm experiment``."""
    app.command("experiment")(experiment_command)
