"""Model registry: tiny models train, local folders round-trip, bad names fail fast and clearly."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants

from privlm.errors import UserError
from privlm.names import TINY_MODELS
from privlm.resources import online
from privlm.resources.models import MODEL_NAMES, cache_path, count_parameters, describe_model, is_cached, load_model
from privlm.resources.tiny import build_tiny_model


@pytest.mark.parametrize("name", TINY_MODELS)
def test_tiny_model_forward_and_backward(name: str) -> None:
    model, tokenizer = load_model(name, seed=1)
    batch = tokenizer(["It was great.", "The film is slow"], return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    out = model(**batch, labels=labels)
    assert out.logits.shape == (*batch["input_ids"].shape, len(tokenizer))
    assert torch.isfinite(out.loss)
    out.loss.backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), param_name
        assert param.grad.abs().sum() > 0, param_name


@pytest.mark.parametrize("name", TINY_MODELS)
def test_tiny_model_is_seeded(name: str) -> None:
    a, _ = load_model(name, seed=5)
    b, _ = load_model(name, seed=5)
    c, _ = load_model(name, seed=6)
    first = next(iter(a.state_dict()))
    torch.testing.assert_close(a.state_dict()[first], b.state_dict()[first], rtol=0, atol=0)
    assert not torch.equal(a.state_dict()[first], c.state_dict()[first])


def test_tied_embedding_counted_once() -> None:
    model, _ = load_model("tiny-llama")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    distinct = {p.data_ptr(): p.numel() for p in model.parameters()}
    all_tensors = sum(t.numel() for t in model.state_dict(keep_vars=True).values())
    assert count_parameters(model) == sum(distinct.values())
    assert all_tensors - count_parameters(model) == model.lm_head.weight.numel()


def test_describe_model() -> None:
    model, _ = load_model("tiny-gpt2", dtype=torch.float64)
    facts = describe_model(model)
    assert facts["architecture"] == "GPT2LMHeadModel" and facts["model_type"] == "gpt2"
    assert facts["dtype"] == "float64" and facts["tied_embeddings"] is True
    assert facts["layers"] == 2 and facts["hidden_size"] == 32 and facts["parameters"] == count_parameters(model)


def test_local_folder_round_trip(tmp_path: Path) -> None:
    model, tokenizer = build_tiny_model("tiny-llama", seed=2)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_model(str(tmp_path))
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0)
    assert loaded_tokenizer("a fine film")["input_ids"] == tokenizer("a fine film")["input_ids"]
    assert not loaded.training
    assert cache_path(str(tmp_path)) == tmp_path.resolve() and is_cached(str(tmp_path))


def test_registered_models_report_where_they_live() -> None:
    assert cache_path("tiny-llama") is None and is_cached("tiny-gpt2")
    assert MODEL_NAMES[0] == "smollm2-135m"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("smollm3-xl", r"unknown model 'smollm3-xl'.*offline.*known names: smollm2-135m, tiny-llama, tiny-gpt2"),
        ("someone/some-model", r"unknown model 'someone/some-model'.*known names"),
        ("./no/such/folder", r"model folder not found: ./no/such/folder"),
    ],
)
def test_unknown_models_fail_fast(name: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    start = time.perf_counter()
    with pytest.raises(UserError, match=message):
        load_model(name)
    assert time.perf_counter() - start < 20  # no network retries (they take about a minute)


def test_folder_without_a_model(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=rf"cannot load model '{tmp_path}'"):
        load_model(str(tmp_path))


def test_hub_reachability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert online.hub_reachable() is False
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: refused
    assert online.hub_reachable(timeout=1.0) is False
