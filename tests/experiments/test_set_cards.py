"""The data card of each grid cell's set: a DP set states its sidecar's ε and guarantee (no copy of the sidecar beside the
set, no path into the private work folder), a public set says it read no private data, a set of real rows or a DP
method's set without a sidecar is NOT private, and seeded noise, or noise of unknown origin, is warned of."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from privlm.experiments.config import Cell, parse_config
from privlm.experiments.grid_privacy import keep_accounting
from privlm.experiments.set_cards import GRID_NOTE, write_set_card
from privlm.privacy.events import GaussianRelease
from privlm.privacy.ledger import Ledger, LedgerEntry
from privlm.synthesis.registry import NON_PRIVATE, PUBLIC, Method

ROWS = [
    {"text": "a fine film", "label": 1, "label_name": "good"},
    {"text": "a dull one", "label": 0, "label_name": "bad"},
]
PUBLIC_INPUTS = {"class names": "bad, good", "label words": "bad, good", "prompt template": "'{text} It was '"}


def _config():
    methods = {"dp": {"epsilons": [1.0], "shots": 3}, "pub": {}, "real": {}}
    return parse_config(
        {"model": "tiny-llama", "dataset": "rotten-tomatoes", "pool_per_class": 6, "n_per_class": [2], "seeds": [0]}
        | {"methods": methods},
        "grid.toml",
    )


def _sidecar(out: Path, key: str, seeded: bool, **body: object) -> Path:
    """A DP sidecar in the cell's work folder naming a ledger (of seeded noise or not); returns the ledger's path."""
    work = out / "work" / key
    ledger = Ledger([LedgerEntry(GaussianRelease(3.0), 1, "release")], private_release=not seeded)
    (work / "run").mkdir(parents=True)
    ledger.save(work / "run" / "privacy.json")
    statement = {"dp": True, "epsilon": 1.0, "delta": 1e-5, "ledger": [e.to_dict() for e in ledger], **body}
    (work / "synthetic.privacy.json").write_text(json.dumps({**statement, "ledger_file": "run/privacy.json"}))
    return work / "run" / "privacy.json"


def _card(out: Path, method: str, privacy: str, **kw) -> str:
    cell = Cell(method, 2, 0, kw.get("epsilon"))
    path = write_set_card(out, cell, Method(lambda ctx: [], privacy), _config(), PUBLIC_INPUTS, ROWS)
    assert path == out / "sets" / f"{cell.key}.card.md"
    return path.read_text()


def test_a_dp_set_states_its_sidecar(tmp_path: Path) -> None:
    _sidecar(tmp_path, "dp_n2_seed0_eps1", seeded=False)
    card = _card(tmp_path, "dp", "(ε, δ)-DP", epsilon=1.0)
    assert "(ε = 1, δ = 1e-05)-DP" in card and "## The guarantee" in card and GRID_NOTE in card
    assert "WARNING" not in card and "Rows:** 2 (good: 1, bad: 1)" in card
    assert "method parameter shots: 3" in card and "grid configuration: configs/" in card
    assert "run/privacy.json" not in card and ".privacy.json" not in card  # no path into work/, no sidecar listed
    assert sorted(p.name for p in (tmp_path / "sets").iterdir()) == ["dp_n2_seed0_eps1.card.md"]


def test_seeded_or_unknown_noise_is_warned_of(tmp_path: Path) -> None:
    _sidecar(tmp_path, "dp_n2_seed0_eps1", seeded=True)
    assert "WARNING: seeded noise" in _card(tmp_path, "dp", "(ε, δ)-DP", epsilon=1.0)
    # the sidecar's own flag wins over its ledger's
    _sidecar(tmp_path / "flag", "dp_n2_seed0_eps1", seeded=False, private_release=False)
    assert "WARNING: seeded noise" in _card(tmp_path / "flag", "dp", "(ε, δ)-DP", epsilon=1.0)
    # a ledger that cannot be read: the origin of the noise is unknown, so the card does not vouch for it
    _sidecar(tmp_path / "gone", "dp_n2_seed0_eps1", seeded=False).unlink()
    assert "WARNING: seeded noise" in _card(tmp_path / "gone", "dp", "(ε, δ)-DP", epsilon=1.0)


def test_a_noise_only_control_composes_nothing_and_is_not_warned_of(tmp_path: Path) -> None:
    work = tmp_path / "work" / "dp_n2_seed0_eps1"
    work.mkdir(parents=True)
    control = {"dp": True, "noise_only": True, "epsilon": 0.0, "delta": 0.0, "noise_multiplier": 3.0}
    (work / "synthetic.privacy.json").write_text(json.dumps(control))  # no ledger: it drew nothing private
    card = _card(tmp_path, "dp", "(ε, δ)-DP", epsilon=1.0)
    assert "no private data was read" in card and "`noise_multiplier`: 3" in card
    assert GRID_NOTE not in card and "WARNING" not in card and "## The guarantee" not in card


def test_a_card_written_after_the_work_folder_is_lost_reads_the_kept_copies(tmp_path: Path) -> None:
    _sidecar(tmp_path, "dp_n2_seed0_eps1", seeded=False)
    keep_accounting(tmp_path)
    fresh = _card(tmp_path, "dp", "(ε, δ)-DP", epsilon=1.0)
    shutil.rmtree(tmp_path / "work")
    assert _card(tmp_path, "dp", "(ε, δ)-DP", epsilon=1.0) == fresh and "WARNING" not in fresh
    _sidecar(tmp_path / "seeded", "dp_n2_seed0_eps1", seeded=True)  # the kept ledger's flag is read too
    keep_accounting(tmp_path / "seeded")
    shutil.rmtree(tmp_path / "seeded" / "work")
    assert "WARNING: seeded noise" in _card(tmp_path / "seeded", "dp", "(ε, δ)-DP", epsilon=1.0)


def test_public_real_and_unbacked_sets(tmp_path: Path) -> None:
    public = _card(tmp_path, "pub", PUBLIC)
    assert "no private data was read" in public and "NOT differentially private" not in public
    assert "## The guarantee" not in public and ".privacy.json" not in public
    real = _card(tmp_path, "real", NON_PRIVATE)
    assert GRID_NOTE not in public and GRID_NOTE not in real  # they compose nothing
    assert f"NOT differentially private:** {NON_PRIVATE}" in real and "-DP" not in real
    # a DP method's set without its sidecar never claims the guarantee
    unbacked = _card(tmp_path, "dp", "(ε, δ)-DP", epsilon=1.0)
    assert "NOT differentially private" in unbacked and "(ε = 1" not in unbacked
    assert "privacy statement (its sidecar and ledger) was lost" in unbacked  # says why, not "no noise"
    assert "was lost" not in real and "rows may be its own examples" in real and "rows are synthetic" in public
    coreset = _card(tmp_path, "real", NON_PRIVATE + " (random coreset of real examples)")
    assert f"NOT differentially private:** {NON_PRIVATE} (random coreset" in coreset and "was lost" not in coreset
