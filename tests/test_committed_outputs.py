"""Committed outputs of private mechanisms hold no exact count of the private data.

GRADMM and PE never release the private set's size N (under add/remove adjacency an exact N reveals
membership); DP-SGD accounts with N public, which its sidecars state. This scans what is committed
under ``research/``: privacy sidecars for count keys, and saved console logs for a progress line that
counts the private examples or a printed N.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COUNT_KEYS = {"private_examples", "n_private", "private_count", "examples_per_class"}
LOG_PATTERNS = (re.compile(r"private examples\)\s*[━ ]*\s\d[\d,]*/"), re.compile(r"\bN = \d"))


def _tracked(suffix: str) -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "research"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / p for p in listed.split() if p.endswith(suffix)]


def _keys(value: object) -> set[str]:
    if isinstance(value, dict):
        return set(value) | set().union(*(_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_keys(v) for v in value)) if value else set()
    return set()


def test_no_privacy_sidecar_holds_a_private_count():
    sidecars = _tracked(".privacy.json")
    assert sidecars, "no sidecar found: the scan would pass vacuously"
    offending = {str(p.relative_to(ROOT)): sorted(_keys(json.loads(p.read_text())) & COUNT_KEYS) for p in sidecars}
    assert {p: k for p, k in offending.items() if k} == {}


def test_no_saved_console_log_counts_the_private_examples():
    logs = _tracked(".log")
    assert logs, "no log found: the scan would pass vacuously"
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in logs
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if any(pattern.search(line) for pattern in LOG_PATTERNS)
    ]
    assert hits == []


def _committed_mirrors() -> list[Path]:
    """The run folders mirrored in a committed ``kept-runs/`` (privlm.experiments.kept_runs)."""
    tracked = (p for p in _tracked("") if "/kept-runs/" in p.as_posix())
    return sorted({p.parent for p in tracked if p.parent.parent.parent.name == "kept-runs"})  # kept-runs/CELL/RUN/


@pytest.mark.parametrize("mirror", _committed_mirrors(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_committed_run_mirror_is_public_and_never_ahead_of_its_studys_accounting(mirror: Path) -> None:
    """Only what PE names public (settings of a run with noise, its histograms, a population, journaled rewrites),
    every histogram booked in the mirrored ledger, and the study's accounting.json holding that ledger or one going
    on from it: the committed histograms' draws are all counted. A mirror without a ledger is a noise-only
    control's (seeded noise, nothing private read)."""
    from privlm.experiments.grid_privacy import continues
    from privlm.privacy.ledger import Ledger
    from privlm.synthesis.pe.mechanism import histogram_label

    public = re.compile(r"run\.json|privacy\.json|histogram\d+\.json|population\d+\.json|rewrites\d+-\d+\.jsonl")
    names = sorted(p.name for p in mirror.iterdir())
    assert [n for n in names if not public.fullmatch(n)] == []
    settings = json.loads((mirror / "run.json").read_text())
    assert settings["noise_multiplier"] is not None
    if not (mirror / "privacy.json").exists():
        assert settings.get("noise_only") is True
        return
    ledger = Ledger.load(mirror / "privacy.json")
    booked = {entry.label for entry in ledger}
    drawn = [int(n.removeprefix("histogram").removesuffix(".json")) for n in names if n.startswith("histogram")]
    assert [t for t in drawn if histogram_label(t) not in booked] == []
    study = next(p for p in mirror.parents if p.name == "kept-runs").parent
    rel = f"work/{(mirror / 'privacy.json').relative_to(study / 'kept-runs').as_posix()}"
    kept = json.loads((study / "accounting.json").read_text())["ledgers"]
    assert rel in kept and continues(Ledger.from_dict(kept[rel]), ledger)
