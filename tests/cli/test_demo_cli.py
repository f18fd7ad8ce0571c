"""``privlm demo``: both capabilities on one private pass (tiny model), controls, composed privacy, reuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run

from privlm.experiments import demo as demo_module
from privlm.privacy.ledger import Ledger
from privlm.resources.datasets import load_dataset
from privlm.synthesis.gradmm.pipeline import GradmmPaths

ARGS = ["--model", "tiny-llama", "--data", "tweets", "--private-rows", "48", "--test-rows", "24", "--per-class", "2"]


@pytest.fixture
def passes(monkeypatch) -> list[int]:
    """The size of every forward pass ``private_factors`` makes (the demo's only reader of rows' texts)."""
    sizes: list[int] = []
    real = demo_module.private_factors

    def counting(model, tokenizer, rows, prompt, **kwargs):
        sizes.append(len(rows))
        return real(model, tokenizer, rows, prompt, **kwargs)

    monkeypatch.setattr(demo_module, "private_factors", counting)
    return sizes


def _demo(tmp_path: Path, capsys, *extra: str) -> tuple[dict, str]:
    code, out, err = run(["demo", *ARGS, "--out", str(tmp_path / "demo"), "--json", *extra], capsys)
    assert code == 0, err
    return json.loads(out), err


def test_demo_shows_both_capabilities_with_their_controls(tmp_path: Path, capsys, passes) -> None:
    report, err = _demo(tmp_path, capsys)
    assert passes[0] == 48  # the private set is read by exactly one forward pass ...
    assert passes.count(48) == 1  # ... (the others are the test subset and the DP / public / reference sets)
    assert set(report["finetune"]) >= {"untrained", "dp", "non_private"}
    assert set(report["synthetic"]) == {"gradmm", "noise_only", "zero_shot", "random_real"}
    for scores in [
        *(report["finetune"][k] for k in ("untrained", "dp", "non_private")),
        report["synthetic"]["zero_shot"],
    ]:
        assert scores["n_test"] == 24 and scores["ci_low"] <= scores["accuracy"] <= scores["ci_high"]
    assert report["synthetic"]["random_real"]["n_train"] == 4  # 2 per class
    assert report["new_privacy_spent"] and not report["reused_private_pass"]
    html = Path(report["report_html"]).read_text()
    assert "noise-only control" in html and "DP fine-tune" in html and Path(report["report_png"]).stat().st_size > 1000
    for stage in ("one forward pass", "DP fine-tune", "GRADMM", "head-only classifier"):
        assert f"start: {stage}" in err and f"done: {stage}" in err  # stderr is not a terminal: one line per stage


def test_composed_privacy_is_the_ledgers_composition(tmp_path: Path, capsys) -> None:
    report, _ = _demo(tmp_path, capsys)
    folder = tmp_path / "demo"
    ft = Ledger.load(folder / "dp-finetune" / "privacy.json")
    gradmm = Ledger.load(GradmmPaths(folder / "gradmm" / "synthetic.jsonl").ledger)
    assert len(ft) >= 1 and len(gradmm) >= 1
    privacy = report["privacy"]
    assert privacy["epsilon_composed_pld"] == pytest.approx(Ledger((*ft.entries, *gradmm.entries)).epsilon(1e-5))
    assert privacy["epsilon_basic_composition"] == 4.0
    assert ft.epsilon(5e-6) <= 1.0 + 1e-6 and gradmm.epsilon(5e-6) <= 3.0 + 1e-6  # each within its share
    assert privacy["epsilon_composed_pld"] <= 4.0


def test_second_run_reuses_everything_and_spends_nothing(tmp_path: Path, capsys, passes) -> None:
    first, _ = _demo(tmp_path, capsys)
    folder = tmp_path / "demo"
    ledgers = [folder / "dp-finetune" / "privacy.json", GradmmPaths(folder / "gradmm" / "synthetic.jsonl").ledger]
    before = [p.read_bytes() for p in ledgers]
    passes.clear()
    second, _ = _demo(tmp_path, capsys)
    assert not second["new_privacy_spent"] and second["reused_private_pass"] and second["finetune"]["reused"]
    assert 48 not in passes  # no pass over the private set
    assert [p.read_bytes() for p in ledgers] == before
    assert second["finetune"]["dp"] == first["finetune"]["dp"]
    assert second["synthetic"]["gradmm"] == first["synthetic"]["gradmm"]
    assert second["privacy"] == first["privacy"]


def test_no_private_text_reaches_the_report(tmp_path: Path, capsys) -> None:
    report, _ = _demo(tmp_path, capsys)
    private = [text for text, _ in load_dataset("tweets", split="train", seed=0).examples[:48]]
    outputs = [Path(report["report_html"]).read_text(), (tmp_path / "demo" / "demo.json").read_text()]
    leaked = [t for t in private if len(t) > 20 and any(t in o for o in outputs)]
    assert leaked == []


def test_an_unfinished_dp_finetune_is_refused_not_redone(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "demo" / "dp-finetune"
    folder.mkdir(parents=True)
    (folder / "privacy.json").write_text('{"entries": []}')
    code, _, err = run(["demo", *ARGS, "--out", str(tmp_path / "demo")], capsys)
    assert code == 2 and "unfinished or different DP fine-tune" in err


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--private-rows", "0"], "private_rows must be an integer >= 1"),
        (["--data", "jsonl:/nonexistent.jsonl"], "the demo runs on a built-in data set"),
        (["--synth-epsilon", "0"], "--synth-epsilon must be a positive finite number"),
        (["--private-rows", "100000"], "asked for 100000"),
    ],
)
def test_bad_settings_exit_2_before_anything_is_written(tmp_path: Path, capsys, extra, fragment) -> None:
    code, _, err = run(["demo", *ARGS, *extra, "--out", str(tmp_path / "demo")], capsys)
    assert code == 2 and fragment in err
    assert not (tmp_path / "demo" / "dp-finetune").exists()


def test_the_cli_defaults_are_the_settings_defaults() -> None:
    """``privlm demo``'s option defaults are written out (so ``--help`` imports no torch): they must stay
    ``DemoSettings``'s."""
    from privlm.cli.demo import DEFAULTS
    from privlm.experiments.demo import DemoSettings

    assert DEFAULTS == {name: getattr(DemoSettings(), name) for name in DEFAULTS}
