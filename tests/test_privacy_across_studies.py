"""The committed statement of what all studies cost together in privacy (``research/privacy_across_studies.py``):
it is what the script computes from the committed files now, every DP results row is counted exactly once, and
per data set the PLD composition lies between the largest single release and basic composition."""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "research" / "privacy_across_studies.py"


@pytest.fixture(scope="module")
def script(research_script) -> ModuleType:
    return research_script("privacy_across_studies.py")


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


def _differences(committed: Any, computed: Any, where: str = "$") -> Iterator[str]:
    """Where ``committed`` and ``computed`` differ: floats within 1e-9 relative count as equal (the calibrated σ
    of a rebuilt release moves in its 14th digit between CPUs), everything else must match exactly."""
    if isinstance(committed, float) and isinstance(computed, float):
        if not math.isclose(committed, computed, rel_tol=1e-9, abs_tol=0.0):
            yield f"{where}: {committed!r} != {computed!r}"
    elif isinstance(committed, dict) and isinstance(computed, dict):
        if committed.keys() != computed.keys():
            yield f"{where}: keys {sorted(committed.keys() ^ computed.keys())} on one side only"
        for key in committed.keys() & computed.keys():
            yield from _differences(committed[key], computed[key], f"{where}.{key}")
    elif isinstance(committed, list) and isinstance(computed, list):
        if len(committed) != len(computed):
            yield f"{where}: {len(committed)} != {len(computed)} items"
        for i, (a, b) in enumerate(zip(committed, computed, strict=False)):
            yield from _differences(a, b, f"{where}[{i}]")
    elif type(committed) is not type(computed) or committed != computed:
        yield f"{where}: {committed!r} != {computed!r}"


def test_differences_tolerates_float_noise_only() -> None:
    committed = {"a": [1.0, "x", {"b": 57.77069524456458}], "n": 3}
    assert not list(_differences(committed, {"a": [1.0, "x", {"b": 57.770695244565026}], "n": 3}))
    assert list(_differences(committed, {"a": [1.0, "x", {"b": 57.7707}], "n": 3}))  # a real change
    assert list(_differences(committed, {"a": [1.0, "y", {"b": 57.77069524456458}], "n": 3}))
    assert list(_differences(committed, {"a": [1.0, "x", {"b": 57.77069524456458}], "n": 3.0}))
    assert list(_differences(committed, {"a": [1.0, "x"], "n": 3}))
    assert list(_differences(committed, {"a": [1.0, "x", {"b": 57.77069524456458}]}))


def test_the_committed_statement_is_what_the_script_computes_now(script: ModuleType, result: dict[str, Any]) -> None:
    on_disk = json.loads((ROOT / script.JSON_OUT).read_text(encoding="utf-8"))
    stale = list(_differences(on_disk, result))
    assert not stale, f"stale: rerun {SCRIPT.relative_to(ROOT)}; first differences: {stale[:5]}"
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


def test_each_kind_of_release_not_rebuilt_is_told_once(script: ModuleType, result: dict[str, Any]) -> None:
    """Lost draws of one method differ only in their story: the note names each (method, study, reason) once,
    with all of their releases, so a reader adds the counts and finds every release not rebuilt."""
    text = script.render_markdown(result)
    for entry in result["data_sets"]:
        note = next(line for line in text.splitlines() if line.startswith(f"- **{entry['data']}**"))
        told = re.findall(r"(?:all but |; )(\d+) (\S+) releases? of (\S+) \(", note)
        groups = {(m["mechanism"].split(":")[0], m["study"], m["reason"]) for m in entry["not_rebuilt"]}
        assert len(told) == len(groups)
        assert {(mechanism, study) for _, mechanism, study in told} == {group[:2] for group in groups}
        assert sum(int(count) for count, _, _ in told) == sum(m["releases"] for m in entry["not_rebuilt"])


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


def test_an_earlier_draw_is_found_in_the_study_s_committed_history(script: ModuleType, tmp_path: Path) -> None:
    study = tmp_path / "research" / "s"
    study.mkdir(parents=True)
    (study / "README.md").write_text("The results.\n")
    (study / "HISTORY.md").write_text("- the first run\n  (seed 0) was lost with a machine\n")
    quote = "the first run (seed 0) was lost"
    assert script.told_in(script.Scan(tmp_path, frozenset()), "s", quote) is None  # the history is not committed
    committed = script.Scan(tmp_path, frozenset({"research/s/README.md", "research/s/HISTORY.md"}))
    assert script.told_in(committed, "s", quote) == "research/s/HISTORY.md"
    assert script.told_in(committed, "s", "The results.") == "research/s/README.md"
    assert script.told_in(committed, "s", "the second run") is None


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
    """dp-finetune-gen trains once per (ε, seed) for every n: rows (finished or not) whose sidecars name one run in
    the private cache (its ledger and identity) are one release, with the longest ledger and the largest ε; a row
    naming no identity (an older privlm) or a ledger outside the cache is its own release; a kept ledger of
    another run than the one a sidecar names at its path, or longer than every sidecar naming it, still counts."""
    from privlm.privacy import Ledger, LedgerEntry, PoissonGaussianStep

    step = PoissonGaussianStep(0.05, 1.5, "exact", None, 0)

    def side(run: str | None, path: str, count: int = 30) -> dict[str, Any]:
        ledger = Ledger([LedgerEntry(step, count, "steps")])
        named = {"ledger_run": run} if run else {}
        return {
            "dp": True,
            "ledger": [entry.to_dict() for entry in ledger],
            "epsilon_accounted": ledger.epsilon(1e-5),
            "ledger_file": path,
            **named,
        }

    def kept(count: int, run: str | None) -> dict[str, Any]:
        return Ledger([LedgerEntry(step, count, "steps")], run=run).to_dict()

    cache = "../private-cache/h"
    cells = [f"dp-finetune-gen_n{n}_seed{s}_eps4" for s in range(5) for n in (100, 1000)]
    named = [
        side("a" * 16, f"{cache}/a/privacy.json"),
        side("a" * 16, f"{cache}/a/privacy.json"),
        side(None, f"{cache}/b/privacy.json"),
        side(None, f"{cache}/b/privacy.json"),
        side("d" * 16, f"{cache}/c/privacy.json"),  # run "d", lost; "c" was made at its path since
        side(None, f"{cache}/c/privacy.json"),  # seed 2's n1000 cell: drawn, no row yet
        side("e" * 16, "../elsewhere/privacy.json"),  # one ledger outside the private cache, named twice
        side("e" * 16, "../elsewhere/privacy.json"),
        side("f" * 16, f"{cache}/f/privacy.json"),
        side("f" * 16, f"{cache}/f/privacy.json"),
    ]
    sidecars = {f"work/{cell}/synthetic.privacy.json": body for cell, body in zip(cells, named)}
    sidecars["work/dp-finetune-gen_n2000_seed0_eps4/synthetic.privacy.json"] = side(
        "a" * 16, f"{cache}/a/privacy.json", 40
    )
    ledgers = {
        "work/private-cache/h/a/privacy.json": kept(40, "a" * 16),  # named by the n2000 sidecar, which has 40 steps
        "work/private-cache/h/b/privacy.json": kept(30, None),
        "work/private-cache/h/c/privacy.json": kept(30, "c" * 16),  # a later run at c's path: no sidecar names it
        "work/private-cache/h/f/privacy.json": kept(45, "f" * 16),  # grown beyond every set its sidecars account
    }
    config = {
        "pool_per_class": "all",
        "dataset": "rotten-tomatoes",
        "data_seed": 0,
        "delta": 1e-5,
        "methods": [{"name": "dp-finetune-gen", "params": {}}],
    }
    finished = [cell for cell in cells if cell != "dp-finetune-gen_n1000_seed2_eps4"]
    rows = [
        {"cell": c, "method": "dp-finetune-gen", "epsilon": 4.0, "delta": 1e-5, "config_hash": "h"} for c in finished
    ]
    rows[1]["epsilon_spent"] = 4.5
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
    found = {r.name.split(" ")[0].removeprefix("grid/"): r for r in scan.releases}
    assert sorted(found) == sorted(
        [
            cells[0],  # run "a": both rows and the unfinished n2000 set, one release
            cells[2],
            cells[3],  # no identity: each row its own release
            cells[4],
            cells[5],  # seed 2's unfinished n1000 set: its own (no identity)
            "work/private-cache/h/c/privacy.json",  # run "c": no sidecar names it
            cells[6],
            cells[7],  # a ledger outside the cache: never merged
            cells[8],  # run "f": one release of its two rows ...
            "work/private-cache/h/f/privacy.json",  # ... and its kept ledger, longer than their copies, counted too
        ]
    )
    shared = found[cells[0]]
    assert sorted(shared.rows) == sorted(f"research/grid/results.jsonl#{cell}" for cell in cells[:2])
    assert (shared.serves, shared.epsilon, shared.entries[0].count, shared.unfinished) == (3, 4.5, 40, False)
    assert found[cells[8]].serves == 2 and found["work/private-cache/h/f/privacy.json"].entries[0].count == 45


def test_a_study_whose_stated_total_exceeds_its_composition_counts_a_shared_run_per_set(script: ModuleType) -> None:
    """When a README states more than the rebuilt releases compose to, every release falls back to its stated
    (ε, δ), and a run that served k sets counts k times (as if each set had been its own run)."""
    from privlm.privacy import GaussianRelease, LedgerEntry

    def release(rows: list[str], serves: int) -> Any:
        made = script.Release(
            "s", "s/x", "d", "train", "all", "m", 1.0, 1e-6, rows, (LedgerEntry(GaussianRelease(3.0)),), ""
        )
        made.serves = serves
        return made

    readme = "research/s/README.md"
    text = "The 3 DP cells, published together, cost at most ε = 50.0 at δ = 1e-5."

    class Stub(script.Scan):
        def text(self, path: str) -> str:
            return text if path == readme else super().text(path)

    scan = Stub(Path("/nonexistent"), frozenset({readme}))
    scan.releases = [release(["r1", "r2"], 2), release(["r3"], 1)]
    entry = script._study_entry(scan, "s", "d")
    assert entry["stated_totals"][0]["check"].startswith("the composition rebuilt here is below it")
    assert entry["pld"]["epsilon"] == pytest.approx(3.0) and entry["pld"]["delta"] == pytest.approx(3e-6)
