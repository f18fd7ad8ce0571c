"""The grid: cells, caching/resume, verdicts, and the results folder."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest

import privlm.audit.runner as runner
from privlm.audit.report import table, write_results
from privlm.audit.runner import QUICK, Cell, grid, run_grid, violations
from privlm.errors import UserError

TINY = replace(QUICK, canaries=40, steps=2, real_examples=4, gradmm_canaries=8)


def test_grid_expands_mechanisms_modes_and_epsilons():
    cells = grid(["dpsgd-whitebox", "gradmm"], None, [1, 8])
    assert len(cells) == (4 + 2) * 2
    assert grid(["dpsgd-whitebox", "dp-loss"], ["hutchinson"], [4]) == [
        Cell("dpsgd-whitebox", "hutchinson", 4.0), Cell("dp-loss", "hutchinson", 4.0)]


@pytest.mark.parametrize(
    ("mechanisms", "modes", "epsilons"),
    [(["nope"], None, [1]), (["gradmm"], ["exact"], [1]), (["dpsgd-whitebox"], None, [0.0]),
     (["dpsgd-whitebox"], None, [float("inf")])],
)
def test_grid_refuses_bad_requests(mechanisms, modes, epsilons):
    with pytest.raises(UserError):
        grid(mechanisms, modes, epsilons)


def test_cells_are_cached_and_reused(tmp_path, monkeypatch):
    cells = [Cell("dpsgd-whitebox", "exact", 1.0), Cell("gradmm", "full", 1.0)]
    first = run_grid(cells, TINY, 1e-5, 0, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dpsgd-whitebox_exact_eps1.json", "gradmm_full_eps1.json"]
    assert all(not r["violation"] and r["epsilon_lower_bound"] <= r["accounted_epsilon"] for r in first)
    assert all(r["private_release"] is False for r in first)
    monkeypatch.setattr(runner, "audit_cell", lambda *a: pytest.fail("a cached cell was recomputed"))
    assert run_grid(cells, TINY, 1e-5, 0, tmp_path) == first
    monkeypatch.undo()
    other = run_grid(cells[:1], TINY, 1e-5, 1, tmp_path)  # another seed: recomputed, cache replaced
    assert other[0]["seed"] == 1


def test_a_cell_is_recomputed_only_when_a_scale_field_of_its_mechanism_changes(tmp_path, monkeypatch):
    cells = [Cell("dpsgd-whitebox", "exact", 1.0), Cell("gradmm", "full", 1.0)]
    first = run_grid(cells, TINY, 1e-5, 0, tmp_path)
    recomputed = []
    monkeypatch.setattr(runner, "audit_cell", lambda cell, *a: recomputed.append(cell) or first[1])
    run_grid(cells, replace(TINY, gradmm_canaries=16), 1e-5, 0, tmp_path)  # DP-SGD reads no GRADMM field
    assert recomputed == [cells[1]]



@pytest.mark.parametrize("mechanism", sorted(runner.MECHANISMS))
def test_scale_fields_are_exactly_the_scale_fields_each_mechanism_reads(monkeypatch, mechanism):
    """A cached cell is reused when its mechanism's SCALE_FIELDS match: a field the mechanism reads but that is not
    listed would reuse a stale cell, a listed name that is no Scale field (or that it does not read) is a typo."""
    calls = []

    def recording(name):
        class Recorder:
            def __init__(self, **kwargs):
                self.kwargs = kwargs

            def run(self, *args, **kwargs):
                calls.append((name, self.kwargs, args, kwargs))

        return Recorder

    for name in ("GradientCanaries", "GradmmCanaries", "InputCanaries", "PECanaries"):
        monkeypatch.setattr(runner, name, recording(name))
    names = [f.name for f in fields(runner.Scale)]
    assert set(runner.SCALE_FIELDS) == set(runner.MECHANISMS)
    assert set(runner.SCALE_FIELDS[mechanism]) <= set(names)
    cell = Cell(mechanism, runner.MECHANISMS[mechanism][0], 1.0)
    runner.run_mechanism(cell, runner.Scale(), 1e-5, 0)
    read = set()
    for name in names:
        value = getattr(runner.Scale(), name)
        runner.run_mechanism(cell, replace(runner.Scale(), **{name: type(value)(value + 1)}), 1e-5, 0)
        if calls[-1] != calls[0]:
            read.add(name)
    assert read == set(runner.SCALE_FIELDS[mechanism])


def _row(bound: float, accounted: float) -> dict:
    return {"mechanism": "dpsgd-whitebox", "mode": "exact", "epsilon": 1.0, "accounted_epsilon": accounted,
            "epsilon_lower_bound": bound, "violation": bound > accounted, "guesses": 10, "correct": 9,
            "canaries": 100, "ceiling": 3.0, "seconds": 1.0, "delta": 1e-5}


def test_violations_name_the_mechanism_and_the_table_marks_them():
    rows = [_row(0.5, 1.0), _row(1.5, 1.0)]
    assert violations(rows) == ["dpsgd-whitebox (exact, target ε=1): audited lower bound 1.500 > accounted ε 1.000"]
    assert "**1.500 VIOLATION**" in table(rows) and "| 0.500 |" in table(rows)


def test_results_folder_holds_json_markdown_and_png(tmp_path):
    rows = [_row(0.5, 1.0), {**_row(2.0, 8.0), "epsilon": 8.0}]
    write_results(rows, tmp_path, "privlm audit --quick")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "audit.json", "lower_bound.png"]
    assert json.loads((tmp_path / "audit.json").read_text())["cells"] == rows
    assert (tmp_path / "lower_bound.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "privlm audit --quick" in (tmp_path / "README.md").read_text()
