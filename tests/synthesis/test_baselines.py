"""Zero-shot and few-shot generation baselines on a tiny model: prompts, seeding, labelling."""

from __future__ import annotations

import copy

import pytest
import torch

from privlm.errors import UserError
from privlm.lm.generation import chat_prompt, clean_generation
from privlm.lm.sampling import Sampling
from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.generation import baselines
from privlm.synthesis.generation.baselines import few_shot, zero_shot

NAMES = ["negative", "positive"]
POOL = [(f"bad {i}", 0) for i in range(5)] + [(f"good {i}", 1) for i in range(4)]
FAST = Sampling(max_new_tokens=8)


def test_chat_prompt_uses_the_template_when_there_is_one() -> None:
    _, tok = build_tiny_model("tiny-gpt2")
    assert chat_prompt(tok, "Write.") == "Write.\n"
    chat = copy.deepcopy(tok)
    chat.chat_template = (
        "{% for m in messages %}<u>{{ m['content'] }}</u>{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
    )
    assert chat_prompt(chat, "Write.") == "<u>Write.</u><a>"


def test_clean_generation() -> None:
    assert clean_generation('\n  - "A fine film."\nmore') == "A fine film."
    assert clean_generation(" \n \n") == ""


def test_zero_shot_is_seeded_labelled_and_leaves_the_global_rng_alone() -> None:
    model, tok = build_tiny_model("tiny-gpt2", seed=0)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    rows = zero_shot(model, tok, NAMES, 3, seed=7, sampling=FAST)
    assert torch.equal(torch.rand(3), expected_next)
    assert [r["label"] for r in rows] == [0, 0, 0, 1, 1, 1]
    assert {r["label_name"] for r in rows} == set(NAMES)
    assert all(r["text"] and r["uses_private_data"] is False for r in rows)
    assert zero_shot(model, tok, NAMES, 3, seed=7, sampling=FAST) == rows
    assert zero_shot(model, tok, NAMES, 3, seed=8, sampling=FAST) != rows


def test_few_shot_prompts_hold_k_private_examples_of_the_class(monkeypatch: pytest.MonkeyPatch) -> None:
    model, tok = build_tiny_model("tiny-gpt2", seed=0)
    prompts: list[str] = []
    real = baselines.sample_texts

    def spy(model, tokenizer, prompt, n, seed, sampling):
        prompts.append(prompt)
        return real(model, tokenizer, prompt, n, seed, sampling)

    monkeypatch.setattr(baselines, "sample_texts", spy)
    rows = few_shot(model, tok, POOL, NAMES, 2, k=3, seed=1, sampling=FAST)
    assert [r["label"] for r in rows] == [0, 0, 1, 1]
    assert all(r["uses_private_data"] is True and r["method"] == "few-shot" for r in rows)
    for prompt, row in zip(prompts, rows):
        shots = [t for t, _ in POOL if f"- {t}\n" in prompt]
        assert len(shots) == 3
        assert all(y == row["label"] for t, y in POOL if t in shots)
    with pytest.raises(UserError, match="fewer than k=5"):
        few_shot(model, tok, POOL, NAMES, 1, k=5, sampling=FAST)
    with pytest.raises(UserError, match="exceeds the model's context of 128"):
        zero_shot(model, tok, NAMES, 1, instructions=["word " * 60] * 2, sampling=Sampling(max_new_tokens=70))
    with pytest.raises(UserError, match="1 instructions for 2 classes"):
        zero_shot(model, tok, NAMES, 1, instructions=["only one"], sampling=FAST)
