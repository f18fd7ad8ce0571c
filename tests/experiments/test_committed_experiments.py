"""The committed experiment files: each passes the checks its first cell would run (a typo fails here, not
hours into a driver), and each committed results row still carries its configuration's hashes (a code change
that re-keyed them would make ``--resume`` rerun every finished cell)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privlm.experiments.config import load_config
from privlm.experiments.finished import check_methods

ROOT = Path(__file__).resolve().parents[2]
TOMLS = sorted((ROOT / "research").glob("*/config.toml"))


def test_the_experiments_folder_has_configurations() -> None:
    assert len(TOMLS) >= 4


@pytest.mark.parametrize("toml", TOMLS, ids=lambda p: p.parent.name)
def test_a_committed_experiment_passes_the_checks_before_its_first_cell(toml: Path) -> None:
    check_methods(load_config(toml))


WITH_RESULTS = [t for t in TOMLS if (t.parent / "results.jsonl").exists()]


@pytest.mark.parametrize("toml", WITH_RESULTS, ids=lambda p: p.parent.name)
def test_committed_rows_keep_their_configuration_hashes(toml: Path) -> None:
    config = load_config(toml)
    results = toml.parent / "results.jsonl"
    names = {spec.name for spec in config.methods}
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    hashed = [r for r in rows if r["method"] in names and "method_hash" in r]
    stale = [
        r["cell"]
        for r in hashed
        if r["shared_hash"] != config.shared_hash or r["method_hash"] != config.method_hash(r["method"])
    ]
    assert hashed and not stale
