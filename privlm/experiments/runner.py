"""Run an experiment grid with per-cell caching and resume; the report is written at the end.

``DIR/config.json`` — the configuration and its hash (``DIR/configs/<hash>.json``: every one the
folder has run); ``DIR/sets/<cell>.jsonl`` — each cell's training
set, cached the moment it is made (atomic write) and reused on resume; ``DIR/work/<cell>/`` — scratch
space of a method (e.g. GRADMM's saved DP release, which a resume must reuse rather than redraw);
``DIR/sets/<cell>.time.json``, the seconds the set took, summed over the processes (and machines) that made it,
with their count (a row's ``set_s``, also when a later process or machine writes the row: it lies beside the
set, which is kept when the private work folder is lost; None when not kept; a lower bound when it names
``unrecorded_segments``: a cell begun before privlm kept a clock); ``DIR/work/<cell>/wall.json``, those segments
and the evaluation's, each process's kept up to date while it runs (:mod:`privlm.experiments.wall_clock`; a row's
``wall_time_s`` is ``set_s`` plus the evaluation's segments, a lower bound too for a cell begun before the clock);
``DIR/results.jsonl`` — one row per finished cell, appended durably; ``DIR/sets/<cell>.card.md`` — the
data card of each cell's set, written with the set (:mod:`privlm.experiments.set_cards`). A resumed run skips
every cell that already has a row and reproduces the others exactly (everything is seeded). Rows are matched per
method: a grid that gained seeds, sizes, ε values or methods keeps its finished cells; the cells of a
method whose parameters changed are rerun (their old set and scratch folder move to ``DIR/stale/`` when the
cell is reached, under its lock; a set records the method hash it was made with in its time file, an unfinished
run in ``work/<cell>/method.json``, kept with its mirror, so a set whose row was never written is not evaluated
under other parameters);
rows made with other shared settings (model, data, pool, splits, fine-tuning) stop it with an error.
Several processes may share ``DIR`` (``--shard``, or simply more ``--resume`` runs): a cell is run under
an ``flock`` on ``DIR/work/<cell>.lock`` — a cell another live process holds is skipped — and the log is
re-read before each cell, so a cell another process finished meanwhile is not run again.

Data: the private pool is ``pool_per_class`` examples per class of the train split (``data_seed``), or
the whole train split (``"all"``); the membership non-members are as many other train examples;
validation and test are seeded subsets of their own splits. All cells share them. With ``head_probe`` each
row also holds ``head_accuracy`` (and its interval): the head-only classifier fitted on the cell's set
(:mod:`privlm.training.head_probe`), on the test prompts' features computed once.
``DIR/work/private-cache/<shared hash>/`` holds what methods compute once from the private pool for all
cells (GRADMM's per-example last-layer factors): PRIVATE, as sensitive as the data (``work/`` is never
published; ``work/`` folders are git-ignored). ``DIR/work/<cell>/evaluation/`` holds a running cell's
evaluation state — the head-only result and the fine-tune's checkpoint, saved every epoch and every ten minutes
within one (:mod:`privlm.lm.finetune_checkpoint`) — so a killed cell resumes where it was last saved; it is private
too (weights fitted without noise to the cell's set, which is real data for the ``random`` reference) and
is deleted once the cell's row is written.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privlm.atomic import atomic_path, json_once, write_text_atomic
from privlm.digest import digest
from privlm.errors import UserError
from privlm.evaluation.evaluate import fit_and_score
from privlm.experiments.config import WHOLE_SPLIT, Cell, ExperimentConfig
from privlm.experiments.finished import check_choice, chosen, finished_rows, saved_configs
from privlm.experiments.grid_privacy import KEPT_RUNS
from privlm.experiments.kept_runs import METHOD_RECORD, drop_kept_run, keep_runs, restore_run
from privlm.experiments.records import ResultsLog, read_training_set, write_jsonl_atomic
from privlm.experiments.report import write_report
from privlm.experiments.sampling import per_class_indices, subsample
from privlm.experiments.set_cards import has_card, write_set_card
from privlm.experiments.wall_clock import WALL, WallClock
from privlm.lm.features import last_token_features
from privlm.lm.finetune_checkpoint import EpochCheckpoint
from privlm.progress import SILENT, Progress
from privlm.resources.datasets import Dataset, load_dataset
from privlm.resources.models import load_model
from privlm.runfolder import claim
from privlm.synthesis.registry import Method, MethodContext, get_method
from privlm.training.fingerprint import model_fingerprint
from privlm.training.head_probe import head_probe, prompt_features


@dataclass
class Hooks:
    """Progress callbacks: ``cell(done, total, key)`` before each cell, ``phase(text)`` within it,
    ``steps(total)`` when fine-tuning starts and ``step(step, loss)`` after each optimizer step; ``warn(text)``
    for what a user must not miss (a set smaller than asked); ``progress``: where a method shows its own bars
    (:attr:`privlm.synthesis.registry.MethodContext.progress`)."""

    cell: Callable[[int, int, str], None] = lambda done, total, key: None
    phase: Callable[[str], None] = lambda text: None
    warn: Callable[[str], None] = lambda text: None
    steps: Callable[[int], None] = lambda total: None
    step: Callable[[int, float], None] = lambda step, loss: None
    progress: Progress = SILENT


def _short_classes(train_set: Sequence[tuple[str, int]], label_names: Sequence[str], cell: Cell) -> str:
    """The classes of a cell's set with fewer than ``cell.n_per_class`` examples, as "name: count, …" ("" when
    none is short; a whole-split cell, n = 0, never is). Public: the counts of a set already made."""
    counts = Counter(label for _, label in train_set)
    return ", ".join(f"{name}: {counts[k]:,}" for k, name in enumerate(label_names) if counts[k] < cell.n_per_class)


def _set_aside(out: Path, key: str) -> None:
    """Move a stale cell's cached set (with its card and time) and scratch folder to ``out/stale/`` (kept, never
    reused). Call under the cell's lock, so that no live process is writing into what is moved."""
    sets = out / "sets"
    moved = [sets / f"{key}.jsonl", sets / f"{key}.card.md", sets / f"{key}.time.json", out / "work" / key]
    if sources := [source for source in moved if source.exists()]:
        (out / "stale").mkdir(parents=True, exist_ok=True)  # a folder of its own, even for two in one second
        target = Path(tempfile.mkdtemp(prefix=f"{key}.{time.strftime('%Y%m%dT%H%M%S')}.", dir=out / "stale"))
        for source in sources:
            source.rename(target / source.name)
    drop_kept_run(out, key)  # its ledger stays counted from accounting.json


def _outdated(out: Path, key: str, method_hash: str, stale_row: bool) -> bool:
    """Whether cell ``key``'s cached set, or its unfinished run, was made with other method parameters than
    ``method_hash``, as recorded in the set's time file or, before the set exists, in ``work/<key>/method.json``
    or, before a kept run is restored from another machine, in its mirror's; where none records one (made, or
    mirrored, before they did), as its rows say (``stale_row``). So a set whose row was never written (its process
    killed after making it) is not evaluated under parameters it was not made with, and the set or run of this
    grid's parameters is kept even when an older row of the cell is still in the log. Call under the cell's lock."""
    records = (
        out / "sets" / f"{key}.time.json",
        out / "work" / key / METHOD_RECORD,
        out / KEPT_RUNS / key / METHOD_RECORD,
    )
    for record in records:
        if record.exists() and (recorded := json.loads(record.read_text()).get("method_hash")) is not None:
            return recorded != method_hash
    return stale_row


def run_experiment(
    config: ExperimentConfig,
    out: str | Path,
    *,
    resume: bool = False,
    hooks: Hooks | None = None,
    only: Collection[str] | None = None,
    shard: tuple[int, int] = (0, 1),
    command: str | None = None,
    cells_matching: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """Run every unfinished cell of ``config`` into ``out`` — or only those of the methods in ``only``
    (same configuration, same hash: a way to order a long grid), and with ``shard=(k, n)`` only the
    cells whose grid index is ``k`` mod ``n`` (so ``n`` processes sharing ``out`` split the grid), and with
    ``cells_matching`` only the cells whose key matches one of its shell patterns (``gradmm_n20_*_eps1``) —
    then write the report of all finished cells, including those other shards finished meanwhile
    (``command`` is quoted in it); returns the finished rows, in grid order."""
    hooks = hooks or Hooks()
    out = Path(out)
    check_choice(config, only, shard)
    log = ResultsLog(out / "results.jsonl")
    done, stale = finished_rows(log, config, resume, saved_configs(out))
    if stale:  # each is set aside under its lock when reached (:func:`_outdated`), never from under a live process
        hooks.phase(f"{len(stale)} cell(s) were made with other method parameters and will be rerun")
    saved_config = json.dumps({"hash": config.hash, **config.to_dict()}, indent=2) + "\n"
    write_text_atomic(out / "configs" / f"{config.hash}.json", saved_config)
    write_text_atomic(out / "config.json", saved_config)

    train = load_dataset(config.data_spec(), split="train", seed=config.data_seed, labels=config.labels)
    if config.pool_per_class == WHOLE_SPLIT:
        pool, nonmembers = list(train.examples), []  # parse_config refused mia = true here
    else:
        pool_idx = per_class_indices(train.labels, config.pool_per_class, config.data_seed)
        pool = [train.examples[i] for i in pool_idx]
        held_out_idx = per_class_indices(train.labels, config.pool_per_class, config.data_seed + 1, exclude=pool_idx)
        nonmembers = [train.examples[i] for i in held_out_idx]
    validation = None
    if config.validation_size is not None:
        valid = load_dataset(config.data_spec(), split="validation", seed=config.data_seed, labels=config.labels)
        validation = subsample(valid.examples, config.validation_size, config.data_seed)
    test = subsample(
        load_dataset(config.data_spec(), split="test", seed=config.data_seed, labels=config.labels).examples,
        config.test_size,
        config.data_seed,
    )
    template, words = train.verbalizer.template, train.verbalizer.label_words
    model, tokenizer = load_model(config.model, seed=config.data_seed)
    private_cache = out / "work" / "private-cache" / config.shared_hash
    features = functools.cache(lambda: _pool_features(model, tokenizer, pool, private_cache / "pool-features.npy"))
    probe = config.head_probe_config()
    probe_length = 0 if probe is None else probe.max_length
    test_features = functools.cache(  # the test split's prompt features, computed once for every cell's head probe
        lambda: prompt_features(model, tokenizer, [t for t, _ in test], template, probe_length)
    )
    test_classes = torch.tensor([y for _, y in test], dtype=torch.long)
    model_key = functools.cache(lambda: model_fingerprint(model))  # binds a fine-tune checkpoint to the model

    saved = saved_configs(out)
    public_inputs = {
        "class names": ", ".join(train.label_names),
        "label words": ", ".join(w.strip() for w in words),
        "prompt template": repr(template),
        "description (describe)": getattr(config.labels, "description", None),
    }

    def card(cell: Cell) -> None:
        """The data card of a cell's set, unless it has one (:mod:`privlm.experiments.set_cards`)."""
        set_path = out / "sets" / f"{cell.key}.jsonl"
        if set_path.exists() and not has_card(out, cell):
            rows = [json.loads(line) for line in set_path.read_text().splitlines() if line.strip()]
            write_set_card(out, cell, get_method(cell.method), config, public_inputs, rows)

    def finished() -> tuple[dict[str, dict[str, Any]], set[str]]:
        """Every valid finished row in the log now, by cell key, and the keys whose rows are stale (other
        processes may have added rows since this run started)."""
        return finished_rows(log, config, True, saved)

    def run_cell(cell: Cell) -> dict[str, Any]:
        """Make (or reuse) the cell's training set, fine-tune, score and attack; returns the row, appended to the log.
        Its times are summed over every process that worked on it (:mod:`privlm.experiments.wall_clock`)."""
        set_path = out / "sets" / f"{cell.key}.jsonl"
        # an unfinished run kept public by another machine, with its wall clock: written back before the clock reads it
        restored = [] if set_path.exists() else restore_run(out, cell.key)
        work = out / "work" / cell.key
        begun = not (work / WALL).exists() and work.is_dir() and any(work.iterdir())  # by processes without a clock
        stage = "evaluation" if set_path.exists() else "set"
        with WallClock(work / WALL, stage, unrecorded=begun) as clock:
            return make_and_score(cell, set_path, restored, clock)

    def make_and_score(cell: Cell, set_path: Path, restored: list[Path], clock: WallClock) -> dict[str, Any]:
        spec = next(m for m in config.methods if m.name == cell.method)
        method = get_method(cell.method)
        set_time = set_path.with_suffix(".time.json")
        if not set_path.exists():
            hooks.phase(f"{cell.key}: making the training set")
            method_hash = config.method_hash(cell.method)  # what the run is made with (_outdated)
            write_text_atomic(out / "work" / cell.key / METHOD_RECORD, json.dumps({"method_hash": method_hash}) + "\n")
            ctx = MethodContext(
                model=model,
                tokenizer=tokenizer,
                pool=pool,
                label_names=train.label_names,
                template=template,
                label_words=words,
                n_per_class=cell.n_per_class,
                seed=cell.seed,
                epsilon=cell.epsilon,
                delta=config.delta,
                workdir=out / "work" / cell.key,
                pool_features=features,
                params={**_default_instructions(train, method), **spec.params},
                private_cache=private_cache,
                progress=hooks.progress,
            )
            for folder in restored:
                hooks.phase(f"{cell.key}: resuming the run kept in {KEPT_RUNS}/ ({folder.name})")
            try:
                rows = method(ctx)
            except UserError as err:
                if not restored:
                    raise
                keep_runs(out)  # the restored ledger reaches accounting.json before anyone removes the folder
                raise UserError(
                    f"{err}\n(if it is the run restored from {KEPT_RUNS}/{cell.key} that is refused, remove that "
                    "too to start afresh: accounting.json now holds its ledger, so its draws stay counted)"
                ) from err
            write_jsonl_atomic(set_path, rows)
            made = {
                "set_s": round(clock.seconds("set"), 3),
                "segments": clock.count("set"),
                "method_hash": method_hash,
            }
            if unknown := clock.unrecorded("set"):
                made["unrecorded_segments"] = unknown  # set_s is a lower bound
            write_text_atomic(set_time, json.dumps(made) + "\n")
        clock.stage("evaluation")
        # the draw is made (here or by an earlier process): its ledger, sidecar and card go public now, not after
        # the hour of evaluation, so that a machine lost meanwhile loses neither the set (commit sets/) nor its
        # statement (accounting.json)
        keep_runs(out)  # and accounting.json
        card(cell)
        # the time the set took when it was made, by this process or an earlier one (None: not kept)
        generation_s = json.loads(set_time.read_text())["set_s"] if set_time.exists() else None
        train_set = read_training_set(set_path, train.label_names, allow_empty=True)
        if short := _short_classes(train_set, train.label_names, cell):
            hooks.warn(
                f"{cell.key}: the set holds {short}, fewer than the {cell.n_per_class:,} per class asked (the method "
                "found no more it accepts); it is evaluated as it is, and its row's n_train says its size"
            )
        evaluation = out / "work" / cell.key / "evaluation"  # private; deleted once the row is written
        head: dict[str, float] = {}
        if probe is not None:

            def fit_head() -> dict[str, float]:
                hooks.phase(f"{cell.key}: head-only classifier on {len(train_set)} examples")
                test_inputs = (test_features(), test_classes)
                return head_probe(model, tokenizer, train_set, *test_inputs, template, words, probe, cell.seed)

            # keyed by the shared settings (not the grid's lists: a cell added to the grid keeps it) and the set
            # it was fitted on (a hash of private rows; the folder is private)
            head = json_once(evaluation / f"head-only-{digest([config.shared_hash, train_set])}.json", fit_head)
        finetune, grid = config.finetune_config(cell.seed), config.finetune_grid(cell.seed)
        hooks.phase(f"{cell.key}: fine-tuning on {len(train_set)} examples, scoring {len(test)}")
        hooks.steps(sum(c.epochs * math.ceil(len(train_set) / c.batch_size) for c in grid or [finetune]))
        scores = fit_and_score(
            model,
            tokenizer,
            train_set,
            test,
            template,
            words,
            finetune,
            validation=validation,
            grid=grid,
            members=pool if config.mia else None,
            nonmembers=nonmembers if config.mia else None,
            on_step=hooks.step,
            checkpoint=EpochCheckpoint(evaluation / "finetune.pt", model_key()) if train_set else None,
        )
        row = {
            "config_hash": config.hash,
            "shared_hash": config.shared_hash,
            "method_hash": config.method_hash(cell.method),
            "cell": cell.key,
            "method": cell.method,
            "n_per_class": cell.n_per_class,
            "seed": cell.seed,
            "epsilon": cell.epsilon,
            "delta": config.delta if cell.epsilon is not None else None,
            "epsilon_spent": _epsilon_spent(set_path),
            "privacy": method.privacy,
            **scores,
            **head,
            "set_s": generation_s,
            # the set's time as stated beside it (all its machines'; this clock's when it is not kept) and the
            # evaluation's segments on this machine
            "wall_time_s": round((generation_s or clock.seconds("set")) + clock.seconds("evaluation"), 3),
        }
        log.append(row)
        shutil.rmtree(evaluation, ignore_errors=True)
        return row

    cells = config.cells()
    for index, cell in enumerate(cells):
        hooks.cell(index, len(cells), cell.key)
        if cell.key in done or not chosen(cell, index, only, shard, cells_matching):
            continue
        with claim(out / "work" / f"{cell.key}.lock") as mine:
            if not mine:
                hooks.phase(f"{cell.key}: another process is running this cell; skipped")
                continue
            done, stale = finished()  # as other processes left it meanwhile
            if cell.key in done:  # finished by another process: not run again
                continue
            if _outdated(out, cell.key, config.method_hash(cell.method), cell.key in stale):
                hooks.phase(f"{cell.key}: made with other method parameters; its old files go to stale/, rerun")
                _set_aside(out, cell.key)
            done[cell.key] = run_cell(cell)  # its card and accounting were kept before its evaluation
    hooks.cell(len(cells), len(cells), "report")
    done = finished()[0]  # other processes' rows too
    for cell in cells:
        if cell.key in done:
            card(cell)
    rows = [done[c.key] for c in cells if c.key in done]
    keep_runs(out)  # and accounting.json
    write_report(out, rows, config, total_cells=len(cells), command=command)
    return rows


def _pool_features(model: Any, tokenizer: Any, pool: list[Any], path: Path) -> np.ndarray:
    """The pool's last-token features (``len(pool) × d``, float64), computed once per experiment and kept
    at ``path`` — inside ``work/private-cache``: they are a function of the private pool (same protection as
    the data; never in a published results folder). A cached file of the wrong shape is recomputed."""
    if path.exists():
        cached = np.load(path)
        if cached.shape[0] == len(pool):
            return cached
    features = last_token_features(model, tokenizer, [t for t, _ in pool])
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, features)
    return features


def _epsilon_spent(set_path: Path) -> float | None:
    """The largest ``epsilon_spent`` the method recorded on the set's rows (its ledger's answer, which
    counts redraws: it may exceed the cell's target ε), or ``None`` when the rows carry none."""
    spent = [
        r["epsilon_spent"]
        for r in map(json.loads, set_path.read_text().splitlines())
        if r.get("epsilon_spent") is not None
    ]
    return max(spent) if spent else None


def _default_instructions(train: Dataset, method: Method) -> dict[str, Any]:
    """A generation method's instructions from the verbalizer (user data), or none (its default)."""
    instructions = train.verbalizer.instructions(train.label_names)
    return {} if instructions is None or "instructions" not in method.params else {"instructions": instructions}
