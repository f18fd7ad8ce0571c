"""Zero-shot and few-shot generation baselines on a tiny model: prompts, seeding, labelling."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from privlm.errors import UserError
from privlm.lm.generation import chat_prompt, clean_generation, sample_texts
from privlm.lm.sampling import Sampling
from privlm.progress import Progress, Task
from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.generation import baselines
from privlm.synthesis.generation.baselines import few_shot, sample_pieces, zero_shot

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


class Interrupted(Exception):
    """A crash in the middle of a sampling run."""


class Counted(Task):
    """A progress task that records what it was advanced by."""

    def __init__(self) -> None:
        self.advanced: list[float] = []

    def advance(self, amount: float = 1) -> None:
        self.advanced.append(amount)


def test_sample_pieces_resume_where_they_stopped_and_shorter_runs_are_prefixes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(baselines, "PIECE", 2)
    model, tok = build_tiny_model("tiny-gpt2", seed=0)
    prompt = chat_prompt(tok, "Write one short text.")
    whole = sample_pieces(model, tok, prompt, 5, 3, FAST)
    assert len(whole) == 5
    assert whole[:2] == sample_texts(model, tok, prompt, 2, 3, FAST)  # the first piece is the plain seed's call
    assert sample_pieces(model, tok, prompt, 4, 3, FAST) == whole[:4]  # n a multiple of PIECE: a prefix
    assert sample_pieces(model, tok, prompt, 5, 4, FAST) != whole

    real, calls, crash_at = baselines.sample_texts, [], [2]

    def spy(*args, **kwargs):
        calls.append(args[3])  # the piece's count
        if len(calls) == crash_at[0]:
            raise Interrupted
        return real(*args, **kwargs)

    monkeypatch.setattr(baselines, "sample_texts", spy)
    with pytest.raises(Interrupted):
        sample_pieces(model, tok, prompt, 5, 3, FAST, keep=tmp_path)
    assert len(list(tmp_path.glob("sample-*.json"))) == 1
    crash_at[0] = 0
    calls.clear()
    task = Counted()
    assert sample_pieces(model, tok, prompt, 5, 3, FAST, keep=tmp_path, task=task) == whole
    assert calls == [2, 1] and task.advanced == [2, 2, 1]  # the kept first piece is read, not sampled
    calls.clear()
    assert sample_pieces(model, tok, prompt, 5, 3, FAST, keep=tmp_path) == whole and calls == []
    # the kept pieces are bound to the model's weights: another model samples afresh
    other, _ = build_tiny_model("tiny-gpt2", seed=1)
    sample_pieces(other, tok, prompt, 5, 3, FAST, keep=tmp_path)
    assert calls == [2, 2, 1]


def test_zero_shot_keeps_its_pieces_and_counts_every_text(tmp_path: Path) -> None:
    model, tok = build_tiny_model("tiny-gpt2", seed=0)
    fresh = zero_shot(model, tok, NAMES, 3, seed=7, sampling=FAST)

    class Recorded(Progress):
        def __init__(self) -> None:
            self.tasks: list[tuple[str, float | None, Counted]] = []

        def task(self, description, total=None, private=False, transient=False):
            self.tasks.append((description, total, Counted()))
            return self.tasks[-1][2]

    progress = Recorded()
    assert zero_shot(model, tok, NAMES, 3, seed=7, sampling=FAST, keep=tmp_path, progress=progress) == fresh
    assert len(list(tmp_path.glob("sample-*.json"))) == 2  # one piece per class
    ((description, total, task),) = progress.tasks
    assert description == "sampling 3 texts per class" and total == 6 and sum(task.advanced) == 6
