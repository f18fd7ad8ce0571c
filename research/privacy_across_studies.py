"""What every committed study under ``research/`` costs in privacy together, per private data set.

    .venv/bin/python research/privacy_across_studies.py
    # writes research/privacy_across_studies.json (every release) and research/privacy_across_studies.md

Each study states at most its own grid's ε, but several studies draw DP releases from the same records (the
seeded train split of one data set), and whoever publishes all of them pays their composition. This script
reads the committed files only (``git ls-files research``), finds every DP release, groups the releases by the
data set they read (a release on a subset, a pool of 50 per class or a ``--max-train`` cut, reads the same
records and is grouped with the rest, and so is a release on a data set made of another's records:
``bbc-headlines`` is the ``bbc-news`` articles, :data:`SAME_RECORDS`) and states per data set:

* **basic composition**: Σ ε_i at Σ δ_i over the releases' stated (ε_i, δ_i), valid for any mechanisms;
* **PLD composition** with privlm's accountant, the way :mod:`privlm.evaluation.grid_privacy` composes ledgers
  (``Ledger(entries).epsilon(δ)``), of every release whose events can be rebuilt from committed files, at the
  smallest δ among them, plus basic composition of the others: (ε_PLD + Σ ε_j, δ + Σ δ_j).

The same two compositions are stated per study, over its own releases: what publishing one study's grid
costs (a grid's own report cannot state it when a ledger was lost; the draws this script counts from a
README or at a stated ε are in it).

Where the events come from:

* ``privlm train`` summaries (``<cell>.json`` with ``private``, ``sample_rate`` and ``steps``): the committed
  ledger ``runs/<cell>/privacy.json`` beside the summary if there is one, else the summary's fields: steps
  × ``PoissonGaussianStep(q, accounted σ, clipping, probes, snapped)``, the clipping kind being the norm mode
  for randomized modes and exact otherwise (as :class:`privlm.dpsgd.engine.PrivacyEngine` books it), the
  probes read from the stored command, and one snapped coordinate per step when the run released a DP loss
  (its accounted σ is then below the drawn one).
* Privacy sidecars (``*.privacy.json`` with ``dp``): their ledger. Their data set is the sidecar's
  ``private_data`` or the console log beside it.
* Experiment grids (``results.jsonl`` with ``configs/<hash>.json``): a row holds ε and δ only. A GRADMM cell
  is one Gaussian release and a PE cell T releases of one σ (``iterations``), and those (ε, δ) fix a
  dominating event: T Gaussians of multiplier σ compose exactly to one of σ/√T, and one that is (ε, δ)-DP has
  σ/√T ≥ σ(ε, δ), the exact analytic multiplier (:func:`privlm.privacy.gaussian_noise_multiplier`). The rebuilt
  event carries the release's snapped coordinates (for GRADMM's label-row release, the count in the demo
  sidecar of the same release; for a PE histogram, K·M bins at clamp 2¹⁶), so the snapping slack is counted
  as well. A dp-finetune-gen or dp-head-pool cell's DP-SGD run (σ is no closed-form function of (ε, δ)) is read from the
  ledger of its set's sidecar as the grid's committed ``accounting.json`` keeps it (``work/<cell>/
  synthetic.privacy.json``), and must give its accounted ε again; a grid without that copy (run before
  ``accounting.json`` existed: its ledgers were in the ignored ``work/``) enters at its stated ε.
  Both train once per (ε, seed) for every n when the run folder is still there, but a run made again at the
  same path after its machine was lost has the same events: only the run's identity (a ledger's ``run``,
  named by the sidecar's ``ledger_run``) tells them apart. Rows (finished or not) whose sidecars name the same
  ledger and the same identity are one release; every row whose sidecar names no identity (written by an
  older privlm) is its own release (an over-count where such rows did share one run).

Checks, all towards counting more: a DP-SGD run's events must give its stated ε again, else it is not
rebuilt (a GRADMM or PE event rebuilt from (ε, δ) gives at least ε by construction: the exact σ(ε, δ), a
pessimistic PLD and a non-negative snapping slack); a study whose README or report states the composition of
as many DP cells as it holds is checked against that statement, and if the rebuilt composition is smaller
(draws the rows do not show), every release of that study falls back to its stated ε. Draws no committed row
accounts for but a study's committed README or history (``HISTORY.md``) still tells of are releases too
(:data:`EARLIER_DRAWS`): superseded by a rerun whose rows replaced theirs, or lost with a machine before their
cell finished (the rerun draws again).
A draw whose cell is still running has no row yet either: a grid's committed ``accounting.json`` keeps its
sidecar, and that ledger counts it (:func:`read_unfinished_draws`) until the cell's row lands; a kept ledger
no cell's sidecar names, with its identity (a training still running, a ledger displaced by a new run at its
path), counts too.

Counting rules: seeds and repeats of a cell are separate releases; seeded runs (``--seed``: the noise is
reproducible, so as committed they guarantee nothing) are counted at the ε of the mechanism they ran, which
is what a user running them unseeded on private data spends. Not counted, and listed with the reason: no-DP
cells (NOT private), noise-only controls (they read no private data), and the folders in
:data:`EXCLUDED_FOLDERS`.
"""

from __future__ import annotations

import argparse
import json
import math
import posixpath
import re
import subprocess
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privlm.experiments.grid_privacy import SHARED, continues
from privlm.norm_modes import CLIPPING_KINDS
from privlm.privacy import (
    GaussianRelease,
    Ledger,
    LedgerEntry,
    PoissonGaussianStep,
    event_from_dict,
    gaussian_noise_multiplier,
)
from privlm.privacy.events import Clipping
from privlm.privacy.snapping import MAX_CLAMP_BITS, snapped_coordinates
from privlm.resources.datasets import BUILTIN
from privlm.synthesis.pe.config import PEConfig

ROOT = Path(__file__).resolve().parents[1]
JSON_OUT = Path("research/privacy_across_studies.json")
MARKDOWN_OUT = Path("research/privacy_across_studies.md")

EXCLUDED_FOLDERS = {
    "audit": "privacy audits: seeded runs of each mechanism on crafted canaries, not a release of any data set",
    "benchmarks": "speed, memory and accounting benchmarks: no release of any data set",
}
NO_DP = "no DP (ε none): NOT private, and not a DP release to compose"
NOISE_ONLY = "noise-only control: the same pipeline on pure noise, it reads no private data"
LABEL_ROW_SIDECAR = Path("research/demo_output/instruct/synthetic.privacy.json")
UNSNAPPED_GRIDS = {
    "synthetic_pool50": "its GRADMM releases were drawn before privlm snapped any (its README: 'not snapped'), "
    "so their ledgers and stated ε carry no snapping slack",
}
# the grid methods whose set comes from a DP-SGD run (read from its kept ledger); rows naming one run are one release
DP_SGD_SETS = {
    "dp-finetune-gen": "dp-finetune-gen: DP fine-tuning (DP-SGD), then sampling from the model",
    "dp-head-pool": "dp-head-pool: DP-SGD of the head-only labeller, then a draw of the public candidates it accepts",
}
REBUILD_TOLERANCE = 1e-6  # a rebuilt DP-SGD run's own ε may fall this far below its stated ε (float rounding)
DPFT_NOT_REBUILT = (  # a DP-SGD run's σ is no closed-form function of (ε, δ): it needs the run's ledger
    "not rebuilt: no committed file holds a ledger to rebuild from (ledgers lived in the ignored work/, and the "
    "grid kept no accounting.json copy); counted at the stated ε"
)
ACCOUNTING = "accounting.json"  # a grid's committed copy of its ledgers and sidecars (privlm.experiments.grid_privacy)
DIGITS = 7  # significant digits of the numbers written


STUDY_PROSE = ("HISTORY.md",)  # beside a study's README: its history of the runs, where lost draws are told


@dataclass(frozen=True)
class EarlierDraw:
    """Draws that no committed row of ``study`` accounts for but its README or history still tells of
    (``quote``): the ``method`` cells at ``per_class`` (None: dp-finetune-gen's one training run for every n)
    and ``epsilon`` for ``seeds``, with the study's current parameters. ``why``: ``superseded`` (a rerun replaced
    them in the rows) or ``lost`` (their run folder went with a machine before their cell finished; the rerun
    draws again)."""

    study: str
    method: str
    per_class: int | None
    epsilon: float
    seeds: tuple[int, ...]
    quote: str
    why: str


EARLIER_DRAWS = (
    EarlierDraw(
        "synthetic_methods", "pe", 20, 1.0, (0, 1, 2), "where the first run gave 73.7 / 79.7 / 74.7", "superseded"
    ),
    EarlierDraw(
        "synthetic_methods", "pe", 100, 1.0, (0, 1, 2), "they were 74.0 / 78.7 / 79.3 at n = 100, ε = 1", "superseded"
    ),
    EarlierDraw(
        "synthetic_at_scale",
        "gradmm@instruct",
        1000,
        1.0,
        (0,),
        "the GRADMM release of the n = 1,000 cell (seed 0), drawn when the grid first started",
        "lost",
    ),
    EarlierDraw(
        "synthetic_at_scale",
        "dp-finetune-gen",
        None,
        1.0,
        (0,),
        "the first dp-finetune-gen training run (seed 0, ε = 1: 34 steps",
        "lost",
    ),
    EarlierDraw(
        "synthetic_at_scale",
        "dp-finetune-gen",
        None,
        1.0,
        (2,),
        "the dp-finetune-gen training run of seed 2 (ε = 1), which had probably begun",
        "lost",
    ),
)
STATED_TOTAL = re.compile(
    r"\b(\d+) (?:finished )?DP cells\b(?:(?!DP cells).){0,300}?(?:cost at most|compose to|composed to) "
    r"ε ([=≈]) (\d+(?:\.\d+)?) at δ = (\d+(?:\.\d+)?(?:e-?\d+)?)"
)
DEMO_LOG = re.compile(r"model (\S+):.*?private data (\S+) \((\w+) split, ([^)]*)\)", re.S)


@dataclass
class Release:
    """One DP release of ``records`` of ``data``'s ``split``: its stated (ε, δ), the results rows it accounts
    for (none for an earlier draw or a draw whose cell is still running: ``unfinished``), and the ledger entries
    rebuilt from committed files (``entries``; None where they cannot be, and ``source`` says why)."""

    study: str
    name: str
    data: str
    split: str
    records: str
    mechanism: str
    epsilon: float
    delta: float
    rows: list[str]
    entries: tuple[LedgerEntry, ...] | None
    source: str
    seeded: bool = False
    unfinished: bool = False
    serves: int = 1  # the sets (rows, or drawn sets without a row) this release accounts for: one run's, merged

    def to_dict(self) -> dict[str, Any]:
        """JSON form (numbers rounded to :data:`DIGITS` significant digits)."""
        return {
            "study": self.study,
            "name": self.name,
            "data": self.data,
            "split": self.split,
            "records": self.records,
            "mechanism": self.mechanism,
            "epsilon": _num(self.epsilon),
            "delta": _num(self.delta),
            "rows": self.rows,
            "rebuilt": self.entries is not None,
            "source": self.source,
            "seeded": self.seeded,
            "unfinished": self.unfinished,
            "serves": self.serves,
            "events": None if self.entries is None else [entry.to_dict() for entry in self.entries],
        }


@dataclass
class Scan:
    """What the readers found: releases, excluded rows by (study, reason), and the committed files."""

    root: Path
    files: frozenset[str]
    releases: list[Release] = field(default_factory=list)
    excluded: dict[tuple[str, str], list[str]] = field(default_factory=lambda: defaultdict(list))
    runs: dict[tuple[str, str, str], Release] = field(default_factory=dict)  # DP-SGD releases by :func:`_run_key`
    parsed: dict[str, Any] = field(default_factory=dict)  # :meth:`json`'s files, each read once
    read: dict[str, str] = field(default_factory=dict)  # :meth:`text`'s files, each read once

    def json(self, path: str) -> Any:
        """The committed JSON file ``path`` (relative to the root), read and parsed once (a grid's
        ``accounting.json`` is asked for by every DP-SGD row); callers never modify what it returns."""
        if path not in self.parsed:
            self.parsed[path] = json.loads((self.root / path).read_text(encoding="utf-8"))
        return self.parsed[path]

    def text(self, path: str) -> str:
        """The committed text file ``path`` (relative to the root), read once (a README is asked for by each of
        its study's :data:`EARLIER_DRAWS`)."""
        if path not in self.read:
            self.read[path] = (self.root / path).read_text(encoding="utf-8")
        return self.read[path]

    def exclude(self, study: str, reason: str, row: str) -> None:
        """Set ``row`` of ``study`` aside for ``reason``."""
        self.excluded[(study, reason)].append(row)


def committed_files(root: Path) -> frozenset[str]:
    """Paths (relative to ``root``) of the files git tracks under ``research/``, less those of
    :data:`EXCLUDED_FOLDERS`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "research"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    return frozenset(path for path in listed.split("\0") if path and study_of(path) not in EXCLUDED_FOLDERS)


def study_of(path: str) -> str:
    """The study a committed file belongs to: its folder directly under ``research/``."""
    return path.split("/")[1]


SAME_RECORDS = {"bbc-headlines": "bbc-news"}  # a data set made of another's records: its releases compose with them


def records_of(data: str) -> str:
    """The data set whose records ``data`` reads: ``bbc-headlines`` is every ``bbc-news`` article (its body and
    first line) in the same split, so a release on either reads the same articles."""
    return SAME_RECORDS.get(data, data)


def statement(root: Path = ROOT) -> dict[str, Any]:
    """The whole statement (what ``research/privacy_across_studies.json`` holds), from the committed files."""
    scan = Scan(root, committed_files(root))
    read_experiment_grids(scan)
    read_unfinished_draws(scan)
    read_earlier_draws(scan)
    read_train_summaries(scan)
    read_demo_reports(scan)
    read_sidecars(scan)
    studies = [_study_entry(scan, study, data) for study, data in sorted({(r.study, r.data) for r in scan.releases})]
    data_sets = [
        _data_set_entry(data, [r for r in scan.releases if records_of(r.data) == data])
        for data in sorted({records_of(r.data) for r in scan.releases})
    ]
    folders = sorted({study_of(path) for path in scan.files if path.count("/") > 1})
    excluded = [
        {"study": study, "reason": reason, "rows": sorted(rows)}
        for (study, reason), rows in sorted(scan.excluded.items())
    ]
    excluded += [
        {"study": name, "reason": reason, "rows": []}
        for name, reason in sorted(EXCLUDED_FOLDERS.items())
        if (root / "research" / name).is_dir()
    ]
    with_releases = {r.study for r in scan.releases}
    return {
        "about": (
            "Every DP release of the committed studies, grouped by the private data it read, with basic "
            "and PLD composition per data set; written by research/privacy_across_studies.py."
        ),
        "data_sets": data_sets,
        "studies": studies,
        "studies_without_dp_releases": [name for name in folders if name not in with_releases],
        "excluded": excluded,
        "releases": [release.to_dict() for release in scan.releases],
    }


# --- readers -------------------------------------------------------------------------------------------


def read_experiment_grids(scan: Scan) -> None:
    """Releases of every ``results.jsonl`` row of an experiment grid (module docstring)."""
    for path in sorted(p for p in scan.files if p.endswith("/results.jsonl")):
        folder, study = path.rsplit("/", 1)[0], study_of(path)
        for line in scan.text(path).splitlines():
            row = json.loads(line)
            name = f"{path}#{row['cell']}"
            config = scan.json(f"{folder}/configs/{row['config_hash']}.json")
            params = next(m for m in config["methods"] if m["name"] == row["method"])["params"]
            if row["epsilon"] is None:
                scan.exclude(study, NO_DP, name)
                continue
            if params.get("noise_only"):
                scan.exclude(study, NOISE_ONLY, name)
                continue
            kind = row["method"].split("@")[0]
            epsilon = max(row["epsilon"], row.get("epsilon_spent") or 0.0)
            if kind in DP_SGD_SETS:
                release = _grid_release(study, row["cell"], config, DP_SGD_SETS[kind], epsilon, row["delta"], [name])
                release.entries, release.source = _dpft_entries(scan, folder, row)
                _count_run(
                    scan,
                    _run_key(folder, f"work/{row['cell']}/synthetic.privacy.json", _sidecar(scan, folder, row)),
                    release,
                )
                continue
            elif kind == "gradmm":
                release = _grid_release(
                    study,
                    row["cell"],
                    config,
                    "GRADMM: one Gaussian release of the per-class clipped gradient sums",
                    epsilon,
                    row["delta"],
                    [name],
                )
                release.entries, release.source = _gradmm_entries(scan, study, config, release)
            elif kind == "pe":
                release = _grid_release(
                    study,
                    row["cell"],
                    config,
                    "Private Evolution: T noisy vote histograms, each one Gaussian release",
                    epsilon,
                    row["delta"],
                    [name],
                )
                release.entries, release.source = _pe_entries(config, params, row["n_per_class"], release)
            else:
                raise ValueError(f"{name}: a DP row of method {row['method']!r}, which this script cannot account")
            scan.releases.append(release)


CELL_KEY = re.compile(r"^(?P<method>.+)_n\d+_seed(?P<seed>\d+)_eps(?P<eps>[0-9.]+)$")  # a DP grid cell's key


def read_unfinished_draws(scan: Scan) -> None:
    """Draws a grid's committed ``accounting.json`` keeps whose cell has no results row yet (drawn, the cell
    still running when the ledgers were copied): each DP sidecar ``work/<cell>/synthetic.privacy.json`` of a
    cell without a row is a release at its own ledger, or, for a DP-SGD run whose identity a finished row's (or
    another unfinished) sidecar names too, part of that release (:func:`_count_run`; a sidecar naming no
    identity is always its own release: module docstring). Noise-only sidecars spend nothing. So is each kept
    ledger that no cell's sidecar names (``ledger_file`` and ``ledger_run``, with no fewer steps than the kept
    ledger): a run whose set is not written yet (a dp-finetune-gen training in progress, a release drawn just
    before the machine was lost), a run made since at a path a sidecar names, or a ledger displaced by a new
    run at the same path (``#displaced-``), at the ε its events give at the grid's δ."""
    for path in sorted(p for p in scan.files if p.endswith(f"/{ACCOUNTING}")):
        folder, study = path.rsplit("/", 1)[0], study_of(path)
        results = f"{folder}/results.jsonl"
        rows = [json.loads(line) for line in scan.text(results).splitlines()] if results in scan.files else []
        sidecars = scan.json(path)["sidecars"]
        finished = {r["cell"] for r in rows}
        config = scan.json(f"{folder}/config.json")
        ledgers = scan.json(path)["ledgers"]
        named = set()  # the kept ledgers the cells' sidecars name: counted with their rows or in the loop below
        for kept, sidecar in sorted(sidecars.items()):
            cell = kept.split("/")[1]
            match = CELL_KEY.match(cell)
            pointed = _ledger_path(kept, sidecar)
            if match and pointed in ledgers and _names(sidecar, Ledger.from_dict(ledgers[pointed], pointed)):
                named.add(pointed)
            if cell in finished or not match or not sidecar.get("dp") or sidecar.get("noise_only"):
                continue
            method, epsilon = match["method"], float(match["eps"])
            release = _grid_release(
                study,
                f"{cell} (drawn; its cell had not finished)",
                config,
                f"{method.split('@')[0]}: a draw whose cell has no row yet; {path} keeps its ledger",
                max(epsilon, sidecar.get("epsilon_accounted") or 0.0),
                config["delta"],
                [],
            )
            release.entries = tuple(LedgerEntry.from_dict(item) for item in sidecar["ledger"])
            release.source = f"the ledger of {kept} as {path} keeps it"
            release.unfinished = True
            _count_run(scan, _run_key(folder, kept, sidecar), release)
        for kept, ledger in sorted(ledgers.items()):
            if kept in named:
                continue
            entries = tuple(LedgerEntry.from_dict(item) for item in ledger["entries"])
            release = _grid_release(
                study,
                f"{kept} (a kept ledger no cell's set names)",
                config,
                f"a run whose set is not written yet, or displaced by a new run at its path; {path} keeps its ledger",
                Ledger(entries).epsilon(config["delta"]),
                config["delta"],
                [],
            )
            release.entries, release.source, release.unfinished = entries, f"the ledger {kept} as {path} keeps it", True
            scan.releases.append(release)


def told_in(scan: Scan, study: str, quote: str) -> str | None:
    """The study's README, or else its committed :data:`STUDY_PROSE`, that quotes ``quote`` (whitespace
    collapsed); None when none does."""
    paths = [f"research/{study}/README.md"]
    paths += [f"research/{study}/{name}" for name in STUDY_PROSE if f"research/{study}/{name}" in scan.files]
    return next((path for path in paths if quote in " ".join(scan.text(path).split())), None)


def read_earlier_draws(scan: Scan) -> None:
    """The draws of :data:`EARLIER_DRAWS`, rebuilt like the study's current cells of their method; each quote
    must still be in the study's README or history (else the list is stale and must be revisited)."""
    for old in EARLIER_DRAWS:
        readme = told_in(scan, old.study, old.quote)
        if readme is None:
            raise ValueError(
                f"neither research/{old.study}/README.md nor its {', '.join(STUDY_PROSE)} quotes {old.quote!r} now: "
                "revisit EARLIER_DRAWS"
            )
        config = scan.json(f"research/{old.study}/config.json")
        params = next(m for m in config["methods"] if m["name"] == old.method)["params"]
        kind = old.method.split("@")[0]
        for seed in old.seeds:
            size = "" if old.per_class is None else f"_n{old.per_class}"
            release = _grid_release(
                old.study,
                f"{old.method}{size}_seed{seed}_eps{old.epsilon:g} (an earlier draw, {old.why})",
                config,
                f"{kind}: a draw {old.why} before its cell finished; {readme} tells of it ('{old.quote}')",
                old.epsilon,
                config["delta"],
                [],
            )
            if kind == "pe" and old.per_class is not None:
                release.entries, release.source = _pe_entries(config, params, old.per_class, release)
            elif kind == "gradmm":
                release.entries, release.source = _gradmm_entries(scan, old.study, config, release)
            else:
                release.source = DPFT_NOT_REBUILT
            scan.releases.append(release)


def _grid_release(
    study: str, cell: str, config: dict[str, Any], mechanism: str, epsilon: float, delta: float, rows: list[str]
) -> Release:
    """A release of an experiment grid's private pool (not rebuilt yet)."""
    pool = config["pool_per_class"]
    return Release(
        study,
        f"{study}/{cell}",
        config["dataset"],
        f"train split, seed {config['data_seed']}",
        "the whole split" if pool == "all" else f"a pool of {pool} per class",
        mechanism,
        epsilon,
        delta,
        rows,
        None,
        "",
    )


def read_train_summaries(scan: Scan) -> None:
    """Releases of the ``privlm train --json`` summaries (module docstring)."""
    summaries = {}
    for path in sorted(p for p in scan.files if p.endswith(".json")):
        data = scan.json(path)
        if isinstance(data, dict) and {"private", "sample_rate", "steps", "epsilon", "data"} <= set(data):
            summaries[path] = data
    largest: dict[str, int] = defaultdict(int)
    for data in summaries.values():
        largest[data["data"]] = max(largest[data["data"]], data["n_train"])
    for path, data in summaries.items():
        study = study_of(path)
        if not data["private"]:
            scan.exclude(study, NO_DP, path)
            continue
        whole = data["n_train"] == largest[data["data"]]
        release = Release(
            study,
            path.removeprefix("research/").removesuffix(".json"),
            data["data"],
            "train split, seed 0",
            "the whole split" if whole else f"a subset, its first {data['n_train']} examples",
            f"DP-SGD training ({data['norm_mode']} norms), {data['steps']} steps",
            data["epsilon"],
            data["delta"],
            [path],
            None,
            "",
            seeded=data.get("private_release") is False,
        )
        ledger = f"{path.rsplit('/', 1)[0]}/runs/{Path(path).stem}/privacy.json"
        if ledger in scan.files:
            release.entries = Ledger.load(scan.root / ledger).entries
            release.source = f"the committed ledger {ledger}"
        else:
            release.entries, release.source = _dpsgd_entries(data)
        own = None if release.entries is None else _epsilon(release.entries, release.delta)
        if own is not None and own < release.epsilon - REBUILD_TOLERANCE:
            release.source = (
                f"not rebuilt: the events read ({release.source}) give ε = {own:.6g}, below the "
                f"stated {release.epsilon:.6g}; counted at its stated ε"
            )
            release.entries = None
        scan.releases.append(release)


def _demo_folders(scan: Scan) -> list[str]:
    """Folders holding a committed ``demo.json`` (the report of ``privlm demo``)."""
    return sorted(p.removesuffix("/demo.json") for p in scan.files if p.endswith("/demo.json"))


def read_demo_reports(scan: Scan) -> None:
    """The two releases of a committed ``privlm demo`` report (``demo.json``): the DP head fine-tune (its
    committed ledger ``dp-finetune/privacy.json``) and GRADMM's label-row release (the ledger in its sidecar
    ``gradmm/synthetic.privacy.json``), both on the report's private subset of the train split."""
    for folder in _demo_folders(scan):
        report = scan.json(f"{folder}/demo.json")
        settings = report["settings"]
        records = f"the first {settings['private_rows']:,} examples (public size)"
        ledger_path, sidecar_path = f"{folder}/dp-finetune/privacy.json", f"{folder}/gradmm/synthetic.privacy.json"
        sidecar = scan.json(sidecar_path)
        for name, mechanism, epsilon, entries, source, row in (
            (
                "dp-finetune",
                "DP-SGD on the label-word head (exact norms)",
                max(report["privacy"]["releases"]["dp_finetune"][k] for k in ("epsilon", "target_epsilon")),
                Ledger.load(scan.root / ledger_path).entries,
                ledger_path,
                f"{folder}/demo.json",
            ),
            (
                "gradmm",
                f"GRADMM on {settings['model']}: {sidecar['mechanism']}",
                max(sidecar["epsilon"], sidecar.get("epsilon_accounted", 0.0)),
                tuple(
                    LedgerEntry.from_dict(item) if "event" in item else LedgerEntry(event_from_dict(item))
                    for item in sidecar["ledger"]
                ),
                sidecar_path,
                sidecar_path,
            ),
        ):
            scan.releases.append(
                Release(
                    study_of(folder + "/demo.json"),
                    f"{folder.removeprefix('research/')}/{name}",
                    settings["data"],
                    "train split, seed 0",
                    records,
                    mechanism,
                    epsilon,
                    settings["delta"] / 2,
                    [row],
                    entries,
                    f"the ledger in {source}",
                )
            )


def read_sidecars(scan: Scan) -> None:
    """Releases of the DP privacy sidecars (``*.privacy.json``) outside demo reports: their ledgers."""
    demos = tuple(folder + "/" for folder in _demo_folders(scan))
    for path in sorted(p for p in scan.files if p.endswith(".privacy.json") and not p.startswith(demos)):
        sidecar = scan.json(path)
        if not sidecar.get("dp"):
            scan.exclude(study_of(path), NO_DP, path)
            continue
        folder = path.rsplit("/", 1)[0]
        model, data, split, records = _demo_log(scan, folder)
        if sidecar.get("private_data", data) != data:
            raise ValueError(f"{path} names private data {sidecar['private_data']!r}, its log {data!r}")
        entries = tuple(
            LedgerEntry.from_dict(item) if "event" in item else LedgerEntry(event_from_dict(item))
            for item in sidecar["ledger"]
        )
        scan.releases.append(
            Release(
                study_of(path),
                path.removeprefix("research/").removesuffix(".privacy.json"),
                data,
                f"{split} split, seed 0",
                "the whole split" if records == "all per class" else records,
                f"GRADMM on {model}: {sidecar['mechanism']}",
                max(sidecar["epsilon"], sidecar.get("epsilon_accounted", 0.0)),
                sidecar["delta"],
                [path],
                entries,
                f"the ledger in {path}",
            )
        )


# --- rebuilding events -----------------------------------------------------------------------------------


def _gradmm_entries(
    scan: Scan, study: str, config: dict[str, Any], release: Release
) -> tuple[tuple[LedgerEntry, ...] | None, str]:
    """One Gaussian release at the stated (ε, δ) with its snapped coordinates (module docstring)."""
    if study in UNSNAPPED_GRIDS:
        snapped, why = 0, UNSNAPPED_GRIDS[study]
    else:
        sidecar = scan.json(str(LABEL_ROW_SIDECAR))
        model, data, _, _ = _demo_log(scan, str(LABEL_ROW_SIDECAR.parent))
        if (model, data) != (config["model"], config["dataset"]) or "released_rows" not in sidecar:
            return None, (
                f"not rebuilt: the snapped count of a label-row release of {config['model']} on "
                f"{config['dataset']} is in no committed sidecar; counted at its stated ε"
            )
        snapped = max(LedgerEntry.from_dict(item).event.snapped for item in sidecar["ledger"])
        why = (
            f"the label-row release's {snapped} weighted snapped coordinates, as in {LABEL_ROW_SIDECAR} "
            "(an upper bound for releases drawn before snapping)"
        )
    sigma = gaussian_noise_multiplier(release.epsilon, release.delta)
    entry = LedgerEntry(GaussianRelease(sigma, snapped=snapped), 1, "rebuilt GRADMM release")
    return (entry,), f"rebuilt: one Gaussian release of σ(ε, δ) = {sigma:.6g}; snapping: {why}"


def _pe_entries(
    config: dict[str, Any], params: dict[str, Any], per_class: int, release: Release
) -> tuple[tuple[LedgerEntry, ...], str]:
    """T Gaussian releases of σ(ε, δ)·√T, each snapping the K·M bins of a histogram at clamp 2¹⁶."""
    pe = PEConfig(**params)
    bins = len(BUILTIN[config["dataset"]][1].label_words) * pe.candidates(per_class)
    sigma = gaussian_noise_multiplier(release.epsilon, release.delta) * math.sqrt(pe.iterations)
    entry = LedgerEntry(
        GaussianRelease(sigma, snapped=snapped_coordinates(bins, MAX_CLAMP_BITS)),
        pe.iterations,
        "rebuilt PE histograms",
    )
    return (entry,), (
        f"rebuilt: T = {pe.iterations} Gaussian releases of σ(ε, δ)·√T = {sigma:.6g}, "
        f"each snapping {bins} bins at clamp 2^{MAX_CLAMP_BITS}"
    )


def _ledger_path(kept: str, sidecar: dict[str, Any]) -> str | None:
    """The path (in the grid's ``accounting.json``) of the ledger the sidecar kept as ``kept`` names; None: none."""
    pointer = sidecar.get("ledger_file")
    return posixpath.normpath(posixpath.join(posixpath.dirname(kept), pointer)) if isinstance(pointer, str) else None


def _names(sidecar: dict[str, Any], ledger: Ledger) -> bool:
    """Whether a set's sidecar accounts for all of ``ledger`` (the kept ledger at the path it names): the run its
    ``ledger_run`` names (none for both: an older privlm), no more steps than the sidecar's own copy holds."""
    steps = sum(LedgerEntry.from_dict(item).count for item in sidecar.get("ledger") or [])
    return sidecar.get("ledger_run") == ledger.run and ledger.count <= steps


def _sidecar(scan: Scan, folder: str, row: dict[str, Any]) -> dict[str, Any]:
    """The sidecar of a grid row's set as ``folder``'s ``accounting.json`` keeps it (``{}``: none kept)."""
    path = f"{folder}/{ACCOUNTING}"
    return (
        dict(scan.json(path)["sidecars"].get(f"work/{row['cell']}/synthetic.privacy.json") or {})
        if path in scan.files
        else {}
    )


def _run_key(folder: str, kept: str, sidecar: dict[str, Any]) -> tuple[str, str, str] | None:
    """(grid folder, ledger path, run identity) of the DP-SGD run in the grid's private cache that the sidecar kept
    as ``kept`` in the grid's ``accounting.json`` names; None when it names no identity (an older privlm) or a
    ledger outside the cache (a run of one cell): such a row is its own release."""
    run, path = sidecar.get("ledger_run"), _ledger_path(kept, sidecar)
    if not isinstance(run, str) or path is None or not path.startswith(f"work/{SHARED}/"):
        return None
    return folder, path, run


def _count_run(scan: Scan, key: tuple[str, str, str] | None, release: Release) -> None:
    """Add a DP-SGD set's ``release`` to ``scan``, or, when an earlier release counts the run ``key`` names, both were
    rebuilt and one's ledger continues the other's (:func:`privlm.experiments.grid_privacy.continues`), fold it
    into that one (one run, counted once): its rows join, the larger ε and the longer ledger stay (the sets of
    one run were sampled from it at different steps of its ledger, or at the same), and ``serves`` counts it."""
    earlier = None if key is None else scan.runs.get(key)
    if earlier is None or earlier.entries is None or release.entries is None or not _one_run(earlier, release):
        scan.releases.append(release)
        if key is not None and release.entries is not None:
            scan.runs.setdefault(key, release)
        return
    earlier.rows += release.rows
    earlier.serves += release.serves
    earlier.epsilon = max(earlier.epsilon, release.epsilon)
    earlier.unfinished = earlier.unfinished and release.unfinished
    if sum(e.count for e in release.entries) > sum(e.count for e in earlier.entries):
        earlier.entries, earlier.source = release.entries, release.source


def _one_run(a: Release, b: Release) -> bool:
    """Whether the rebuilt ledgers of ``a`` and ``b`` are one run's: one of them continues the other."""
    first, second = Ledger(list(a.entries or ())), Ledger(list(b.entries or ()))
    return continues(first, second) or continues(second, first)


def _dpft_entries(scan: Scan, folder: str, row: dict[str, Any]) -> tuple[tuple[LedgerEntry, ...] | None, str]:
    """The DP-SGD steps of a dp-finetune-gen or dp-head-pool row: the ledger of its set's sidecar as ``folder``'s
    ``accounting.json`` keeps it, if that gives the sidecar's accounted ε again (module docstring)."""
    path, kept = f"{folder}/{ACCOUNTING}", f"work/{row['cell']}/synthetic.privacy.json"
    if path not in scan.files:
        return None, DPFT_NOT_REBUILT
    sidecar = _sidecar(scan, folder, row)
    if not sidecar or not sidecar.get("dp") or not sidecar.get("ledger"):
        return None, f"not rebuilt: {path} keeps no DP sidecar {kept}; counted at its stated ε"
    entries = tuple(LedgerEntry.from_dict(item) for item in sidecar["ledger"])
    own, accounted = _epsilon(entries, row["delta"]), sidecar["epsilon_accounted"]
    if own < accounted - REBUILD_TOLERANCE:
        return None, f"not rebuilt: the ledger of {kept} in {path} gives ε {own:.6g}, its sidecar {accounted:.6g}"
    steps = sum(entry.count for entry in entries)
    return entries, f"the ledger of {kept} as {path} keeps it: {steps} DP-SGD steps"


def _dpsgd_entries(summary: dict[str, Any]) -> tuple[tuple[LedgerEntry, ...] | None, str]:
    """The steps of a ``privlm train`` run from its summary's fields (module docstring)."""
    sigma = summary.get("accounted_noise_multiplier") or summary["noise_multiplier"]
    clipping: Clipping = summary["norm_mode"] if summary["norm_mode"] in CLIPPING_KINDS else "exact"
    given = re.search(r"--probes (\d+)", summary.get("command", ""))
    if clipping != "exact" and given is None:
        return None, "not rebuilt: the number of probes is in no committed file; counted at its stated ε"
    probes = None if clipping == "exact" or given is None else int(given.group(1))
    snapped = int(sigma < summary["noise_multiplier"])  # a DP loss was released: one snapped value per step
    event = PoissonGaussianStep(summary["sample_rate"], sigma, clipping, probes, snapped)
    return (
        (LedgerEntry(event, summary["steps"], "rebuilt steps"),),
        f"rebuilt from the summary: {summary['steps']} steps of q = {summary['sample_rate']:.6g}, accounted "
        f"σ = {sigma:.6g}, {clipping} clipping"
        + ("" if probes is None else f", {probes} probes")
        + (", DP loss snapped" if snapped else ""),
    )


def _demo_log(scan: Scan, folder: str) -> tuple[str, str, str, str]:
    """(model, data set, split, which records) from the console log of ``privlm demo`` in ``folder``."""
    logs = sorted(
        p
        for p in scan.files
        if p.startswith(folder + "/") and p.count("/") == folder.count("/") + 1 and p.endswith(".log")
    )
    for log in logs:
        found = DEMO_LOG.search(scan.text(log))
        if found:
            return found.group(1), found.group(2), found.group(3), found.group(4)
    raise ValueError(f"{folder}: no committed console log names the private data of its sidecar")


# --- composition ---------------------------------------------------------------------------------------

_EPSILONS: dict[tuple[tuple[Any, ...], float], float] = {}


def _epsilon(entries: Sequence[LedgerEntry], delta: float) -> float:
    """PLD ε at ``delta`` of ``entries`` composed (privlm's ledger accountant), memoized."""
    key = (tuple((entry.event, entry.count) for entry in entries), delta)
    if key not in _EPSILONS:
        _EPSILONS[key] = Ledger(list(entries)).epsilon(delta)
    return _EPSILONS[key]


def compose(releases: Sequence[Release]) -> dict[str, Any]:
    """Basic composition of all ``releases`` and PLD composition of the rebuilt ones (plus basic of the rest)."""
    rebuilt = [r for r in releases if r.entries is not None]
    rest = [r for r in releases if r.entries is None]
    delta = min((r.delta for r in rebuilt), default=0.0)
    pld = _epsilon([entry for r in rebuilt for entry in r.entries or ()], delta) if rebuilt else 0.0
    return {
        "basic": {"epsilon": _num(sum(r.epsilon for r in releases)), "delta": _num(sum(r.delta for r in releases))},
        "pld": {
            "epsilon": _num(pld + sum(r.epsilon for r in rest)),
            "delta": _num(delta + sum(r.delta for r in rest)),
            "rebuilt_releases": len(rebuilt),
            "pld_epsilon": _num(pld),
            "pld_delta": _num(delta),
            "releases_at_stated_epsilon": len(rest),
        },
    }


def _study_entry(scan: Scan, study: str, data: str) -> dict[str, Any]:
    """One study's releases of ``data`` with their basic composition, and the grid totals its README and
    report state, each checked against the study's own composition when it covers as many DP cells as the
    committed rows hold; a statement that composition falls short of sends every release of the study to its
    stated ε (draws the rows do not show)."""
    releases = [r for r in scan.releases if (r.study, r.data) == (study, data)]
    cells = sum(len(r.rows) for r in releases)
    stated = []
    for name in ("README.md", "report.md"):
        path = f"research/{study}/{name}"
        if path not in scan.files:
            continue
        text = " ".join(scan.text(path).replace("**", "").split())
        for found in STATED_TOTAL.finditer(text):
            decimals = len(found[3].partition(".")[2])
            entry: dict[str, Any] = {
                "file": path,
                "dp_cells": int(found[1]),
                "epsilon": float(found[3]),
                "approximate": found[2] == "≈",
                "delta": float(found[4]),
                "rounding": 0.5 * 10.0**-decimals,
            }
            if entry["dp_cells"] != cells:
                entry["check"] = f"not compared: it covers {entry['dp_cells']} DP cells, the committed rows {cells}"
            else:
                ours = compose(releases)["pld"]
                entry["composed_here"] = {"epsilon": ours["epsilon"], "delta": ours["delta"]}
                short = ours["epsilon"] < entry["epsilon"] - entry["rounding"]
                entry["check"] = (
                    "the composition rebuilt here is below it: every release of the study counts at its stated ε"
                    if short
                    else "consistent: the composition here is not below it"
                )
                for release in releases if short else ():
                    release.entries = None
                    release.source = f"not rebuilt: {path} states more than the rebuilt events give"
                    # a run serving k sets counts k times at its stated (ε, δ): as if each set were its own run
                    release.epsilon, release.delta = release.epsilon * release.serves, release.delta * release.serves
            stated.append(entry)
    return {
        "study": study,
        "data": data,
        "dp_cells": cells,
        "releases": len(releases),
        "rebuilt": sum(r.entries is not None for r in releases),
        "basic": {"epsilon": _num(sum(r.epsilon for r in releases)), "delta": _num(sum(r.delta for r in releases))},
        "pld": compose(releases)["pld"],
        "stated_totals": stated,
        "not_rebuilt": sorted({r.source for r in releases if r.entries is None}),
    }


def _data_set_entry(data: str, releases: Sequence[Release]) -> dict[str, Any]:
    """One data set: its studies, releases and both compositions, and which releases were not rebuilt."""
    studies = sorted({r.study for r in releases})
    not_rebuilt: dict[tuple[str, str, str], int] = defaultdict(int)
    for release in releases:
        if release.entries is None:
            not_rebuilt[(release.study, release.mechanism, release.source)] += 1
    return {
        "data": data,
        "read_as": sorted({r.data for r in releases}),
        "studies": studies,
        "dp_cells": sum(len(r.rows) for r in releases),
        "releases": len(releases),
        "seeded_releases": sum(r.seeded for r in releases),
        "earlier_draws": sum(not r.rows and not r.unfinished for r in releases),
        "unfinished_draws": sum(r.unfinished for r in releases),
        "splits": sorted({r.split for r in releases}),
        "records": sorted({r.records for r in releases}),
        "largest_release_epsilon": _num(max(r.epsilon for r in releases)),
        **compose(releases),
        "not_rebuilt": [
            {"study": study, "mechanism": mechanism, "releases": count, "reason": reason}
            for (study, mechanism, reason), count in sorted(not_rebuilt.items())
        ],
    }


def _num(value: float) -> float:
    return float(f"{value:.{DIGITS}g}")


def _up(epsilon: float) -> str:
    """ε rounded up to two decimals, so the printed number is never below the composed one."""
    return f"{math.ceil(epsilon * 100 - 1e-9) / 100:.2f}"


# --- output --------------------------------------------------------------------------------------------


def render_markdown(result: dict[str, Any]) -> str:
    """The short Markdown statement (``research/privacy_across_studies.md``) of ``result``."""
    lines = [
        "# What all committed studies cost together in privacy, per private data set",
        "",
        "These data sets are public stand-ins for private data, so publishing these studies leaks nothing real. "
        "The numbers show what a user who published every study on their own private data would have spent, "
        "which is why a user should plan one budget per data set, not per study.",
        "",
        "Each study states at most its own grid's ε (ε rounded up here). Here every DP release of every "
        "committed study is composed with the others that read the same data set (a release on a subset reads "
        "the same records). Written by "
        f"`research/privacy_across_studies.py` from the committed files; `{JSON_OUT.name}` lists every "
        "release, its events and what was excluded.",
        "",
        "| data set | studies | DP cells | releases | ε, basic composition (δ) | ε, PLD where rebuilt (δ) |",
        "|---|---|---|---|---|---|",
    ]
    for entry in result["data_sets"]:
        pld = entry["pld"]
        how = (
            f"PLD of all {pld['rebuilt_releases']}"
            if not pld["releases_at_stated_epsilon"]
            else f"PLD of {pld['rebuilt_releases']} ({_up(pld['pld_epsilon'])} at δ = {pld['pld_delta']:.3g}) + basic "
            f"of the {pld['releases_at_stated_epsilon']} not rebuilt"
        )
        lines.append(
            f"| {entry['data']} | {', '.join(entry['studies'])} | {entry['dp_cells']} | {entry['releases']} | "
            f"{_up(entry['basic']['epsilon'])} ({entry['basic']['delta']:.3g}) | "
            f"**{_up(pld['epsilon'])}** ({pld['delta']:.3g}): {how} |"
        )
    lines.append("")
    for entry in result["data_sets"]:
        shown: dict[tuple[str, str, str], int] = defaultdict(int)  # lost draws' mechanisms differ in their story
        for m in entry["not_rebuilt"]:
            reason = m["reason"].removeprefix("not rebuilt: ")
            shown[(m["mechanism"].split(":")[0], m["study"], reason)] += m["releases"]
        missing = "; ".join(
            f"{count} {mechanism} release{'s' if count > 1 else ''} of {study} ({reason})"
            for (mechanism, study, reason), count in shown.items()
        )
        superseded = (
            f" Counted too: {entry['earlier_draws']} earlier draws that no committed row accounts for "
            "(superseded by a rerun, or lost with a machine before their cell finished) and that a study's "
            "README or history still tells of."
            if entry["earlier_draws"]
            else ""
        )
        if entry["unfinished_draws"]:
            superseded += (
                f" Counted too: {entry['unfinished_draws']} draw(s) whose cell had no row yet (the cell was still "
                "running when its grid's accounting.json kept their ledger)."
            )
        read_as = entry["read_as"]
        also = f", read as {' and '.join(f'`{d}`' for d in read_as)} (the same articles)" if len(read_as) > 1 else ""
        lines.append(
            f"- **{entry['data']}** ({'; '.join(entry['splits'])}{also}), releases on "
            f"{'; '.join(entry['records'])}. Rebuilt for PLD: "
            f"{'every release' if not missing else 'all but ' + missing}.{superseded}"
        )
    lines += [
        "",
        "What each study's releases cost alone (publishing one study's grid on its own data set: its rows, "
        "earlier draws and draws still running, composed the same way):",
        "",
        "| study | data set | releases | ε, basic composition (δ) | ε, PLD where rebuilt (δ) |",
        "|---|---|---|---|---|",
    ]
    for entry in result["studies"]:
        pld = entry["pld"]
        lines.append(
            f"| {entry['study']} | {entry['data']} | {entry['releases']} | {_up(entry['basic']['epsilon'])} "
            f"({entry['basic']['delta']:.3g}) | {_up(pld['epsilon'])} ({pld['delta']:.3g}) |"
        )
    seeded = sum(entry["seeded_releases"] for entry in result["data_sets"])
    releases = sum(entry["releases"] for entry in result["data_sets"])
    counts = {
        reason: sum(len(e["rows"]) for e in result["excluded"] if e["reason"] == reason)
        for reason in (NO_DP, NOISE_ONLY)
    }
    folders = "; ".join(f"`{e['study']}/` ({e['reason']})" for e in result["excluded"] if not e["rows"])
    empty = ", ".join(f"`{name}/`" for name in result["studies_without_dp_releases"])
    lines += [
        "",
        "How: basic composition (Σ ε at Σ δ of the stated guarantees) holds for any mechanisms. PLD composes, with "
        "privlm's accountant, the events read from committed ledgers, sidecars and cell summaries or, for GRADMM "
        "and PE cells that state only (ε, δ), the Gaussian releases that dominate them (snapping slack included), "
        "at the smallest δ among them; releases that cannot be rebuilt are added at their stated (ε, δ). Seeds and "
        "repeats are separate releases; grid rows of a DP-SGD method are one release where their sidecars name "
        "one run (its ledger and its identity), else each its own (a run made again at a lost run's path has the "
        "same events, and sidecars of an older privlm name no identity).",
        "",
        f"Seeded runs ({seeded} of the {releases} releases: their noise is reproducible from the seed, so as "
        "committed they guarantee nothing) count at the ε of the mechanism they ran, which is what an unseeded "
        f"run spends. Not counted: {counts[NO_DP]} no-DP cells (NOT private), {counts[NOISE_ONLY]} noise-only "
        f"controls (they read no private data), {folders}. {empty} hold no DP release.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """Write the JSON and Markdown statements under ``--root`` (default: this repository)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: %(default)s)")
    root = parser.parse_args(argv).root
    result = statement(root)
    (root / JSON_OUT).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (root / MARKDOWN_OUT).write_text(render_markdown(result), encoding="utf-8")
    for entry in result["data_sets"]:
        print(
            f"{entry['data']}: {entry['releases']} releases, basic ε = {entry['basic']['epsilon']:.2f}, "
            f"PLD ε = {entry['pld']['epsilon']:.2f} at δ = {entry['pld']['delta']:.2g}"
        )


if __name__ == "__main__":
    main()
