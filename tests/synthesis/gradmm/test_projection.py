"""Projection onto word-like tokens: KV-cache decoding equals a full re-run per position."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.gradmm.projection import Projector, word_like_token_ids


def test_word_like_tokens() -> None:
    _, tokenizer = build_tiny_model("tiny-llama")
    allowed = set(word_like_token_ids(tokenizer, len(tokenizer)).tolist())
    great = tokenizer.encode(" great", add_special_tokens=False)
    assert len(great) == 1 and great[0] in allowed
    for bad in (",", ".", "<|endoftext|>"):
        (tid,) = tokenizer.encode(bad, add_special_tokens=False)
        assert tid not in allowed
    assert 0 < len(allowed) < len(tokenizer)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_kv_cache_projection_equals_full_rerun(name: str) -> None:
    model, tokenizer = build_tiny_model(name, seed=5)
    prefix = (tokenizer.bos_token_id, *tokenizer.encode(" a film It was great", add_special_tokens=False))
    projector = Projector(model, tokenizer, prefix, top_k=7)
    x = torch.randn(3, 6, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    got = projector(x)
    allowed = word_like_token_ids(tokenizer, len(tokenizer))
    unit = F.normalize(model.get_input_embeddings().weight[allowed], dim=1)
    for b in range(3):
        decoded: list[int] = []
        for i in range(6):
            cand = allowed[(F.normalize(x[b, i], dim=0) @ unit.T).topk(7).indices]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([[*prefix, *decoded]])).logits[0, -1]
            decoded.append(int(cand[logits[cand].argmax()]))
        assert got[b].tolist() == decoded


def test_top_1_projection_of_token_embeddings_returns_the_tokens() -> None:
    model, tokenizer = build_tiny_model("tiny-llama")
    projector = Projector(model, tokenizer, (tokenizer.bos_token_id,), top_k=1)
    ids = projector.allowed[torch.tensor([[0, 5, 9], [3, 3, 1]])]
    assert torch.equal(projector(projector.embed(ids)), ids)


def test_sampled_start_is_seeded_and_word_like() -> None:
    model, tokenizer = build_tiny_model("tiny-gpt2", seed=1)
    projector = Projector(model, tokenizer, (tokenizer.bos_token_id,), top_k=5)
    a, b, c = (projector.sample(4, 6, torch.Generator().manual_seed(s)) for s in (7, 7, 8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert set(a.flatten().tolist()) <= set(projector.allowed.tolist())
