"""``privlm demo``: DP synthesis end to end on a tiny model; a second run reuses the release."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privlm.cli import main
from privlm.gradmm import generate
from privlm.gradmm.filtering import select
from privlm.resources.cache import CACHE_ENV


@pytest.fixture
def label_filter_agrees(monkeypatch) -> None:
    """An untrained tiny model's few-shot labels reject most candidates, so the demo would keep none and
    these tests would compare empty outputs: make the label filter agree, keep the loss ranking."""
    monkeypatch.setattr(
        generate, "select", lambda cands, _pred, per_class, n: select(cands, [c.label for c in cands], per_class, n)
    )


def _demo(args: list[str], capsys) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", *args])
        raise SystemExit(0)
    assert exit_info.value.code == 0
    return json.loads(capsys.readouterr().out)


def test_demo_runs_dp_synthesis_and_reuses_its_release(
    tmp_path: Path, monkeypatch, capsys, label_filter_agrees
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    args = ["--model", "tiny-llama", "--data", "tweets", "--per-class", "2", "--eval-test", "0", "--json"]
    first = _demo(args, capsys)
    assert first["privacy"]["dp"] and first["privacy"]["epsilon_target"] == 4.0
    assert first["privacy"]["delta"] == 1e-5 and not first["reused_release"]
    assert Path(first["out"]).is_relative_to(tmp_path) and Path(first["out"]).is_file()
    assert first["data"]["verbalizer"]["label_words"] == ["sadness", "joy"]
    assert len(first["rows"]) == 4 and {row["label"] for row in first["rows"]} == {0, 1}
    second = _demo(args, capsys)
    assert second["reused_release"] and second["rows"] == first["rows"]
    assert second["privacy"]["release_sha256"] == first["privacy"]["release_sha256"]


def test_demo_ends_with_synthetic_vs_random_real_accuracies(
    tmp_path: Path, monkeypatch, capsys, label_filter_agrees
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    args = ["--model", "tiny-llama", "--data", "tweets", "--per-class", "2", "--eval-test", "6", "--json"]
    facts = _demo(args, capsys)
    comparison = facts["comparison"]
    n_synthetic = len(facts["rows"])
    assert n_synthetic == 4
    for name in ("synthetic", "random_real"):
        scores = comparison[name]
        assert scores["n_test"] == 6 and scores["n_train"] == n_synthetic
        assert 0.0 <= scores["ci_low"] <= scores["accuracy"] <= scores["ci_high"] <= 1.0


def test_demo_rejects_negative_eval_test(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--model", "tiny-llama", "--eval-test", "-1"])
    assert exit_info.value.code == 2
    assert "--eval-test must be >= 0 (got -1)" in capsys.readouterr().err
