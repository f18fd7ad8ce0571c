"""``privlm synth``: bad input exits 2; SIGKILL + --resume; poisoning the data file after the release."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from privlm.cli import main
from privlm.gradmm.pipeline import RunPaths

ROWS = [
    ("the movie was a delight from start to finish", "pos"),
    ("slow, dull and far too long", "neg"),
    ("a warm, funny and moving story with a wonderful cast", "pos"),
    ("the plot makes no sense and the acting is wooden", "neg"),
    ("I loved every minute of it and would watch it again", "pos"),
    ("this is one of the worst films of the year", "neg"),
    ("a sharp, smart and honest picture", "pos"),
    ("terrible from the first scene to the last", "neg"),
    ("great fun for the whole family", "pos"),
    ("a bad, boring film", "neg"),
]
SMALL = ["--model", "tiny-llama", "--preset", "demo", "--length", "4", "--batch", "3", "--top-k", "8", "--seed", "3"]


def _write_data(path: Path, rows) -> str:
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    return f"jsonl:{path}"


def _synth(args: list[str]) -> int:
    try:
        main(["synth", *args])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.mark.parametrize(
    "override, flags, fragment",
    [
        ({}, ["--epsilon", "4", "--delta", "1e-5", "--no-dp"], "--no-dp"),
        ({}, ["--epsilon", "4"], "--delta"),
        ({}, ["--epsilon", "-1", "--delta", "1e-5"], "-1"),
        ({}, ["--no-dp", "--preset", "huge"], "huge"),
        ({}, ["--no-dp", "--length", "0"], "--length"),
        ({"--per-class": "0"}, ["--no-dp"], "--per-class"),
        ({"--data": "jsonl:/nonexistent/data.jsonl"}, ["--no-dp"], "/nonexistent/data.jsonl"),
        ({"--out": "/nonexistent/dir/out.jsonl"}, ["--no-dp"], "/nonexistent/dir"),
        ({"--model": "no-such-model"}, ["--no-dp"], "no-such-model"),
    ],
)
def test_bad_input_exits_2_with_one_line(override, flags, fragment, tmp_path, capsys) -> None:
    data = _write_data(tmp_path / "d.jsonl", ROWS)
    options = {"--model": "tiny-llama", "--data": data, "--per-class": "2", "--out": str(tmp_path / "o.jsonl")}
    options.update(override)
    assert _synth([*[x for kv in options.items() for x in kv], *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err
    assert not (tmp_path / "o.jsonl").exists()


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path) -> None:
    data = _write_data(tmp_path / "d.jsonl", ROWS)
    out = tmp_path / "killed.jsonl"
    args = [*SMALL, "--data", data, "--per-class", "3", "--outer-steps", "2", "--inner-steps", "10",
            "--epsilon", "4", "--delta", "1e-5"]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from privlm.cli import main; main()", "synth", *args, "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    batches = RunPaths(out).batches
    deadline = time.monotonic() + 120
    while not (batches.is_dir() and any(batches.glob("*.json"))):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the first batch"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_done = len(list(batches.glob("*.json")))
    assert not out.exists() and 1 <= n_done < 6
    # the uninterrupted reference: the same release, no finished batch
    ref = tmp_path / "ref.jsonl"
    RunPaths(ref).workdir.mkdir()
    for name in ("release.pt", "run.json"):
        shutil.copy(RunPaths(out).workdir / name, RunPaths(ref).workdir / name)
    assert _synth([*args, "--out", str(ref), "--resume"]) == 0
    assert _synth([*args, "--out", str(out), "--resume"]) == 0
    assert out.read_bytes() == ref.read_bytes() and len(out.read_bytes()) > 0


def test_poisoned_data_file_after_release_gives_bit_identical_output(tmp_path, capsys) -> None:
    path = tmp_path / "d.jsonl"
    data = _write_data(path, ROWS)
    args = [*SMALL, "--data", data, "--per-class", "3", "--outer-steps", "2", "--inner-steps", "3",
            "--epsilon", "4", "--delta", "1e-5"]
    first = tmp_path / "first.jsonl"
    assert _synth([*args, "--out", str(first)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    noise = json.loads(RunPaths(first).sidecar.read_text())["examples_per_class_to_match_noise"]
    assert f"with fewer than ≈ {noise:,.0f} examples per class the target is mostly noise" in shown
    _write_data(path, [("POISON " + t[::-1], "neg" if y == "pos" else "pos") for t, y in ROWS])
    second = tmp_path / "second.jsonl"
    RunPaths(second).workdir.mkdir()
    for name in ("release.pt", "run.json"):
        shutil.copy(RunPaths(first).workdir / name, RunPaths(second).workdir / name)
    assert _synth([*args, "--out", str(second), "--resume"]) == 0
    assert second.read_bytes() == first.read_bytes() and len(first.read_bytes()) > 0
    privacy = json.loads(RunPaths(second).sidecar.read_text())
    assert privacy == json.loads(RunPaths(first).sidecar.read_text())


def test_no_dp_says_so_in_every_output(tmp_path, capsys) -> None:
    data = _write_data(tmp_path / "d.jsonl", ROWS)
    out = tmp_path / "o.jsonl"
    args = [*SMALL, "--data", data, "--per-class", "2", "--outer-steps", "1", "--inner-steps", "2", "--no-dp"]
    assert _synth([*args, "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["privacy"]["dp"] is False and "NOT differentially private" in summary["privacy"]["warning"]
    assert json.loads(RunPaths(out).sidecar.read_text())["dp"] is False
    assert all(json.loads(line)["dp"] is False for line in out.read_text().splitlines())
