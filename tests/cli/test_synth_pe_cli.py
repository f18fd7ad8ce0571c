"""``privlm synth --method pe|dp-finetune``: tiny runs with their ledgers, resume without a redraw, bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import exit_code

ROWS = [("a warm and funny film", "pos"), ("slow and dull", "neg"), ("great fun", "pos"), ("a bad, boring film", "neg")]
SMALL = [
    "--model",
    "tiny-llama",
    "--labels",
    "neg,pos",
    "--method",
    "pe",
    "--iterations",
    "2",
    "--variations",
    "1",
    "--per-class",
    "1",
    "--seed",
    "3",
    "--max-new-tokens",
    "6",
]


def _synth(args: list[str]) -> int:
    return exit_code(["synth", *args])


@pytest.fixture
def data(tmp_path: Path) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in ROWS * 5))
    return f"jsonl:{path}"


def test_pe_run_reports_its_epsilon_and_resumes_without_a_new_draw(data, tmp_path, capsys) -> None:
    out = tmp_path / "pe.jsonl"
    args = [*SMALL, "--data", data, "--out", str(out), "--epsilon", "2", "--delta", "1e-5", "--json"]
    assert _synth(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert len(summary["rows"]) == 2 and 2.0 <= summary["privacy"]["epsilon"] < 2.01
    assert summary["reused_histograms"] == 0 and len(summary["privacy"]["ledger"]) == 2
    assert _synth(args) == 2 and "--resume" in capsys.readouterr().err
    assert _synth([*args, "--resume"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["reused_histograms"] == 2 and again["rows"] == summary["rows"]
    assert len(again["privacy"]["ledger"]) == 2
    assert _synth([*args, "--resume", "--private-per-class", "2"]) == 2  # another private cut: refused
    assert "private_per_class" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--method", "magic"], "gradmm, pe"),
        (["--iterations", "0"], "iterations"),
        (["--population", "0.5"], "population"),
        (["--private-per-class", "99"], "--private-per-class 99 is larger"),
    ],
)
def test_bad_input_exits_2_naming_the_value(data, tmp_path, capsys, flags, fragment) -> None:
    args = [*SMALL, "--data", data, "--out", str(tmp_path / "pe.jsonl"), "--epsilon", "1", "--delta", "1e-5", *flags]
    assert _synth(args) == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "pe.jsonl.pe").exists()


def test_dp_finetune_run_reports_the_training_runs_epsilon(data, tmp_path, capsys) -> None:
    out = tmp_path / "dpft.jsonl"
    args = [
        "--model",
        "tiny-llama",
        "--labels",
        "neg,pos",
        "--method",
        "dp-finetune",
        "--epochs",
        "1",
        "--lora-layers",
        "1",
        "--per-class",
        "2",
        "--max-new-tokens",
        "6",
        "--data",
        data,
        "--out",
        str(out),
        "--epsilon",
        "3",
        "--delta",
        "1e-5",
        "--json",
    ]
    assert _synth(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert len(summary["rows"]) == 4 and summary["privacy"]["epsilon"] == 3.0 >= summary["privacy"]["epsilon_accounted"]
    assert _synth(args) == 2 and "--resume" in capsys.readouterr().err
    assert (
        _synth([*args[:-4], "0.5", "--delta", "1e-5", "--resume"]) == 2
    )  # the finished ε = 3 run is not reused at 0.5
    assert "--resume: epsilon was 3.0" in capsys.readouterr().err
    assert _synth([*args[:-5], "--no-dp"]) == 2 and "--epsilon" in capsys.readouterr().err


@pytest.mark.parametrize("method, target", [("pe", "run_pe"), ("dp-finetune", "run_dp_finetune")])
def test_pe_and_dp_finetune_take_the_datas_own_class_instructions(tmp_path: Path, monkeypatch, method, target) -> None:
    """The CLI gives PE and dp-finetune the data's own class instructions, as the experiment runner does:
    tweets get tweet instructions, rotten-tomatoes keeps the default (None)."""
    from types import SimpleNamespace

    from privlm.progress import SILENT
    from privlm.synthesis.command import SynthRequest
    from privlm.synthesis.registry import synth_commands

    module = "privlm.synthesis.pe.mechanism" if method == "pe" else "privlm.synthesis.dp_finetune.mechanism"
    seen = []

    def capture(*args, config, **kwargs):
        seen.append(config.instructions)
        return SimpleNamespace(rows=[], privacy={}, reused_histograms=0)

    monkeypatch.setattr(f"{module}.{target}", capture)
    for data in ("tweets", "rotten-tomatoes"):
        request = SynthRequest(
            method, "tiny-llama", data, None, 2, tmp_path / f"{data}.jsonl", True, 1.0, 1e-5, 1, True
        )
        synth_commands()[method].start(request)(None, None, SILENT)
    assert seen[0] == ("Write one short tweet that expresses sadness.", "Write one short tweet that expresses joy.")
    assert seen[1] is None
