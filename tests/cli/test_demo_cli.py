"""``privlm demo``: DP synthesis end to end on a tiny model; a second run reuses the release."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privlm.cli import main
from privlm.resources.cache import CACHE_ENV


def _demo(args: list[str], capsys) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", *args])
        raise SystemExit(0)
    assert exit_info.value.code == 0
    return json.loads(capsys.readouterr().out)


def test_demo_runs_dp_synthesis_and_reuses_its_release(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    args = ["--model", "tiny-llama", "--data", "tweets", "--per-class", "2", "--json"]
    first = _demo(args, capsys)
    assert first["privacy"]["dp"] and first["privacy"]["epsilon_target"] == 4.0
    assert first["privacy"]["delta"] == 1e-5 and not first["reused_release"]
    assert Path(first["out"]).is_relative_to(tmp_path) and Path(first["out"]).is_file()
    assert first["data"]["verbalizer"]["label_words"] == ["sadness", "joy"]
    second = _demo(args, capsys)
    assert second["reused_release"] and second["rows"] == first["rows"]
    assert second["privacy"]["release_sha256"] == first["privacy"]["release_sha256"]
