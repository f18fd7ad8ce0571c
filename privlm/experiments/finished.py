"""Which cells of an experiment grid a folder has finished, read from the folder alone: the rows of
``DIR/results.jsonl`` still valid for a configuration (matched per method through the hashes, or through the
saved configurations for rows written before the hashes existed), and so the cells a run would run now
(:func:`pending_cells`, ``privlm experiment --pending``). Loads no model, no data and no torch: a driver asks it
before each stage of a queue (:mod:`privlm.experiments.runner` runs the cells)."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from privlm.errors import UserError
from privlm.experiments.config import Cell, ExperimentConfig, method_hash, shared_hash
from privlm.experiments.records import ResultsLog
from privlm.synthesis.registry import get_method


def check_methods(config: ExperimentConfig) -> None:
    """Refuse (UserError) a method table that names an unknown method, gives ε to a method that takes none,
    or sets a parameter its method does not accept: checked before the first cell runs."""
    for spec in config.methods:
        method = get_method(spec.name)
        if not method.takes_epsilon and spec.epsilons != (None,):
            raise UserError(f"method {spec.name!r} takes no epsilon; remove methods.{spec.name}.epsilons")
        unknown = sorted(set(spec.params) - method.params)
        if unknown:
            raise UserError(
                f"methods.{spec.name}: unknown parameter(s) {unknown}; accepted: {sorted(method.params) or 'none'}"
            )


def saved_configs(out: Path) -> dict[str, dict[str, Any]]:
    """Every configuration this folder has run, by hash: ``configs/<hash>.json`` and ``config.json``."""
    paths = [*sorted((out / "configs").glob("*.json")), out / "config.json"]
    saved = [json.loads(p.read_text()) for p in paths if p.exists()]
    return {str(c["hash"]): c for c in saved if "hash" in c}


def _row_hashes(row: dict[str, Any], saved: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
    """A row's (shared hash, method hash): its own fields, or — for a row written before they existed —
    derived from the saved configuration it was made with."""
    if "shared_hash" in row and "method_hash" in row:
        return str(row["shared_hash"]), str(row["method_hash"])
    previous = saved.get(str(row.get("config_hash")))
    if previous is None:
        return None
    return shared_hash(previous), method_hash(previous, str(row["method"]))


def finished_rows(
    log: ResultsLog, config: ExperimentConfig, resume: bool, saved: dict[str, dict[str, Any]]
) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """The finished rows still valid for ``config`` by cell key, and the keys of cells to rerun because
    their method's parameters changed. Rows of cells no longer in the grid are left out."""
    rows = log.read()
    if rows and not resume:
        raise UserError(f"{log.path} already has {len(rows)} rows; pass --resume to continue, or use a new --out")
    grid = {c.key: c for c in config.cells()}
    shared, methods = config.shared_hash, {m.name: config.method_hash(m.name) for m in config.methods}
    saved = {**saved, config.hash: {"hash": config.hash, **config.to_dict()}}
    done: dict[str, dict[str, Any]] = {}
    stale: set[str] = set()
    for row in rows:
        hashes = _row_hashes(row, saved)
        if hashes is None or hashes[0] != shared:
            raise UserError(
                f"{log.path} holds rows made with other shared settings (model, data, pool, splits, fine-tuning, "
                f"δ; configuration hash {row.get('config_hash')}); use a new --out"
            )
        key = str(row["cell"])
        if key not in grid:
            continue
        if hashes[1] == methods[grid[key].method]:
            done[key] = row
            stale.discard(key)
        elif key not in done:
            stale.add(key)
    return done, stale


def pending_cells(
    config: ExperimentConfig,
    out: str | Path,
    *,
    only: Collection[str] | None = None,
    shard: tuple[int, int] = (0, 1),
    cells_matching: Collection[str] | None = None,
) -> list[Cell]:
    """The cells that :func:`run_experiment` with the same choice (``only``, ``shard``, ``cells_matching``) would
    run into ``out`` now, in grid order: those without a finished row, and those whose row was made with other
    method parameters (rerun). Reads only ``out``'s results and saved configurations: no model, no data."""
    check_choice(config, only, shard)
    out = Path(out)
    done, _ = finished_rows(ResultsLog(out / "results.jsonl"), config, True, saved_configs(out))
    return [
        cell
        for index, cell in enumerate(config.cells())
        if cell.key not in done and chosen(cell, index, only, shard, cells_matching)
    ]


def check_choice(config: ExperimentConfig, only: Collection[str] | None, shard: tuple[int, int]) -> None:
    """Refuse a shard out of range and ``only`` methods the configuration lacks (:class:`UserError`)."""
    index_k, shards = shard
    if not (shards >= 1 and 0 <= index_k < shards):
        raise UserError(f"--shard must be K/N with 0 <= K < N (got {index_k}/{shards})")
    check_methods(config)
    names = [m.name for m in config.methods]
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise UserError(f"--only: {unknown} not among the configuration's methods {names}")


def chosen(
    cell: Cell,
    index: int,
    only: Collection[str] | None,
    shard: tuple[int, int],
    cells_matching: Collection[str] | None,
) -> bool:
    """Whether the cell at grid ``index`` is among those chosen: its method in ``only`` (None: all), its index
    ``k`` mod ``n`` for ``shard`` (k, n), its key matching one of the shell patterns ``cells_matching`` (None: all)."""
    if only is not None and cell.method not in only:
        return False
    if index % shard[1] != shard[0]:
        return False
    return cells_matching is None or any(fnmatch.fnmatchcase(cell.key, p) for p in cells_matching)
