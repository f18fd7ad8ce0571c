"""``research/driver.sh``'s ``work_queue``: a stage is run for each pattern, in order, that matches a cell still
to run (``privlm experiment --pending``), asked again after each stage; where ``--pending`` fails, every stage
is run. The drivers' own shell, on a tiny grid (each ``run`` is recorded, then really run)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

from cli_helpers import write_films

ROOT = Path(__file__).resolve().parents[2]


def _queue(tmp_path: Path, toml: Path, patterns: list[str]) -> list[str]:
    """The patterns ``work_queue`` ran a stage for, in order (each stage really run into ``tmp_path/out``)."""
    assert (ROOT / ".venv" / "bin" / "python").exists(), "the drivers run $ROOT/.venv/bin/python: make install first"
    calls = tmp_path / "calls.txt"
    script = (
        f"TOML={shlex.quote(str(toml))}\nOUT={shlex.quote(os.path.relpath(tmp_path / 'out', ROOT))}\n"
        f'source "{ROOT}/research/driver.sh"\n'
        f'run() {{ echo "$2" >> "{calls}"; privlm_experiment --resume "$@" > /dev/null 2>&1; }}\n'
        f"work_queue {shlex.join(patterns)}\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CODE", "WAIT_FOR")}  # this checkout, no waiting
    subprocess.run(["bash", "-c", script], check=True, env=env, timeout=600)
    return calls.read_text().split() if calls.exists() else []


def test_work_queue_passes_over_patterns_with_no_cell_left(tmp_path: Path) -> None:
    data = write_films(tmp_path / "data.jsonl", 20)
    toml = tmp_path / "exp.toml"
    toml.write_text(
        f'model = "tiny-gpt2"\ndataset = "jsonl:{data}"\nlabels = ["bad", "good"]\npool_per_class = 4\nn_per_class = [2]\n'
        'seeds = [0, 1]\ntest_size = 6\n[finetune]\npreset = "tiny"\n[methods.random]\n'
    )
    queue = ["nothing_*", "random_*", "random_n2_seed0_*", "random_*"]
    # the pattern matching no cell is passed over; "random_*" runs both cells; asked again, nothing is left
    assert _queue(tmp_path, toml, queue) == ["random_*"]
    rows = [json.loads(line)["cell"] for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert rows == ["random_n2_seed0_epsnone", "random_n2_seed1_epsnone"]
    (tmp_path / "calls.txt").unlink()
    assert _queue(tmp_path, toml, queue) == []  # every cell finished: no stage at all
    # --pending fails (no such configuration): every stage is run, so that its error shows
    assert _queue(tmp_path, tmp_path / "missing.toml", ["a_*", "b_*"]) == ["a_*", "b_*"]
