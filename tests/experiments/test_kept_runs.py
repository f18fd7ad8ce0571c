"""The public state of an unfinished PE run outlives its machine: kept, restored on a new machine, resumed without
a redraw of what was drawn, and counted once; a restore that could leave a draw uncounted is refused."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import privlm.randomness as randomness
import privlm.synthesis.pe.mechanism as pe
from privlm.errors import UserError
from privlm.experiments.config import load_config
from privlm.experiments.grid_privacy import KEPT, grid_privacy, keep_accounting
from privlm.experiments.kept_runs import KEPT_RUNS, METHOD_RECORD, keep_runs, restore_run
from privlm.experiments.runner import run_experiment
from privlm.experiments.wall_clock import WALL, read_segments
from privlm.privacy.events import GaussianRelease
from privlm.privacy.ledger import Ledger, LedgerEntry

CELL = "pe_n2_seed0_eps4"
MIRROR = f"{CELL}/synthetic.jsonl.pe"  # under kept-runs/
RUN = f"work/{MIRROR}"  # under the experiment folder


def _grid(tmp_path: Path, pe_params: str = "") -> Path:
    data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
    words = [("dull and slow", 0), ("warm and funny", 1), ("wooden, tired", 0), ("smart and moving", 1)]
    data.write_text(
        "".join(json.dumps({"text": f"the film is {t} {i}", "label": y}) + "\n" for i in range(10) for t, y in words)
    )
    toml.write_text(
        f'model = "tiny-llama"\ndataset = "jsonl:{data}"\nlabels = ["bad", "good"]\npool_per_class = 6\n'
        'n_per_class = [2]\nseeds = [0]\ntest_size = 6\n\n[finetune]\npreset = "tiny"\nepochs = 1\n\n'
        "[methods.pe]\nepsilons = [4.0]\niterations = 3\npopulation = 2.0\nvariations = 1\nmax_new_tokens = 6\n"
        "max_tokens = 16\n" + pe_params
    )
    return toml


@pytest.fixture
def fixed_noise(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One fixed noise key for every histogram (so two runs can be compared), and a count of the draws."""
    monkeypatch.setattr(randomness.os, "urandom", lambda n: bytes(range(n)))
    drawn: list[int] = []
    monkeypatch.setattr(pe, "noisy_histograms", _counted(pe.noisy_histograms, drawn))
    return drawn


def _counted(function: Callable[..., Any], calls: list[int]) -> Callable[..., Any]:
    """``function``, appending to ``calls`` at each call."""
    return lambda *a, **k: calls.append(1) or function(*a, **k)


def _lose_the_machine_in_the_rewrites(
    toml: Path, out: Path, monkeypatch: pytest.MonkeyPatch, resume: bool = False
) -> None:
    """Run the grid into PE's second rewrites (histograms 0 and 1 drawn, population 1 saved), keep as the CLI's
    --keep-accounting does, then lose every private file (``work/``)."""
    real, classes = pe.next_population, []

    def lost_in_iteration_2(*args, **kwargs):
        classes.append(1)
        if len(classes) > 2:  # iteration 1 wrote both classes' rewrites
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(pe, "next_population", lost_in_iteration_2)
        with pytest.raises(KeyboardInterrupt):
            run_experiment(load_config(toml), out, resume=resume)
    assert keep_runs(out)[0] == 1  # and accounting.json, as --keep-accounting does
    shutil.rmtree(out / "work")


def test_a_pe_run_lost_with_its_machine_resumes_from_its_kept_state_and_is_counted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixed_noise: list[int]
) -> None:
    toml = _grid(tmp_path)
    (reference,) = run_experiment(load_config(toml), tmp_path / "reference")  # uninterrupted, same noise key
    assert len(fixed_noise) == 3
    out = tmp_path / "out"
    _lose_the_machine_in_the_rewrites(toml, out, monkeypatch)
    assert len(fixed_noise) == 5
    mirror = out / KEPT_RUNS / MIRROR
    kept_files = ["histogram0.json", "histogram1.json", "population1.json", "privacy.json", "run.json"]
    assert sorted(p.name for p in mirror.iterdir()) == kept_files  # the latest population only
    kept_ledger = Ledger.load(mirror / "privacy.json")
    assert kept_ledger.count == 2 and kept_ledger.run is not None
    lost_s = read_segments(out / KEPT_RUNS / CELL / WALL)["set"]  # the lost machine's time, kept beside its run
    assert len(lost_s) == 1 and lost_s[0] > 0

    monkeypatch.setattr(pe, "zero_shot", lambda *a, **k: pytest.fail("the kept population is not made again"))
    (row,) = run_experiment(load_config(toml), out, resume=True)
    assert len(fixed_noise) == 6  # only histogram 2 was drawn on the new machine
    made = out / "sets" / f"{CELL}.jsonl"
    assert made.read_bytes() == (tmp_path / "reference" / "sets" / f"{CELL}.jsonl").read_bytes()
    assert row["accuracy"] == reference["accuracy"]
    ledger = Ledger.load(out / RUN / "privacy.json")
    assert ledger.run == kept_ledger.run and ledger.count == 3  # the lost machine's draws and this one's, once each
    assert not (out / KEPT_RUNS / CELL).exists()  # the set is made: its run's state is no longer kept
    made = json.loads((out / "sets" / f"{CELL}.time.json").read_text())
    assert made["segments"] == 2 and made["set_s"] > lost_s[0]  # the set's time counts both machines'
    kept = json.loads((out / KEPT).read_text())["ledgers"]
    assert list(kept) == [f"{RUN}/privacy.json"] and len(kept[f"{RUN}/privacy.json"]["entries"]) == 3
    grid = grid_privacy(out, [row], 1e-5)
    assert grid.releases == 3 and grid.epsilon is not None


def test_a_kept_run_of_the_grids_parameters_resumes_though_an_older_row_of_its_cell_is_in_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixed_noise: list[int]
) -> None:
    """The method hash a run is made with is kept with its mirror and read before the run is restored: a run of the
    grid's own parameters lost with its machine is resumed, not set aside for the cell's older row (made with
    other parameters) and drawn again."""
    toml = _grid(tmp_path)
    older = tmp_path / "older.toml"
    older.write_text(toml.read_text().replace("iterations = 3", "iterations = 2"))
    out = tmp_path / "out"
    (old_row,) = run_experiment(load_config(older), out)
    assert len(fixed_noise) == 2
    _lose_the_machine_in_the_rewrites(toml, out, monkeypatch, resume=True)  # the old set goes to stale/, its row stays
    assert len(fixed_noise) == 4
    kept = json.loads((out / KEPT_RUNS / CELL / METHOD_RECORD).read_text())["method_hash"]
    assert kept == load_config(toml).method_hash("pe") != old_row["method_hash"]
    (row,) = run_experiment(load_config(toml), out, resume=True)
    assert len(fixed_noise) == 5  # only histogram 2 drawn on the new machine
    assert row["method_hash"] == kept and Ledger.load(out / RUN / "privacy.json").count == 3
    assert len(list((out / "stale").glob(f"{CELL}.*"))) == 1  # the older set alone


def test_a_noise_only_run_lost_with_its_machine_resumes_from_its_kept_state_without_a_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PE's noise-only control reads no private data and books nothing: its public state is kept without a ledger,
    and a new machine resumes it (no population made again) to the uninterrupted run's set, nothing counted."""
    monkeypatch.setattr(pe.PrivateVoter, "_embeddings", lambda self: pytest.fail("the control read private data"))
    toml = _grid(tmp_path, "noise_only = true\n")
    run_experiment(load_config(toml), tmp_path / "reference")
    out = tmp_path / "out"
    _lose_the_machine_in_the_rewrites(toml, out, monkeypatch)
    mirror = out / KEPT_RUNS / MIRROR
    assert sorted(p.name for p in mirror.iterdir()) == [
        "histogram0.json",
        "histogram1.json",
        "population1.json",
        "run.json",
    ]
    monkeypatch.setattr(pe, "zero_shot", lambda *a, **k: pytest.fail("the kept population is not made again"))
    monkeypatch.setattr(pe, "next_population", _counted(pe.next_population, rewritten := []))
    (row,) = run_experiment(load_config(toml), out, resume=True)
    assert len(rewritten) == 2  # iteration 2's two classes only
    made = out / "sets" / f"{CELL}.jsonl"
    assert made.read_bytes() == (tmp_path / "reference" / "sets" / f"{CELL}.jsonl").read_bytes()
    assert not (out / RUN / "privacy.json").exists()
    assert json.loads((out / KEPT).read_text())["ledgers"] == {} and grid_privacy(out, [row], 1e-5).releases == 0


def test_a_dp_run_without_a_ledger_is_not_kept_and_a_control_is_restored_without_another_runs_ledger(
    tmp_path: Path,
) -> None:
    """Only a run that releases nothing is kept without a ledger: a DP run before its first draw is not kept (files
    without the ledger that books them are never published). A control's mirror is restored without a ledger even
    where accounting.json holds one at its path (a run set aside there: it stays counted in accounting.json, and
    the control books nothing)."""
    run = tmp_path / RUN
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"noise_multiplier": 5.0}) + "\n")
    (run / "population0.json").write_text("[]\n")
    assert keep_runs(tmp_path)[0] == 0 and not (tmp_path / KEPT_RUNS).exists()
    (run / "run.json").write_text(json.dumps({"noise_multiplier": 5.0, "noise_only": True}) + "\n")
    (run / "histogram0.json").write_text("{}\n")
    assert keep_runs(tmp_path)[0] == 1
    expected = ["histogram0.json", "population0.json", "run.json"]
    assert sorted(p.name for p in (tmp_path / KEPT_RUNS / MIRROR).iterdir()) == expected
    shutil.rmtree(tmp_path / "work")
    kept = json.loads((tmp_path / KEPT).read_text())
    kept["ledgers"][f"{RUN}/privacy.json"] = Ledger(_entries(2), run="a1").to_dict()  # an earlier run's, set aside
    (tmp_path / KEPT).write_text(json.dumps(kept))
    (restored,) = restore_run(tmp_path, CELL)
    assert restored == run and sorted(p.name for p in restored.iterdir()) == expected


def test_a_run_folder_moved_while_its_files_are_read_is_not_kept_without_its_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder set aside (moved whole) after its files were read has no ledger where it was: that is not a run
    without draws, and its histograms are not kept without the ledger that books them."""
    run = _pe_folder(tmp_path)
    real, reads = pe.PEPaths.ledger, []

    def moved_after_the_files(self):
        reads.append(1)
        if len(reads) == 2:  # the snapshot's ledger read, after the files (the first read: finding the runs)
            run.parent.rename(tmp_path / "stale")
        return real.fget(self)

    monkeypatch.setattr(pe.PEPaths, "ledger", property(moved_after_the_files))
    keep_runs(tmp_path)
    assert len(reads) >= 2 and not (tmp_path / KEPT_RUNS / MIRROR).exists()


def _mirror(out: Path, mirrored: Ledger, accounted: Ledger | None) -> Path:
    """A mirrored run folder of one file and ``mirrored`` as its ledger; ``accounted``: accounting.json's copy."""
    folder = out / KEPT_RUNS / MIRROR
    folder.mkdir(parents=True)
    (folder / "histogram0.json").write_text("{}\n")
    mirrored.save(folder / "privacy.json")
    ledgers = {} if accounted is None else {f"{RUN}/privacy.json": accounted.to_dict()}
    (out / KEPT).write_text(json.dumps({"format": "privlm-grid-accounting", "ledgers": ledgers, "sidecars": {}}))
    return folder


def _entries(n: int) -> list[LedgerEntry]:
    return [LedgerEntry(GaussianRelease(5.0), 1, f"PE histogram {t}") for t in range(n)]


@pytest.mark.parametrize("mirrored_count, accounted_count", [(1, 3), (3, 1), (2, None)])
def test_a_restore_takes_the_kept_ledger_that_goes_further(
    tmp_path: Path, mirrored_count: int, accounted_count: int | None
) -> None:
    """accounting.json's copy may have grown after the mirror was made (a later keep of the ledgers alone): the
    restored ledger is the longer of the two, so a draw booked by either stays counted."""
    mirrored = Ledger(_entries(mirrored_count), run="a1")
    accounted = None if accounted_count is None else Ledger(_entries(accounted_count), run="a1")
    _mirror(tmp_path, mirrored, accounted)
    (restored,) = restore_run(tmp_path, CELL)
    assert restored == tmp_path / RUN
    ledger = Ledger.load(restored / "privacy.json")
    assert ledger.run == "a1" and ledger.count == max(mirrored_count, accounted_count or 0)
    assert (restored / "histogram0.json").read_text() == "{}\n"
    assert restore_run(tmp_path, CELL) == []  # a live run folder is never written over


@pytest.mark.parametrize(
    "other", [Ledger(_entries(2), run="b2"), Ledger([LedgerEntry(GaussianRelease(9.0), 1)], run="a1")]
)
def test_a_restore_whose_two_kept_ledgers_are_not_one_run_going_on_is_refused_and_writes_nothing(
    tmp_path: Path, other: Ledger
) -> None:
    _mirror(tmp_path, Ledger(_entries(1), run="a1"), other)
    with pytest.raises(UserError, match="not one run going on"):
        restore_run(tmp_path, CELL)
    assert not (tmp_path / "work").exists()


def _pe_folder(out: Path, sigma: float | None = 5.0) -> Path:
    """A PE run folder (as PE leaves it mid-run) with two booked draws and files of every kind."""
    run = out / RUN
    run.mkdir(parents=True)
    Ledger(_entries(2), run="a1").save(run / "privacy.json")
    (run / "run.json").write_text(json.dumps({"noise_multiplier": sigma}) + "\n")
    for name in (
        "histogram0.json",
        "histogram1.json",
        "population0.json",
        "population1.json",
        "rewrites2-0.jsonl",
        "rewrites1-0.jsonl",
        ".lock",
        "private.npz",
    ):
        (run / name).write_text(f"{name}\n")
    return run


def test_only_the_public_files_of_unfinished_runs_are_mirrored_and_stale_ones_go(tmp_path: Path) -> None:
    """The mirror holds what PE names public (never the lock, an embedding cache or anything else in the folder),
    follows the run (an older population leaves it), its ledger is in accounting.json from the same call, and it
    goes once the cell's set is made."""
    run = _pe_folder(tmp_path)
    assert keep_runs(tmp_path)[0] == 1
    mirror = tmp_path / KEPT_RUNS / MIRROR
    expected = [
        "histogram0.json",
        "histogram1.json",
        "population1.json",
        "privacy.json",
        "rewrites2-0.jsonl",
        "run.json",
    ]
    assert sorted(p.name for p in mirror.iterdir()) == expected
    assert (mirror / "population1.json").read_text() == "population1.json\n"
    (run / "rewrites2-0.jsonl").unlink()
    (run / "population2.json").write_text("population2.json\n")
    keep_runs(tmp_path)
    assert sorted(p.name for p in mirror.iterdir()) == sorted(
        {*expected, "population2.json"} - {"population1.json", "rewrites2-0.jsonl"}
    )
    (tmp_path / "sets").mkdir()
    (tmp_path / "sets" / f"{CELL}.jsonl").write_text("")
    assert keep_runs(tmp_path)[0] == 0 and not (tmp_path / KEPT_RUNS / CELL).exists()
    assert Ledger.from_dict(json.loads((tmp_path / KEPT).read_text())["ledgers"][f"{RUN}/privacy.json"]).count == 2


def test_a_run_without_noise_is_never_mirrored(tmp_path: Path) -> None:
    """PE with epsilon 'none' saves exact private vote counts as its histograms: nothing of it is published."""
    _pe_folder(tmp_path, sigma=None)
    assert keep_runs(tmp_path)[0] == 0 and not (tmp_path / KEPT_RUNS).exists()


def test_a_draw_made_while_the_mirror_is_read_is_in_the_mirrored_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PE runs in another process: a draw booked (write-ahead) and saved while the mirror is being made. The
    ledger is read after the files, so a histogram in the mirror always has its booking there."""
    run = _pe_folder(tmp_path)
    real = pe.PEPaths.public_files

    def drawn_meanwhile(self):
        ledger = Ledger.load(self.ledger)
        ledger.append(LedgerEntry(GaussianRelease(5.0), 1, "PE histogram 2"))
        ledger.save(self.ledger)
        (run / "histogram2.json").write_text("histogram2.json\n")
        return real(self)

    monkeypatch.setattr(pe.PEPaths, "public_files", drawn_meanwhile)
    keep_runs(tmp_path)
    mirror = tmp_path / KEPT_RUNS / MIRROR
    assert (mirror / "histogram2.json").exists() and Ledger.load(mirror / "privacy.json").count == 3


def test_the_mirrored_ledger_is_folded_into_accounting_json_unless_its_copy_goes_further(tmp_path: Path) -> None:
    """On a new machine (no live ledger at the path) the mirror's ledger stands in accounting.json; a copy there
    that went further (same run) stays, and a copy of another run is kept aside and counted too."""
    _mirror(tmp_path, Ledger(_entries(2), run="a1"), Ledger(_entries(3), run="a1"))
    keep_accounting(tmp_path)
    kept = json.loads((tmp_path / KEPT).read_text())["ledgers"]
    assert list(kept) == [f"{RUN}/privacy.json"] and Ledger.from_dict(kept[f"{RUN}/privacy.json"]).count == 3
    (tmp_path / KEPT).unlink()
    shutil.rmtree(tmp_path / KEPT_RUNS)
    _mirror(tmp_path, Ledger(_entries(2), run="a1"), Ledger(_entries(1), run="zz"))
    keep_accounting(tmp_path)
    kept = json.loads((tmp_path / KEPT).read_text())["ledgers"]
    assert sorted(Ledger.from_dict(v).run for v in kept.values()) == ["a1", "zz"]


def test_a_restore_is_refused_when_accounting_json_cannot_be_read(tmp_path: Path) -> None:
    _mirror(tmp_path, Ledger(_entries(1), run="a1"), None)
    (tmp_path / KEPT).write_text("<<<<<<< HEAD\n")
    with pytest.raises(UserError, match="not a readable"):
        restore_run(tmp_path, CELL)
    assert not (tmp_path / "work").exists()


def test_pe_refuses_a_folder_holding_more_histograms_than_its_ledger_books(tmp_path: Path) -> None:
    from privlm.resources.tiny import build_tiny_model
    from privlm.synthesis.pe.config import PEConfig

    run = _pe_folder(tmp_path)
    (run / ".lock").unlink()
    (run / "histogram2.json").write_text("{}\n")
    model, tokenizer = build_tiny_model("tiny-llama", seed=2)
    config = PEConfig(iterations=3, population=2.0, variations=1, max_new_tokens=6, max_tokens=16)
    (run / "run.json").unlink()  # the settings are checked first: let this run write its own
    with pytest.raises(UserError, match=r"histograms its ledger does not book \(2\)"):
        pe.run_pe(
            model,
            tokenizer,
            ["bad", "good"],
            lambda: pytest.fail("nothing private is read"),
            out=run.parent / "synthetic.jsonl",
            per_class=1,
            config=config,
            epsilon=4.0,
            delta=1e-5,
            resume=True,
        )


def test_accounting_json_holds_a_runs_ledger_before_its_mirror_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keep killed while it writes the mirror leaves accounting.json with the ledger: a mirror is never ahead."""
    import privlm.experiments.kept_runs as kept_runs

    _pe_folder(tmp_path)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(kept_runs, "_mirror_run", killed)
    with pytest.raises(KeyboardInterrupt):
        keep_runs(tmp_path)
    kept = json.loads((tmp_path / KEPT).read_text())["ledgers"]
    assert Ledger.from_dict(kept[f"{RUN}/privacy.json"]).count == 2


def test_a_restore_leaves_other_restores_being_built_alone(tmp_path: Path) -> None:
    _mirror(tmp_path, Ledger(_entries(1), run="a1"), None)
    other = tmp_path / ".restoring-another"  # another shard's restore of another cell, being built
    other.mkdir()
    (other / "histogram0.json").write_text("{}\n")
    (restored,) = restore_run(tmp_path, CELL)
    assert (other / "histogram0.json").exists() and sorted(p.name for p in tmp_path.glob(".restoring-*")) == [
        other.name
    ]
    assert Ledger.load(restored / "privacy.json").count == 1


def test_a_pe_noise_only_control_in_the_grid_is_mirrored_without_a_ledger_and_never_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pe@noise`` (the same PE parameters plus ``noise_only``): its public state is mirrored without a ledger
    (it has none) and nothing of it is composed; the grid's statement counts the DP run's histograms alone, and the
    control's card claims nothing."""
    toml = _grid(tmp_path)
    params = toml.read_text().split("[methods.pe]\n")[1]
    toml.write_text(toml.read_text() + '\n[methods."pe@noise"]\n' + params + "noise_only = true\n")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:  # the control stops in its first rewrites, histogram 0 drawn
        patch.setattr(pe, "next_population", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run_experiment(load_config(toml), tmp_path / "out", cells_matching=["pe@noise_*"])
    assert (tmp_path / "out" / "work" / "pe@noise_n2_seed0_eps4" / "synthetic.jsonl.pe" / "histogram0.json").exists()
    assert keep_runs(tmp_path / "out")[0] == 1
    mirrored = tmp_path / "out" / KEPT_RUNS / "pe@noise_n2_seed0_eps4" / "synthetic.jsonl.pe"
    assert (mirrored / "histogram0.json").exists() and not (mirrored / "privacy.json").exists()
    assert json.loads((tmp_path / "out" / KEPT).read_text())["ledgers"] == {}
    rows = run_experiment(load_config(toml), tmp_path / "out", resume=True)
    assert not (tmp_path / "out" / KEPT_RUNS / "pe@noise_n2_seed0_eps4").exists()  # its set is made
    assert sorted(r["method"] for r in rows) == ["pe", "pe@noise"]
    control = tmp_path / "out" / "work" / "pe@noise_n2_seed0_eps4"
    assert not (control / "synthetic.jsonl.pe" / "privacy.json").exists()
    assert json.loads((control / "synthetic.privacy.json").read_text())["epsilon"] == 0.0
    assert grid_privacy(tmp_path / "out", rows, 1e-5).releases == 3  # pe's three histograms
    card = (tmp_path / "out" / "sets" / "pe@noise_n2_seed0_eps4.card.md").read_text()
    assert "noise-only" in card and "WARNING" not in card
    report = (tmp_path / "out" / "report.md").read_text()
    assert "vs noise-only pe@noise" in report  # read against its control
