"""The grid: cells, caching/resume, verdicts, and the results folder."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import numpy as np
import pytest

import privlm.audit.runner as runner
from privlm.audit.report import table, write_results
from privlm.audit.runner import QUICK, Cell, grid, run_grid, verdict, violations
from privlm.errors import UserError

TINY = replace(QUICK, canaries=40, steps=2, real_examples=4, gradmm_canaries=8)


def test_grid_expands_mechanisms_modes_and_epsilons():
    cells = grid(["dpsgd-whitebox", "gradmm"], None, [1, 8])
    assert len(cells) == (4 + 2) * 2
    assert grid(["dpsgd-whitebox", "dp-loss"], ["hutchinson"], [4]) == [
        Cell("dpsgd-whitebox", "hutchinson", 4.0),
        Cell("dp-loss", "hutchinson", 4.0),
    ]


@pytest.mark.parametrize(
    ("mechanisms", "modes", "epsilons"),
    [
        (["nope"], None, [1]),
        (["gradmm"], ["exact"], [1]),
        (["dpsgd-whitebox"], None, [0.0]),
        (["dpsgd-whitebox"], None, [float("inf")]),
    ],
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
    run_grid(cells, TINY, 1e-5, 0, tmp_path)
    recomputed = []
    real = runner.audit_cell
    monkeypatch.setattr(runner, "audit_cell", lambda cell, *a: recomputed.append(cell) or real(cell, *a))
    run_grid(cells, replace(TINY, gradmm_canaries=16), 1e-5, 0, tmp_path)  # DP-SGD reads no GRADMM field
    assert recomputed == [cells[1]]


_FIXTURE = """
import numpy as np
from privlm.audit.outcome import CanaryOutcome, inclusion_bits
from privlm.privacy.calibration import calibrate_gaussian_releases, gaussian_releases_epsilon

NOISE_SCALE = {scale!r}


def run_cell(mode, epsilon, scale, delta, seed):
    # one Gaussian release, a coordinate per canary (L2 sensitivity 1), accounted at the calibrated sigma
    sigma = calibrate_gaussian_releases(epsilon, delta, 1)
    included = inclusion_bits(scale.pe_canaries, seed)
    noise = np.random.default_rng(seed).standard_normal(scale.pe_canaries) * sigma * NOISE_SCALE
    return CanaryOutcome(included + noise, included, gaussian_releases_epsilon(sigma, 1, delta), delta)
"""


@pytest.fixture
def fixture_mechanism(tmp_path, monkeypatch):
    """A test-only audited mechanism in a module of its own; ``break_it()`` rewrites its source so that its
    noise is 1e-3 of what its accountant claims (the mechanism the audit exists to catch)."""
    import importlib
    import sys

    from privlm.audit import registry

    folder = tmp_path / "plugin"
    folder.mkdir()
    source = folder / "audit_fixture_mechanism.py"
    source.write_text(_FIXTURE.format(scale=1.0))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setitem(
        registry.MECHANISMS,
        "fixture",
        registry.AuditedMechanism(
            "fixture", ("gaussian",), ("pe_canaries",), "audit_fixture_mechanism:run_cell", "test-only Gaussian release"
        ),
    )
    monkeypatch.delitem(sys.modules, "audit_fixture_mechanism", raising=False)

    def break_it():
        source.write_text(_FIXTURE.format(scale=1e-3))
        importlib.reload(importlib.import_module("audit_fixture_mechanism"))

    return break_it


def test_a_mechanism_broken_after_a_cached_run_is_caught_by_a_rerun_with_the_same_out(
    tmp_path, fixture_mechanism, capsys
):
    """The cache is keyed by the code a cell runs: a stale cell is run again, so the broken code is audited."""
    from privlm.cli import main

    out = tmp_path / "audit"
    argv = ["audit", "--mechanisms", "fixture", "--epsilons", "1", "--out", str(out), "--json"]

    def audit() -> tuple[int, dict]:
        try:
            main(argv)
            code = 0
        except SystemExit as stop:
            code = int(stop.code or 0)
        return code, json.loads(capsys.readouterr().out)[0]

    code, row = audit()
    assert code == 0 and not row["violation"] and row["family_lower_bound"] <= row["accounted_epsilon"]
    first_key = row["key"]
    fixture_mechanism()
    code, row = audit()
    assert row["key"] != first_key
    assert code == 1 and row["violation"] and row["family_lower_bound"] > 1.5 * row["accounted_epsilon"]
    assert json.loads((out / "cells" / "fixture_gaussian_eps1.json").read_text())["key"] == row["key"]


def test_the_key_covers_the_code_each_mechanism_imports_and_nothing_of_the_others():
    from privlm.audit.provenance import module_closure

    pe, whitebox = set(module_closure("privlm.audit.pe")), set(module_closure("privlm.audit.gradient"))
    assert {"privlm.synthesis.pe.mechanism", "privlm.privacy.snapping", "privlm.randomness", "privlm"} <= pe
    assert {"privlm.dpsgd.engine", "privlm.dpsgd.clipping", "privlm.audit.training"} <= whitebox
    assert "privlm.synthesis.pe.mechanism" not in whitebox and "privlm.cli.audit" not in pe


@pytest.mark.parametrize("mechanism", sorted(runner.MECHANISMS))
def test_scale_fields_are_exactly_the_scale_fields_each_mechanism_reads(monkeypatch, mechanism):
    """A cached cell's key holds its mechanism's scale fields: a field the mechanism reads but that is not
    listed would reuse a stale cell, a listed name that is no Scale field (or that it does not read) is a typo."""
    import privlm.audit.gradient
    import privlm.audit.gradmm
    import privlm.audit.inputs
    import privlm.audit.pe

    calls = []

    def recording(name):
        class Recorder:
            def __init__(self, **kwargs):
                self.kwargs = kwargs

            def run(self, *args, **kwargs):
                calls.append((name, self.kwargs, args, kwargs))

        return Recorder

    for module, name in (
        (privlm.audit.gradient, "GradientCanaries"),
        (privlm.audit.gradmm, "GradmmCanaries"),
        (privlm.audit.inputs, "InputCanaries"),
        (privlm.audit.pe, "PECanaries"),
    ):
        monkeypatch.setattr(module, name, recording(name))
    record = runner.MECHANISMS[mechanism]
    names = [f.name for f in fields(runner.Scale)]
    assert set(record.scale_fields) <= set(names)
    entry = record.run()
    entry(record.modes[0], 1.0, runner.Scale(), 1e-5, 0)
    read = set()
    for name in names:
        value = getattr(runner.Scale(), name)
        entry(record.modes[0], 1.0, replace(runner.Scale(), **{name: type(value)(value + 1)}), 1e-5, 0)
        if calls[-1] != calls[0]:
            read.add(name)
    assert read == set(record.scale_fields)


def test_family_wise_verdicts_and_ceilings():
    """Each verdict is tested at 5 %/K; a cell whose ceiling is not above its claim cannot detect anything."""
    rng = np.random.default_rng(0)
    included = rng.random(1000) < 0.5
    leaky = {
        "mechanism": "m",
        "mode": "x",
        "epsilon": 1.0,
        "accounted_epsilon": 1.0,
        "delta": 1e-5,
        "seconds": 0.0,
        "scores": (included + 0.3 * rng.standard_normal(1000)).tolist(),
        "included": included.tolist(),
    }
    alone, in_grid = verdict(leaky, 1), verdict(leaky, 39)
    assert alone["family_lower_bound"] == alone["epsilon_lower_bound"]  # a grid of one: no correction
    assert (
        in_grid["family_lower_bound"] < in_grid["epsilon_lower_bound"] and in_grid["family_ceiling"] < alone["ceiling"]
    )
    assert alone["violation"] and alone["detectable"]
    blind = verdict({**leaky, "accounted_epsilon": 8.0}, 39)
    assert not blind["detectable"] and not blind["violation"] and blind["family_ceiling"] < 8.0
    assert "cannot detect a violation" in table([blind]) and "**VIOLATION**" in table([alone])
    assert "scores" not in alone and "included" not in alone


def _row(bound: float, accounted: float) -> dict:
    return {
        "mechanism": "dpsgd-whitebox",
        "mode": "exact",
        "epsilon": 1.0,
        "accounted_epsilon": accounted,
        "epsilon_lower_bound": bound,
        "family_lower_bound": bound,
        "violation": bound > accounted,
        "detectable": True,
        "guesses": 10,
        "correct": 9,
        "canaries": 100,
        "ceiling": 3.0,
        "family_ceiling": 3.0,
        "family_size": 2,
        "family_confidence": 0.95,
        "seconds": 1.0,
        "delta": 1e-5,
    }


def test_violations_name_the_mechanism_and_the_table_marks_them():
    rows = [_row(0.5, 1.0), _row(1.5, 1.0)]
    assert violations(rows) == ["dpsgd-whitebox (exact, target ε=1): audited lower bound 1.500 > accounted ε 1.000"]
    assert table(rows).count("**VIOLATION**") == 1 and "| 0.500 |" in table(rows)


def test_results_folder_holds_json_markdown_and_png(tmp_path):
    rows = [_row(0.5, 1.0), {**_row(2.0, 8.0), "epsilon": 8.0}]
    write_results(rows, tmp_path, "privlm audit --quick")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "audit.json", "lower_bound.png"]
    assert json.loads((tmp_path / "audit.json").read_text())["cells"] == rows
    assert (tmp_path / "lower_bound.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "privlm audit --quick" in (tmp_path / "README.md").read_text()
