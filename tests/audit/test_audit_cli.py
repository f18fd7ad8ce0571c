"""``privlm audit``: a small audit runs in the suite; a broken mechanism exits 1 naming it; bad input 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from privlm.cli import main


def _run(argv, capsys):
    try:
        main(argv)
        code = 0
    except SystemExit as stop:
        code = int(stop.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_small_audit_passes_and_finds_leakage(capsys, tmp_path):
    """The CI audit: white-box canaries on the tiny model, exact and hutchinson, accounted ε = 8."""
    code, out, _ = _run(
        [
            "audit",
            "--quick",
            "--mechanisms",
            "dpsgd-whitebox",
            "--modes",
            "exact,hutchinson",
            "--epsilons",
            "8",
            "--json",
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    rows = json.loads(out)
    assert code == 0 and len(rows) == 2
    assert all(0.3 < r["epsilon_lower_bound"] <= r["accounted_epsilon"] <= 8.0 for r in rows)
    assert (tmp_path / "README.md").exists() and (tmp_path / "cells").is_dir()


def test_broken_mechanism_exits_1_and_is_named(capsys, skipped_clipping):
    code, _, err = _run(
        [
            "audit",
            "--quick",
            "--mechanisms",
            "dpsgd-whitebox",
            "--modes",
            "exact",
            "--epsilons",
            "1",
            "--canary-norm",
            "10",
        ],
        capsys,
    )
    assert code == 1, err
    assert "VIOLATION: dpsgd-whitebox (exact, target ε=1)" in " ".join(err.split())


@pytest.mark.parametrize(
    "args",
    [
        ["--mechanisms", "nope"],
        ["--epsilons", "one"],
        ["--epsilons", "-1"],
        ["--delta", "2"],
        ["--canaries", "1"],
        ["--canary-norm", "0.5"],
        ["--modes", "full", "--mechanisms", "dpsgd-whitebox"],
        ["--mechanisms", ","],
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, args):
    code, _, err = _run(["audit", "--quick", *args], capsys)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1


def test_registering_the_command_imports_no_torch():
    """``privlm --help`` registers every command: this one keeps its heavy imports inside the command."""
    code = "import sys, typer; import privlm.cli.audit as a; a.register(typer.Typer()); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
