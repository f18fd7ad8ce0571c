"""``privlm --help`` and every ``privlm COMMAND --help`` import none of the heavy libraries."""

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


@pytest.mark.parametrize("args", HELP_ARGS, ids=lambda a: " ".join(a))
def test_help_imports_no_heavy_library(args: list[str]) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report == {"code": 0, "heavy": []}
    assert "Usage" in done.stdout
