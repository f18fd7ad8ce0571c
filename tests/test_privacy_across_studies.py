"""The committed statement of what all studies cost together in privacy (``research/privacy_across_studies.py``):
it is what the script computes from the committed files now, every DP results row is counted exactly once, and
per data set the PLD composition lies between the largest single release and basic composition."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "research" / "privacy_across_studies.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("privacy_across_studies", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def result(script: ModuleType) -> dict[str, Any]:
    computed: dict[str, Any] = script.statement(ROOT)
    return computed


def _tracked() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "research"], cwd=ROOT, capture_output=True, text=True, check=True)
    return listed.stdout.split()


def _dp_rows() -> tuple[list[str], set[str]]:
    """Every DP results row of the committed files, found independently of the script (rows of experiment grids
    with an ε, DP ``privlm train`` summaries, DP sidecars), and those of noise-only controls."""
    found, noise_only = [], set()
    for path in _tracked():
        if path.startswith(("research/audit/", "benchmarks/results/")):
            continue
        if path.endswith("/results.jsonl"):
            folder = path.rsplit("/", 1)[0]
            for line in (ROOT / path).read_text().splitlines():
                row = json.loads(line)
                if row["epsilon"] is None:
                    continue
                found.append(f"{path}#{row['cell']}")
                config = json.loads((ROOT / folder / "configs" / f"{row['config_hash']}.json").read_text())
                method = next(m for m in config["methods"] if m["name"] == row["method"])
                if method["params"].get("noise_only"):
                    noise_only.add(found[-1])
        elif path.endswith("/demo.json"):  # privlm demo's report: its DP fine-tune (its GRADMM set has a sidecar)
            assert json.loads((ROOT / path).read_text())["privacy"]["releases"]["dp_finetune"]["epsilon"] > 0
            found.append(path)
        elif path.endswith(".json"):
            data = json.loads((ROOT / path).read_text())
            if isinstance(data, dict) and (
                (data.get("private") is True and "sample_rate" in data)
                or (path.endswith(".privacy.json") and data.get("dp") is True)
            ):
                found.append(path)
    return found, noise_only


def test_the_committed_statement_is_what_the_script_computes_now(script: ModuleType, result: dict[str, Any]) -> None:
    on_disk = json.loads((ROOT / script.JSON_OUT).read_text(encoding="utf-8"))
    assert on_disk == result, f"stale: rerun {SCRIPT.relative_to(ROOT)}"
    assert (ROOT / script.MARKDOWN_OUT).read_text(encoding="utf-8") == script.render_markdown(result)


def test_every_dp_results_row_is_counted_exactly_once(script: ModuleType, result: dict[str, Any]) -> None:
    found, noise_only = _dp_rows()
    assert len(found) > 100 and noise_only, "the scan found too little: it would pass vacuously"
    counted = [row for release in result["releases"] for row in release["rows"]]
    set_aside = [row for entry in result["excluded"] if entry["reason"] == script.NOISE_ONLY for row in entry["rows"]]
    assert set(set_aside) == noise_only
    assert Counter(counted + set_aside) == Counter(found)  # each DP row once: in one release, or a noise-only control


def test_pld_lies_between_the_largest_release_and_basic_composition(result: dict[str, Any]) -> None:
    assert {entry["data"] for entry in result["data_sets"]} >= {"rotten-tomatoes", "bbc-news"}
    for entry in result["data_sets"]:
        releases = [r for r in result["releases"] if r["data"] in entry["read_as"]]
        assert len(releases) == entry["releases"] > 1
        assert entry["dp_cells"] == sum(len(r["rows"]) for r in releases)
        assert entry["basic"]["epsilon"] == pytest.approx(sum(r["epsilon"] for r in releases), rel=1e-6)
        assert entry["basic"]["delta"] == pytest.approx(sum(r["delta"] for r in releases), rel=1e-6)
        pld, largest = entry["pld"], max(r["epsilon"] for r in releases)
        assert largest == entry["largest_release_epsilon"]
        assert largest < pld["epsilon"] <= entry["basic"]["epsilon"], entry["data"]
        assert pld["delta"] <= entry["basic"]["delta"]
        assert pld["rebuilt_releases"] == sum(r["rebuilt"] for r in releases)
    for entry in result["studies"]:  # each study alone: the same bounds over its own releases
        releases = [r for r in result["releases"] if (r["study"], r["data"]) == (entry["study"], entry["data"])]
        pld, largest = entry["pld"], max(r["epsilon"] for r in releases)
        assert len(releases) == entry["releases"] and pld["rebuilt_releases"] == sum(r["rebuilt"] for r in releases)
        assert largest - 1e-9 <= pld["epsilon"] <= entry["basic"]["epsilon"] + 1e-9, entry["study"]


def test_the_audit_and_each_noise_only_or_no_dp_reason_is_named(script: ModuleType, result: dict[str, Any]) -> None:
    reasons = {(entry["study"], entry["reason"]) for entry in result["excluded"]}
    assert ("audit", script.EXCLUDED_FOLDERS["audit"]) in reasons
    assert {reason for _, reason in reasons} >= {script.NO_DP, script.NOISE_ONLY}


def test_a_data_set_made_of_another_s_records_composes_with_it(result: dict[str, Any]) -> None:
    """bbc-headlines is the bbc-news articles: its DP cells are in the bbc-news composition, never apart."""
    groups = {entry["data"]: entry for entry in result["data_sets"]}
    assert "bbc-headlines" not in groups
    headline_cells = [r for r in result["releases"] if r["data"] == "bbc-headlines"]
    assert headline_cells  # the study's private cells are committed
    assert "bbc-headlines" in groups["bbc-news"]["read_as"] and "bbc_headlines" in groups["bbc-news"]["studies"]


def test_a_dp_finetune_run_is_rebuilt_from_the_grid_s_kept_ledger(script: ModuleType, result: dict[str, Any]) -> None:
    """synthetic_at_scale's dp-finetune-gen run enters PLD with the ledger accounting.json keeps for its set, and
    that ledger gives the sidecar's accounted ε again (privlm's PLD accountant, recomputed here)."""
    from privlm.privacy import Ledger, LedgerEntry

    kept = json.loads((ROOT / "research/synthetic_at_scale/accounting.json").read_text())["sidecars"]
    runs = [
        r for r in result["releases"] if r["study"] == "synthetic_at_scale" and r["rows"] and "dp-finetune" in r["name"]
    ]
    assert runs and all(r["rebuilt"] for r in runs)
    for release in runs:
        cell = release["rows"][0].split("#")[1]
        sidecar = kept[f"work/{cell}/synthetic.privacy.json"]
        assert release["events"] == sidecar["ledger"]
        entries = [LedgerEntry.from_dict(item) for item in sidecar["ledger"]]
        assert Ledger(entries).epsilon(release["delta"]) == pytest.approx(sidecar["epsilon_accounted"], rel=1e-9)


def _kept(tmp_path: Path, script: ModuleType, sidecars: dict[str, Any]) -> Any:
    (tmp_path / "grid").mkdir(parents=True)
    (tmp_path / "grid" / script.ACCOUNTING).write_text(json.dumps({"format": "x", "ledgers": {}, "sidecars": sidecars}))
    return script.Scan(tmp_path, frozenset({f"grid/{script.ACCOUNTING}"}))


def test_a_kept_ledger_that_states_less_than_its_sidecar_is_not_used(script: ModuleType, tmp_path: Path) -> None:
    from privlm.privacy import LedgerEntry, PoissonGaussianStep

    step = LedgerEntry(PoissonGaussianStep(0.05, 1.5, "exact", None, 0), 30, "steps").to_dict()
    row = {"cell": "dp-finetune-gen_n100_seed0_eps1", "delta": 1e-5}
    side = {"dp": True, "ledger": [step], "epsilon_accounted": 100.0}
    scan = _kept(tmp_path, script, {"work/dp-finetune-gen_n100_seed0_eps1/synthetic.privacy.json": side})
    entries, source = script._dpft_entries(scan, "grid", row)
    assert entries is None and "gives ε" in source
    side["epsilon_accounted"] = script.Ledger([LedgerEntry.from_dict(step)]).epsilon(1e-5)
    scan = _kept(tmp_path / "b", script, {"work/dp-finetune-gen_n100_seed0_eps1/synthetic.privacy.json": side})
    entries, _ = script._dpft_entries(scan, "grid", row)
    assert entries == (LedgerEntry.from_dict(step),)
    assert script._dpft_entries(script.Scan(tmp_path, frozenset()), "grid", row) == (None, script.DPFT_NOT_REBUILT)
    entries, source = script._dpft_entries(scan, "grid", {**row, "cell": "other"})
    assert entries is None and "keeps no DP sidecar" in source


def test_a_kept_draw_whose_cell_has_no_row_yet_is_counted_at_its_ledger(script: ModuleType, tmp_path: Path) -> None:
    """A DP sidecar accounting.json keeps for a cell without a row is a release at its own ledger, a dp-finetune-gen
    training too where a finished row of another n names the same events (a run made again at a lost run's path
    cannot be told from one run serving both); a finished cell's and a noise-only control's are not."""
    from privlm.privacy import GaussianRelease, LedgerEntry, PoissonGaussianStep

    draw = LedgerEntry(GaussianRelease(3.7, snapped=10), 1, "GRADMM release").to_dict()
    steps = LedgerEntry(PoissonGaussianStep(0.05, 1.5, "exact", None, 0), 30, "steps").to_dict()
    sidecars = {
        "work/gradmm@instruct_n1000_seed0_eps1/synthetic.privacy.json": {"dp": True, "ledger": [draw]},
        "work/gradmm@instruct_n1000_seed1_eps1/synthetic.privacy.json": {"dp": True, "ledger": [draw]},
        "work/gradmm@instruct-noise_n1000_seed1_eps1/synthetic.privacy.json": {"dp": True, "noise_only": True},
        "work/dp-finetune-gen_n100_seed0_eps1/synthetic.privacy.json": {"dp": True, "ledger": [steps]},
        "work/dp-finetune-gen_n1000_seed0_eps1/synthetic.privacy.json": {"dp": True, "ledger": [steps]},
        "work/dp-finetune-gen_n1000_seed2_eps4/synthetic.privacy.json": {"dp": True, "ledger": [steps]},
    }
    rows = [
        {"cell": "gradmm@instruct_n1000_seed0_eps1", "method": "gradmm@instruct", "epsilon": 1.0, "seed": 0},
        {"cell": "dp-finetune-gen_n100_seed0_eps1", "method": "dp-finetune-gen", "epsilon": 1.0, "seed": 0},
    ]
    config = {"pool_per_class": "all", "dataset": "rotten-tomatoes", "data_seed": 0, "delta": 1e-5}
    grid = tmp_path / "research" / "grid"
    grid.mkdir(parents=True)
    (grid / script.ACCOUNTING).write_text(json.dumps({"format": "x", "ledgers": {}, "sidecars": sidecars}))
    (grid / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (grid / "config.json").write_text(json.dumps(config))
    scan = script.Scan(tmp_path, frozenset(f"research/grid/{f.name}" for f in grid.iterdir()))
    script.read_unfinished_draws(scan)
    counted = {r.name.split(" ")[0]: r for r in scan.releases}
    assert sorted(counted) == [
        "grid/dp-finetune-gen_n1000_seed0_eps1",
        "grid/dp-finetune-gen_n1000_seed2_eps4",
        "grid/gradmm@instruct_n1000_seed1_eps1",
    ]
    assert all(r.unfinished and r.rows == [] for r in scan.releases)
    seed1 = counted["grid/gradmm@instruct_n1000_seed1_eps1"]
    assert seed1.entries == (LedgerEntry.from_dict(draw),) and seed1.epsilon == 1.0
    assert counted["grid/dp-finetune-gen_n1000_seed2_eps4"].epsilon == 4.0
    assert counted["grid/dp-finetune-gen_n1000_seed0_eps1"].entries == (LedgerEntry.from_dict(steps),)


def test_a_kept_ledger_no_cell_s_set_names_is_counted(script: ModuleType, tmp_path: Path) -> None:
    """A ledger accounting.json keeps without a sidecar naming it (a training whose set is not written yet) or
    displaced by a new run at its path is a release at the ε its events give; a named ledger is not (its
    row or its sidecar counts it)."""
    from privlm.privacy import GaussianRelease, Ledger, LedgerEntry, PoissonGaussianStep

    draw = LedgerEntry(GaussianRelease(3.7, snapped=10), 1, "GRADMM release")
    steps = LedgerEntry(PoissonGaussianStep(0.05, 1.5, "exact", None, 0), 30, "steps")
    named = "work/gradmm@instruct_n1000_seed0_eps1/synthetic.jsonl.gradmm/privacy.json"
    training = "work/private-cache/abc/dpft-0123/privacy.json"
    ledgers = {
        named: Ledger([draw]).to_dict(),
        f"{named}#displaced-00ff": Ledger([draw]).to_dict(),
        training: Ledger([steps]).to_dict(),
    }
    side = {"dp": True, "ledger": [draw.to_dict()], "ledger_file": "synthetic.jsonl.gradmm/privacy.json"}
    sidecars = {"work/gradmm@instruct_n1000_seed0_eps1/synthetic.privacy.json": side}
    row = {"cell": "gradmm@instruct_n1000_seed0_eps1", "method": "gradmm@instruct", "epsilon": 1.0, "seed": 0}
    config = {"pool_per_class": "all", "dataset": "rotten-tomatoes", "data_seed": 0, "delta": 1e-5}
    grid = tmp_path / "research" / "grid"
    grid.mkdir(parents=True)
    (grid / script.ACCOUNTING).write_text(json.dumps({"format": "x", "ledgers": ledgers, "sidecars": sidecars}))
    (grid / "results.jsonl").write_text(json.dumps(row) + "\n")
    (grid / "config.json").write_text(json.dumps(config))
    scan = script.Scan(tmp_path, frozenset(f"research/grid/{f.name}" for f in grid.iterdir()))
    script.read_unfinished_draws(scan)
    counted = {r.name.split(" ")[0]: r for r in scan.releases}
    assert sorted(counted) == sorted([f"grid/{training}", f"grid/{named}#displaced-00ff"])
    assert all(r.unfinished and r.rows == [] for r in scan.releases)
    assert counted[f"grid/{training}"].entries == (steps,)
    assert counted[f"grid/{training}"].epsilon == pytest.approx(Ledger([steps]).epsilon(1e-5))
    assert counted[f"grid/{named}#displaced-00ff"].epsilon == pytest.approx(Ledger([draw]).epsilon(1e-5))


def test_rows_whose_sidecars_name_one_run_are_one_release(script: ModuleType, tmp_path: Path) -> None:
    """dp-finetune-gen trains once per (ε, seed) for every n: rows (finished or not) whose sidecars name one ledger
    and one run identity are one release; a row naming no identity (an older privlm) is its own release, and a
    kept ledger of another run than the one a sidecar names at its path still counts."""
    from privlm.privacy import Ledger, LedgerEntry, PoissonGaussianStep

    steps = LedgerEntry(PoissonGaussianStep(0.05, 1.5, "exact", None, 0), 30, "steps")
    epsilon = Ledger([steps]).epsilon(1e-5)

    def side(run: str | None, path: str) -> dict[str, Any]:
        named = {"ledger_run": run} if run else {}
        return {"dp": True, "ledger": [steps.to_dict()], "epsilon_accounted": epsilon, "ledger_file": path, **named}

    shared, other = "../private-cache/h/dpft-a/privacy.json", "../private-cache/h/dpft-b/privacy.json"
    sidecars = {
        "work/dp-finetune-gen_n100_seed0_eps4/synthetic.privacy.json": side("a" * 16, shared),
        "work/dp-finetune-gen_n1000_seed0_eps4/synthetic.privacy.json": side("a" * 16, shared),
        "work/dp-finetune-gen_n2000_seed0_eps4/synthetic.privacy.json": side("a" * 16, shared),  # no row yet
        "work/dp-finetune-gen_n100_seed1_eps4/synthetic.privacy.json": side(None, other),
        "work/dp-finetune-gen_n1000_seed1_eps4/synthetic.privacy.json": side(None, other),
        "work/dp-finetune-gen_n100_seed2_eps4/synthetic.privacy.json": side(
            "d" * 16, "../private-cache/h/c/privacy.json"
        ),
    }
    ledgers = {  # the ledger at dpft-c's path is a later run's ("c"), not the one the seed-2 set came from ("d")
        "work/private-cache/h/dpft-a/privacy.json": Ledger([steps], run="a" * 16).to_dict(),
        "work/private-cache/h/c/privacy.json": Ledger([steps], run="c" * 16).to_dict(),
    }
    config = {
        "pool_per_class": "all",
        "dataset": "rotten-tomatoes",
        "data_seed": 0,
        "delta": 1e-5,
        "methods": [{"name": "dp-finetune-gen", "params": {}}],
    }
    cells = [f"dp-finetune-gen_n{n}_seed{s}_eps4" for s, n in ((0, 100), (0, 1000), (1, 100), (1, 1000), (2, 100))]
    rows = [{"cell": c, "method": "dp-finetune-gen", "epsilon": 4.0, "delta": 1e-5, "config_hash": "h"} for c in cells]
    grid = tmp_path / "research" / "grid"
    (grid / "configs").mkdir(parents=True)
    (grid / script.ACCOUNTING).write_text(json.dumps({"format": "x", "ledgers": ledgers, "sidecars": sidecars}))
    (grid / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (grid / "config.json").write_text(json.dumps(config))
    (grid / "configs" / "h.json").write_text(json.dumps(config))
    files = ["config.json", "configs/h.json", "results.jsonl", script.ACCOUNTING]
    scan = script.Scan(tmp_path, frozenset(f"research/grid/{name}" for name in files))
    script.read_experiment_grids(scan)
    script.read_unfinished_draws(scan)
    found = sorted((sorted(r.rows), r.name.split(" ")[0]) for r in scan.releases)
    row = "research/grid/results.jsonl#"
    assert found == sorted(
        [
            ([], "grid/work/private-cache/h/c/privacy.json"),  # run "c": no sidecar names it
            (
                sorted([f"{row}{cells[0]}", f"{row}{cells[1]}"]),
                f"grid/{cells[0]}",
            ),  # one run "a", the unfinished n2000 too
            ([f"{row}{cells[2]}"], f"grid/{cells[2]}"),
            ([f"{row}{cells[3]}"], f"grid/{cells[3]}"),
            ([f"{row}{cells[4]}"], f"grid/{cells[4]}"),
        ]
    )
    assert all(r.entries is not None and r.entries[0].count == 30 for r in scan.releases)
