"""``privlm --help``, every ``privlm COMMAND --help`` and ``privlm experiment --pending`` import none of the heavy
libraries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "peft", "sklearn")
HELP_ARGS = (
    ["--help"],
    ["account", "--help"],
    ["audit", "--help"],
    ["data", "show", "--help"],
    ["demo", "--help"],
    ["eval", "--help"],
    ["experiment", "--help"],
    ["models", "show", "--help"],
    ["synth", "--help"],
    ["train", "--help"],
)
PROBE = """
import json, sys
from privlm.cli import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit as stop:
    code = stop.code or 0
else:
    code = 0
print(json.dumps({"code": code, "heavy": [m for m in json.loads(sys.argv[2]) if m in sys.modules]}), file=sys.stderr)
"""


ROOT = Path(__file__).resolve().parents[2]


def _probe(args: list[str]) -> tuple[dict, str]:
    """``privlm ARGS`` in a fresh interpreter: its exit code and the heavy libraries it imported, and its stdout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    return json.loads(done.stderr.strip().splitlines()[-1]), done.stdout


@pytest.mark.parametrize("args", HELP_ARGS, ids=lambda a: " ".join(a))
def test_help_imports_no_heavy_library(args: list[str]) -> None:
    report, out = _probe(args)
    assert report == {"code": 0, "heavy": []}
    assert "Usage" in out


def test_experiment_pending_imports_no_heavy_library(tmp_path: Path) -> None:
    """A queue driver asks ``--pending`` before each stage: it reads the configuration and the folder only."""
    from privlm.experiments.config import load_config

    toml = ROOT / "research" / "synthetic_at_scale" / "config.toml"
    report, out = _probe(["experiment", str(toml), "--out", str(tmp_path), "--pending"])
    assert report == {"code": 0, "heavy": []}
    assert out.split() == [cell.key for cell in load_config(toml).cells()]  # an empty folder: every cell
