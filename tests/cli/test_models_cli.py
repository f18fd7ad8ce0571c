"""``privlm models show`` and ``privlm demo`` on tiny models and a stand-in SmolLM2 cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run
from huggingface_hub import constants

from privlm.resources import smollm2
from privlm.resources.cache import CACHE_ENV
from privlm.resources.models import count_parameters
from privlm.resources.tiny import build_tiny_model


def test_tiny_model_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["models", "show", "tiny-gpt2", "--json"], capsys)
    facts = json.loads(out)
    assert code == 0
    assert facts["architecture"] == "GPT2LMHeadModel"
    assert facts["parameters"] == count_parameters(build_tiny_model("tiny-gpt2")[0])
    assert facts["cache_path"] is None and facts["cached"] is True


def test_smollm2_cache_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(smollm2, "dequantize_gguf", lambda: build_tiny_model("tiny-llama"))
    first = json.loads(run(["models", "show", "smollm2-135m", "--json"], capsys)[1])
    second = json.loads(run(["models", "show", "smollm2-135m", "--json"], capsys)[1])
    assert first["was_cached"] is False and first["cached"] is True and second["was_cached"] is True
    assert first["cache_path"] == second["cache_path"] == str(smollm2.cache_path())
    assert Path(first["cache_path"]).parent.parent == tmp_path


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["models", "show", "tiny-llama"], capsys)
    assert code == 0 and "LlamaForCausalLM" in out and "parameters" in out


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gpt-17", "error: unknown model 'gpt-17'"),
        ("./missing-folder", "error: model folder not found: ./missing-folder"),
    ],
)
def test_bad_model_exit_2(
    name: str, message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    code, out, err = run(["models", "show", name], capsys)
    assert code == 2 and out == "" and err.startswith(message) and err.count("\n") == 1
    assert "smollm2-135m, tiny-llama, tiny-gpt2" in err
