"""The grid's composed privacy: every write-ahead ledger under work/ (once per finished cell that claims it), checked
against the DP cells' sidecars, composed as Google's dp-accounting composes the same mechanisms."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from privlm.errors import UserError
from privlm.experiments.config import parse_config
from privlm.experiments.grid_privacy import grid_privacy, keep_accounting
from privlm.experiments.report import write_report
from privlm.privacy.events import GaussianRelease, PoissonGaussianStep
from privlm.privacy.ledger import Ledger, LedgerEntry

DELTA = 1e-5
RELEASE = GaussianRelease(3.0)
STEP = PoissonGaussianStep(0.05, 1.2)  # exact clipping: the reference below is the plain subsampled Gaussian


def _ledger(path: Path, *entries: LedgerEntry, run: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Ledger(entries, run=run).save(path)


def _sidecar(work: Path, cell: str, entries: list[dict] | None, **extra: object) -> None:
    (work / cell).mkdir(parents=True, exist_ok=True)
    body = {"dp": True, **({} if entries is None else {"ledger": entries}), **extra}
    (work / cell / "synthetic.privacy.json").write_text(json.dumps(body))


def _row(cell: str, epsilon: float | None) -> dict:
    return {"cell": cell, "epsilon": epsilon}


def _grid(work: Path) -> list[dict]:
    """Two GRADMM-like cells (one release each in their own run folder), a noise-only control, a no-DP cell and two
    cells whose sidecars name one DP training run's ledger in the private cache (a checkpoint inside it holds a
    prefix copy of its ledger): counted once per cell, as nothing tells one run serving both from a run made again."""
    release = LedgerEntry(RELEASE, 1, "GRADMM release")
    for cell in ("gradmm_n5_seed0_eps1", "gradmm_n5_seed1_eps1"):
        _ledger(work / cell / "synthetic.jsonl.gradmm" / "privacy.json", release)
        _sidecar(work, cell, [release.to_dict()])
    _sidecar(work, "gradmm@noise_n5_seed0_eps1", None, noise_only=True)
    steps = LedgerEntry(STEP, 40, "steps 1-40")
    _ledger(work / "private-cache" / "h" / "dpft-x" / "privacy.json", steps)
    _ledger(
        work / "private-cache" / "h" / "dpft-x" / "checkpoint-20" / "privacy.json", LedgerEntry(STEP, 20, "steps 1-20")
    )
    for cell in ("dp-finetune-gen_n5_seed0_eps1", "dp-finetune-gen_n10_seed0_eps1"):
        _sidecar(work, cell, [steps.to_dict()], ledger_file="../private-cache/h/dpft-x/privacy.json")
    cells = [
        "gradmm_n5_seed0_eps1",
        "gradmm_n5_seed1_eps1",
        "gradmm@noise_n5_seed0_eps1",
        "dp-finetune-gen_n5_seed0_eps1",
        "dp-finetune-gen_n10_seed0_eps1",
    ]
    return [_row(cell, 1.0) for cell in cells] + [_row("gradmm_n5_seed0_epsnone", None)]


def test_every_ledger_is_composed_once_per_cell_that_claims_it_as_dp_accounting_composes_it(tmp_path: Path) -> None:
    rows = _grid(tmp_path / "work")
    found = grid_privacy(tmp_path, rows, DELTA)
    reference = (
        pld_lib.from_gaussian_mechanism(RELEASE.noise_multiplier, value_discretization_interval=1e-4)
        .self_compose(2)
        .compose(
            pld_lib.from_gaussian_mechanism(
                STEP.noise_multiplier, sampling_prob=STEP.sample_rate, value_discretization_interval=1e-4
            ).self_compose(2 * 40)  # the shared-cache ledger, claimed by two cells
        )
    ).get_epsilon_for_delta(DELTA)
    assert (found.dp_cells, found.ledgers, found.releases, found.unaccounted) == (4, 3, 2 + 2 * 40, ())
    assert found.epsilon == pytest.approx(reference, rel=2e-2)
    assert found.epsilon >= reference - 1e-3  # pessimistic: never below the reference
    one_release = pld_lib.from_gaussian_mechanism(RELEASE.noise_multiplier).get_epsilon_for_delta(DELTA)
    assert found.epsilon > one_release  # composed, not the largest single cell
    assert f"ε = {found.epsilon:.2f}" in found.statement()


def test_a_dp_cell_whose_draw_is_not_ledgered_leaves_the_grid_epsilon_unstated(tmp_path: Path) -> None:
    work = tmp_path / "work"
    rows = _grid(work)
    # a deleted run folder: the other GRADMM cell's ledger books the same event, yet it accounts for its own draw only
    (work / "gradmm_n5_seed1_eps1" / "synthetic.jsonl.gradmm" / "privacy.json").unlink()
    _sidecar(work, "pe_n5_seed0_eps1", [LedgerEntry(GaussianRelease(7.0), 3).to_dict()])  # its run folder is elsewhere
    _sidecar(work, "gradmm_n10_seed0_eps1", None)  # a sidecar from before ledgers
    _sidecar(
        work,
        "pe_n5_seed1_eps1",
        [LedgerEntry(GaussianRelease(7.0), 3).to_dict()],
        ledger_file="../gradmm_n5_seed0_eps1/synthetic.jsonl.gradmm/privacy.json",
    )  # a ledger of other draws
    cells = ["pe_n5_seed0_eps1", "gradmm_n10_seed0_eps1", "gradmm_n20_seed0_eps1", "pe_n5_seed1_eps1"]
    found = grid_privacy(tmp_path, rows + [_row(cell, 1.0) for cell in cells], DELTA)
    assert found.epsilon is None
    assert found.unaccounted == ("gradmm_n5_seed1_eps1", *cells)
    assert "NOT stated" in found.statement() and "gradmm_n5_seed1_eps1" in found.statement()


def test_cells_whose_folders_were_lost_are_bounded_at_their_stated_budget_and_the_assumption_said(
    tmp_path: Path,
) -> None:
    """Cells whose run folders and sidecars are gone (a lost machine) stop the ledgers' statement; where their rows
    state (ε, δ), the report adds the largest stated budget (target or spent) to the ledgers' PLD ε by basic
    composition, says what it assumes, and is never below the composition of every draw made. A lost noise-only
    control counts too (the sidecar that would say so is gone). Without a stated δ, nothing is stated."""
    work = tmp_path / "work"
    rows = _grid(work)
    drawn = Ledger([LedgerEntry(RELEASE), LedgerEntry(RELEASE), LedgerEntry(STEP, 80)])  # every draw the grid made
    one = Ledger([LedgerEntry(RELEASE)]).epsilon(2e-5)  # what the lost cell's one release costs at its stated δ
    for cell in ("gradmm_n5_seed1_eps1", "gradmm@noise_n5_seed0_eps1"):
        shutil.rmtree(work / cell)
    stated = {
        "gradmm_n5_seed1_eps1": {"epsilon": 1.0, "epsilon_spent": one, "delta": 2e-5},  # spent above its target
        "gradmm@noise_n5_seed0_eps1": {"delta": 1e-5},  # stated ε 1.0: a control, but nothing left says so
    }
    found = grid_privacy(tmp_path, [{**row, **stated.get(row["cell"], {})} for row in rows], DELTA)
    rest = Ledger([LedgerEntry(RELEASE), LedgerEntry(STEP, 80)]).epsilon(DELTA)  # the ledgers still found
    assert found.epsilon is None and found.unaccounted == ("gradmm_n5_seed1_eps1", "gradmm@noise_n5_seed0_eps1")
    assert found.ledger_epsilon == pytest.approx(rest)
    assert found.bound() == pytest.approx((rest + one + 1.0, DELTA + 3e-5))
    assert found.bound()[0] >= drawn.epsilon(found.bound()[1])  # a bound on every draw made, the lost one included
    statement = found.statement()
    assert f"cost at most ε = {rest + one + 1.0:.2f}" in statement and "IF each of the 2 cells" in statement
    assert "ASSUMPTION" in statement and "Draws lost with both their ledger and their row" in statement
    assert grid_privacy(tmp_path, rows, DELTA).bound() is None  # their rows state no δ: no bound
    assert "at most" not in grid_privacy(tmp_path, rows, DELTA).statement()


def test_two_cells_claiming_one_ledger_outside_the_shared_cache_are_both_unaccounted(tmp_path: Path) -> None:
    """A copied sidecar pointing at another cell's ledger of the same event would hide one draw."""
    work = tmp_path / "work"
    rows = _grid(work)
    honest = grid_privacy(tmp_path, rows, DELTA)
    (work / "gradmm_n5_seed1_eps1" / "synthetic.jsonl.gradmm" / "privacy.json").unlink()
    _sidecar(
        work,
        "gradmm_n5_seed1_eps1",
        [LedgerEntry(RELEASE, 1, "GRADMM release").to_dict()],
        ledger_file="../gradmm_n5_seed0_eps1/synthetic.jsonl.gradmm/privacy.json",
    )
    found = grid_privacy(tmp_path, rows, DELTA)
    assert found.epsilon is None and found.unaccounted == ("gradmm_n5_seed0_eps1", "gradmm_n5_seed1_eps1")
    assert honest.epsilon is not None  # while the shared dp-finetune run in the private cache serves two cells


def test_a_ledger_elsewhere_or_behind_a_symbolic_link_is_followed_and_counted(tmp_path: Path) -> None:
    work = tmp_path / "work"
    rows = _grid(work)
    before = grid_privacy(tmp_path, rows, DELTA)
    _ledger(tmp_path / "elsewhere" / "privacy.json", LedgerEntry(RELEASE))
    _sidecar(
        work, "gradmm_n20_seed1_eps1", [LedgerEntry(RELEASE).to_dict()], ledger_file="../../elsewhere/privacy.json"
    )
    _ledger(
        tmp_path / "disk2" / "gradmm_n5_seed2_eps1" / "synthetic.jsonl.gradmm" / "privacy.json", LedgerEntry(RELEASE)
    )
    (tmp_path / "stale").symlink_to(tmp_path / "disk2", target_is_directory=True)
    found = grid_privacy(tmp_path, rows + [_row("gradmm_n20_seed1_eps1", 1.0)], DELTA)
    assert found.unaccounted == () and (found.dp_cells, found.releases) == (before.dp_cells + 1, before.releases + 2)
    # a ledger nested in a run folder that is not a prefix of the run's (not a checkpoint's copy) is another run
    _ledger(work / "private-cache" / "h" / "dpft-x" / "other" / "privacy.json", LedgerEntry(GaussianRelease(9.0)))
    assert grid_privacy(tmp_path, rows, DELTA).releases == before.releases + 2


def test_an_unreadable_ledger_is_named_and_no_epsilon_is_stated(tmp_path: Path) -> None:
    rows = _grid(tmp_path / "work")
    broken = tmp_path / "work" / "private-cache" / "h" / "dpft-y" / "privacy.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")
    found = grid_privacy(tmp_path, rows, DELTA)
    assert found.epsilon is None and found.unreadable == (str(broken.resolve()),)
    assert "cannot be read" in found.statement()


def test_draws_of_cells_set_aside_count_and_seeded_draws_leave_the_epsilon_unstated(tmp_path: Path) -> None:
    rows = _grid(tmp_path / "work")
    before = grid_privacy(tmp_path, rows, DELTA)
    # a cell whose method's parameters changed was moved to stale/ (experiment._set_aside); its set may be out
    _ledger(
        tmp_path
        / "stale"
        / "gradmm_n5_seed2_eps1.20261201T000000"
        / "gradmm_n5_seed2_eps1"
        / "synthetic.jsonl.gradmm"
        / "privacy.json",
        LedgerEntry(RELEASE),
    )
    after = grid_privacy(tmp_path, rows, DELTA)
    assert (after.ledgers, after.releases, after.dp_cells) == (before.ledgers + 1, before.releases + 1, before.dp_cells)
    assert after.epsilon > before.epsilon
    seeded = tmp_path / "work" / "private-cache" / "h" / "dpft-seeded" / "privacy.json"
    seeded.parent.mkdir(parents=True)
    Ledger([LedgerEntry(STEP, 5)], private_release=False).save(seeded)
    found = grid_privacy(tmp_path, rows, DELTA)
    assert (found.epsilon, found.seeded) == (None, 1) and "seeded" in found.statement()


def test_sidecars_from_before_ledger_entries_had_counts_are_read(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _ledger(work / "gradmm_n5_seed0_eps1" / "synthetic.jsonl.gradmm" / "privacy.json", LedgerEntry(RELEASE))
    _sidecar(
        work, "gradmm_n5_seed0_eps1", [RELEASE.to_dict()]
    )  # a bare event, as sidecars written before ledger entries had counts hold
    found = grid_privacy(tmp_path, [_row("gradmm_n5_seed0_eps1", 1.0)], DELTA)
    assert found.unaccounted == () and found.epsilon == pytest.approx(Ledger([LedgerEntry(RELEASE)]).epsilon(DELTA))


def test_kept_copies_state_the_same_epsilon_once_the_work_folder_is_lost(tmp_path: Path) -> None:
    rows = _grid(tmp_path / "work")
    live = grid_privacy(tmp_path, rows, DELTA)
    keep_accounting(tmp_path)
    kept = json.loads((tmp_path / "accounting.json").read_text())
    assert not any("checkpoint-20" in rel for rel in kept["ledgers"])  # a checkpoint's prefix copy is not kept
    assert sorted(kept["sidecars"]) == sorted(f"work/{row['cell']}/synthetic.privacy.json" for row in rows[:5])
    both = grid_privacy(tmp_path, rows, DELTA)  # a copy that its live ledger begins with counts once
    assert (both.epsilon, both.ledgers, both.releases, both.kept) == (live.epsilon, live.ledgers, live.releases, 0)
    shutil.rmtree(tmp_path / "work")
    lost = grid_privacy(tmp_path, rows, DELTA)
    assert (lost.epsilon, lost.ledgers, lost.releases, lost.dp_cells) == (
        live.epsilon,
        live.ledgers,
        live.releases,
        live.dp_cells,
    )
    assert lost.kept == live.ledgers and "copies kept in accounting.json" in lost.statement()
    assert grid_privacy(tmp_path / "elsewhere", rows, DELTA).unaccounted  # nothing kept there: fails closed


def test_a_kept_ledger_that_a_new_run_at_its_path_does_not_begin_with_still_counts(tmp_path: Path) -> None:
    work = tmp_path / "work"
    rows = _grid(work)
    before = grid_privacy(tmp_path, rows, DELTA)
    keep_accounting(tmp_path)
    shutil.rmtree(work)  # the machine is lost; the grid is run again from nothing, the shared run a bit further
    rows = _grid(work)
    run = work / "private-cache" / "h" / "dpft-x" / "privacy.json"
    Ledger([LedgerEntry(STEP, 40, "steps 1-40"), LedgerEntry(STEP, 5, "steps 41-45")]).save(run)
    (work / "gradmm_n5_seed0_eps1" / "synthetic.jsonl.gradmm" / "privacy.json").unlink()
    again = LedgerEntry(GaussianRelease(4.0), 1, "GRADMM release")  # a new draw at the lost draw's path
    _ledger(work / "gradmm_n5_seed0_eps1" / "synthetic.jsonl.gradmm" / "privacy.json", again)
    _sidecar(work, "gradmm_n5_seed0_eps1", [again.to_dict()])
    found = grid_privacy(tmp_path, rows, DELTA)
    # the grown shared run stands for its kept copy (45 steps, for each of its 2 cells); the lost GRADMM draw counts
    # beside the new one
    assert (found.ledgers, found.releases, found.kept) == (before.ledgers + 1, before.releases + 2 * 5 + 1, 1)
    assert found.unaccounted == () and found.epsilon > before.epsilon
    keep_accounting(tmp_path)
    kept = json.loads((tmp_path / "accounting.json").read_text())["ledgers"]
    assert sum("#displaced-" in rel for rel in kept) == 1
    assert Ledger.from_dict(kept["work/private-cache/h/dpft-x/privacy.json"]).count == 45
    shutil.rmtree(work)
    assert grid_privacy(tmp_path, rows, DELTA).epsilon == pytest.approx(found.epsilon)


def test_a_run_made_again_at_a_lost_runs_path_counts_for_both_cells_it_served(tmp_path: Path) -> None:
    """A cell finished on a machine now lost; a cell of another n trains again at the same path with the same
    settings (the same events: its ledger begins with, and equals, the kept copy). Two runs drew: both count."""
    work = tmp_path / "work"
    steps = LedgerEntry(STEP, 40, "steps 1-40")
    ledger_file = "../private-cache/h/dpft-x/privacy.json"
    _ledger(work / "private-cache" / "h" / "dpft-x" / "privacy.json", steps)
    _sidecar(work, "dp-finetune-gen_n10_seed0_eps1", [steps.to_dict()], ledger_file=ledger_file)
    keep_accounting(tmp_path)
    shutil.rmtree(work)  # the machine is lost
    _ledger(work / "private-cache" / "h" / "dpft-x" / "privacy.json", steps)  # a new run, the same events
    _sidecar(work, "dp-finetune-gen_n5_seed0_eps1", [steps.to_dict()], ledger_file=ledger_file)
    rows = [_row("dp-finetune-gen_n10_seed0_eps1", 1.0), _row("dp-finetune-gen_n5_seed0_eps1", 1.0)]
    found = grid_privacy(tmp_path, rows, DELTA)
    assert (found.unaccounted, found.releases) == ((), 2 * 40)
    assert found.epsilon == pytest.approx(Ledger([LedgerEntry(STEP, 80)]).epsilon(DELTA))


def test_cells_that_name_one_runs_identity_count_it_once_and_a_cell_naming_none_counts_it_again(
    tmp_path: Path,
) -> None:
    """Three cells sample from one DP training run in the private cache: two sidecars name the run's identity (one
    run served both), one names none (written by an older privlm: it may have come from a lost run with the same
    events). A checkpoint's copy inside the run, with the run's identity, counts nothing."""
    work = tmp_path / "work"
    steps = LedgerEntry(STEP, 40, "steps 1-40")
    run = work / "private-cache" / "h" / "dpft-x"
    _ledger(run / "privacy.json", steps, run="a" * 16)
    _ledger(run / "checkpoint-20" / "privacy.json", LedgerEntry(STEP, 20, "steps 1-20"), run="a" * 16)
    ledger_file = "../private-cache/h/dpft-x/privacy.json"
    cells = ["dp-finetune-gen_n5_seed0_eps1", "dp-finetune-gen_n10_seed0_eps1", "dp-finetune-gen_n20_seed0_eps1"]
    for cell in cells[:2]:
        _sidecar(work, cell, [steps.to_dict()], ledger_file=ledger_file, ledger_run="a" * 16)
    found = grid_privacy(tmp_path, [_row(cell, 1.0) for cell in cells[:2]], DELTA)
    assert (found.unaccounted, found.ledgers, found.releases) == ((), 1, 40)
    assert found.epsilon == pytest.approx(Ledger([steps]).epsilon(DELTA))
    _sidecar(work, cells[2], [steps.to_dict()], ledger_file=ledger_file)
    found = grid_privacy(tmp_path, [_row(cell, 1.0) for cell in cells], DELTA)
    assert (found.unaccounted, found.releases) == ((), 2 * 40)
    assert found.epsilon == pytest.approx(Ledger([LedgerEntry(STEP, 80)]).epsilon(DELTA))
    # a prefix of the run's events inside its folder, but another run's ledger (another identity): it counts
    _ledger(run / "checkpoint-30" / "privacy.json", LedgerEntry(STEP, 20, "steps 1-20"), run="z" * 16)
    assert grid_privacy(tmp_path, [_row(cell, 1.0) for cell in cells], DELTA).releases == 2 * 40 + 20


def test_a_run_made_again_at_a_lost_runs_path_is_told_apart_by_its_identity(tmp_path: Path) -> None:
    """The same events as in the test above, but each run has its identity: the new run's ledger does not replace
    the kept copy of the lost one (it is displaced and counts), and each cell is accounted by its own run's
    ledger, also once the work folder is lost again. A cell naming a run whose ledger is nowhere is unaccounted."""
    work = tmp_path / "work"
    steps = LedgerEntry(STEP, 40, "steps 1-40")
    ledger_file = "../private-cache/h/dpft-x/privacy.json"
    path = work / "private-cache" / "h" / "dpft-x" / "privacy.json"
    _ledger(path, steps, run="a" * 16)
    _sidecar(work, "dp-finetune-gen_n10_seed0_eps1", [steps.to_dict()], ledger_file=ledger_file, ledger_run="a" * 16)
    keep_accounting(tmp_path)
    shutil.rmtree(work)  # the machine is lost
    _ledger(path, steps, run="b" * 16)  # a new run, the same events
    _sidecar(work, "dp-finetune-gen_n5_seed0_eps1", [steps.to_dict()], ledger_file=ledger_file, ledger_run="b" * 16)
    rows = [_row("dp-finetune-gen_n10_seed0_eps1", 1.0), _row("dp-finetune-gen_n5_seed0_eps1", 1.0)]
    two_runs = Ledger([LedgerEntry(STEP, 80)]).epsilon(DELTA)
    found = grid_privacy(tmp_path, rows, DELTA)  # before any copy was kept again: the live "b" and the kept "a"
    assert (found.unaccounted, found.ledgers, found.releases, found.kept) == ((), 2, 2 * 40, 1)
    keep_accounting(tmp_path)
    kept = json.loads((tmp_path / "accounting.json").read_text())["ledgers"]
    assert sorted(Ledger.from_dict(ledger).run for ledger in kept.values()) == ["a" * 16, "b" * 16]
    for _ in range(2):
        found = grid_privacy(tmp_path, rows, DELTA)
        assert (found.unaccounted, found.ledgers, found.releases) == ((), 2, 2 * 40)
        assert found.epsilon == pytest.approx(two_runs)
        shutil.rmtree(work)  # the second pass reads the kept copies only
        work.mkdir()
    _sidecar(work, "dp-finetune-gen_n20_seed0_eps1", [steps.to_dict()], ledger_file=ledger_file, ledger_run="c" * 16)
    found = grid_privacy(tmp_path, [*rows, _row("dp-finetune-gen_n20_seed0_eps1", 1.0)], DELTA)
    assert found.unaccounted == ("dp-finetune-gen_n20_seed0_eps1",) and found.epsilon is None


def test_an_unreadable_accounting_file_is_named_and_never_overwritten(tmp_path: Path) -> None:
    rows = _grid(tmp_path / "work")
    (tmp_path / "accounting.json").write_text("{}")
    found = grid_privacy(tmp_path, rows, DELTA)
    assert found.epsilon is None and found.unreadable == (str(tmp_path / "accounting.json"),)
    with pytest.raises(UserError, match="not a readable privlm-grid-accounting file"):
        keep_accounting(tmp_path)
    assert (tmp_path / "accounting.json").read_text() == "{}"


def test_the_report_states_the_grid_privacy(tmp_path: Path) -> None:
    rows = _grid(tmp_path / "work")
    config = parse_config(
        {
            "model": "tiny-llama",
            "dataset": "rotten-tomatoes",
            "pool_per_class": 10,
            "n_per_class": [5],
            "seeds": [0],
            "methods": {"gradmm": {"epsilons": [1.0]}},
        },
        "test",
    )
    scored = [
        {
            **row,
            "method": row["cell"].split("_")[0],
            "n_per_class": 5,
            "seed": 0,
            "accuracy": 0.6,
            "ci_low": 0.5,
            "ci_high": 0.7,
            "n_train": 10,
            "n_test": 300,
            "privacy": "test",
            "wall_time_s": 1.0,
        }
        for row in rows
    ]
    write_report(tmp_path, scored, config)
    md = (tmp_path / "report.md").read_text()
    assert "## Privacy of the grid" in md and "4 finished DP cells" in md
    assert "Privacy of the grid" in (tmp_path / "report.html").read_text()
