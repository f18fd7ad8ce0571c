"""One study cell = one ``privlm train --model smollm2-135m ... --resume --json`` command, shared by the studies' drivers.

A cell's summary goes to ``<results>/cells/<name>.json`` (the ``--json`` summary plus the command as shown,
wall time and the process's peak resident memory) and its predictions to
``<results>/predictions/<name>.jsonl``; a cell whose JSON exists is skipped, an unfinished one continues from
its run folder's last checkpoint, and a finished run folder whose summary was lost is run again from scratch
(its checkpoints are retired, so it cannot resume).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRIVLM = str(ROOT / ".venv" / "bin" / "privlm")


def shown(command: list[str]) -> str:
    """The command as a copy-paste line from the repository root (``privlm`` for the venv's, quoted where needed)."""
    text = " ".join(f"'{c}'" if " " in c or "|" in c else c for c in command)
    return text.replace(PRIVLM, "privlm").replace(str(ROOT) + "/", "")


def run_cell(results: Path, name: str, out: Path, args: list[str], threads: str = "1") -> dict | None:
    """Run ``privlm train --model smollm2-135m ARGS --out OUT --resume --json`` unless the cell's JSON exists;
    returns the summary (None if the command failed). The printed score is the test split's ROUGE-L or accuracy."""
    command = [PRIVLM, "train", "--model", "smollm2-135m", *args, "--out", str(out), "--resume", "--json"]
    target = results / "cells" / f"{name}.json"
    if target.exists():
        return json.loads(target.read_text())
    if (out / "FINISHED").exists():
        shutil.rmtree(out)
    line = shown(command)
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {line}", flush=True)
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=sys.stderr, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": threads}
    )
    assert proc.stdout is not None
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        print(f"{name}: failed (status {status})", flush=True)
        return None
    summary = json.loads(stdout)
    summary.update(
        cell=name,
        command=line,
        cell_wall_s=round(time.perf_counter() - start, 1),
        peak_rss_mb=round(usage.ru_maxrss / 1024, 1),
    )
    (results / "predictions").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / "predictions.jsonl", results / "predictions" / f"{name}.jsonl")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    test = summary["test"]
    metric = "rougeL" if "rougeL" in test else "accuracy"
    print(f"{name}: test {metric} {test[metric]:.4f} ({summary['cell_wall_s']} s)", flush=True)
    return summary
