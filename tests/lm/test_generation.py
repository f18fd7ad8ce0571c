"""Batched sampling (:func:`privlm.lm.generation.sample_many`): each prompt runs through the model once for all
its samples, and the samples are those of Hugging Face's own ``generate`` with ``num_return_sequences``."""

from __future__ import annotations

import pytest
import torch

import privlm.lm.generation as generation
from privlm.lm.generation import _prompt_cache, clean_generation, sample_many
from privlm.lm.prompts import pad_token_id
from privlm.lm.sampling import Sampling
from privlm.progress import Task
from privlm.resources.tiny import build_tiny_model

SAMPLING = Sampling(max_new_tokens=8)


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt2"])
def lm(request):
    model, tokenizer = build_tiny_model(request.param, seed=4)
    return model.eval(), tokenizer


def test_a_prompt_cache_repeated_per_sample_gives_the_tokens_of_num_return_sequences(lm) -> None:
    model, tokenizer = lm
    pad, count = tokenizer.pad_token_id or 0, 3
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16]]  # left padding of 0, 4 and 5 tokens
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    settings = dict(do_sample=True, top_k=0, top_p=0.95, max_new_tokens=8, pad_token_id=pad)
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        torch.manual_seed(7)
        reference = model.generate(ids, attention_mask=mask, num_return_sequences=count, **settings)
        torch.manual_seed(7)
        cached = model.generate(
            ids.repeat_interleave(count, 0),
            attention_mask=mask.repeat_interleave(count, 0),
            cache=_prompt_cache(model, ids, mask, count),
            **settings,
        )
    assert reference.shape == (len(prompts) * count, width + 8)
    assert torch.equal(cached, reference)


def test_sample_many_samples_at_its_temperature_and_top_p_as_generate_does(lm) -> None:
    model, tokenizer = lm
    sampling, prompt = Sampling(max_new_tokens=8, temperature=0.7, top_p=0.8), "a short prompt"
    texts = sample_many(model, tokenizer, [prompt], 4, 11, sampling, batch_size=4)[0]
    ids = tokenizer(prompt, add_special_tokens=not tokenizer.chat_template, return_tensors="pt")["input_ids"]
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        torch.manual_seed(11)  # sample_many's seed for its first chunk's first round
        out = model.generate(
            ids.repeat(4, 1),
            attention_mask=torch.ones(4, ids.shape[1], dtype=torch.long),
            do_sample=True,
            temperature=0.7,
            top_p=0.8,
            top_k=0,
            max_new_tokens=8,
            pad_token_id=pad_token_id(tokenizer),
        )
    reference = [clean_generation(t) for t in tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)]
    assert all(reference) and texts == reference


class _Counter(Task):
    def __init__(self) -> None:
        self.count = 0.0

    def advance(self, amount: float = 1) -> None:
        self.count += amount


def test_sample_many_gives_the_uncached_texts_and_counts_each(lm, monkeypatch) -> None:
    model, tokenizer = lm
    prompts = ["a short one", "a rather longer prompt with more words in it", "mid length prompt"]
    counted = _Counter()
    cached = sample_many(model, tokenizer, prompts, 3, 11, SAMPLING, batch_size=6, task=counted)
    monkeypatch.setattr(generation, "_prompt_cache", lambda *args: None)  # generate runs every copy itself
    assert sample_many(model, tokenizer, prompts, 3, 11, SAMPLING, batch_size=6) == cached
    assert [len(texts) for texts in cached] == [3, 3, 3] and counted.count == 9


class _Kill(Exception):
    pass


class _KillAfter(Task):
    def __init__(self, texts: int) -> None:
        self.left = texts

    def advance(self, amount: float = 1) -> None:
        self.left -= amount
        if self.left <= 0:
            raise _Kill


def test_a_killed_call_resumes_from_its_journal_after_the_finished_chunks_with_the_same_texts(lm, tmp_path) -> None:
    model, tokenizer = lm
    prompts = ["one", "two words", "three short words", "and a fourth", "five"]
    whole = sample_many(model, tokenizer, prompts, 2, 5, SAMPLING, batch_size=4)  # chunks of 2 prompts
    journal = tmp_path / "rewrites.jsonl"
    with pytest.raises(_Kill):  # killed in the second chunk: only the first is kept
        sample_many(model, tokenizer, prompts, 2, 5, SAMPLING, batch_size=4, task=_KillAfter(6), journal=journal)
    generated = []
    real_generate = model.generate
    model.generate = lambda *args, **kwargs: generated.append(1) or real_generate(*args, **kwargs)
    try:
        counted = _Counter()
        resumed = sample_many(model, tokenizer, prompts, 2, 5, SAMPLING, batch_size=4, task=counted, journal=journal)
    finally:
        del model.generate
    assert resumed == whole and counted.count == 10
    assert len(generated) == 2  # the second and third chunks; the first came from the journal
    finished = journal.read_bytes()  # every chunk of this call
    for per_prompt, seed, sampling, batch_size in [  # one other argument each: not the journal's texts
        (3, 5, SAMPLING, 4),
        (2, 6, SAMPLING, 4),
        (2, 5, Sampling(max_new_tokens=8, temperature=0.5), 4),
        (2, 5, SAMPLING, 2),
    ]:
        journal.write_bytes(finished)
        fresh = sample_many(model, tokenizer, prompts, per_prompt, seed, sampling, batch_size=batch_size)
        assert sample_many(model, tokenizer, prompts, per_prompt, seed, sampling, batch_size, journal=journal) == fresh


def test_a_one_token_prompt_is_sampled_without_a_cache(lm) -> None:
    model, tokenizer = lm
    one = tokenizer.convert_ids_to_tokens(5)
    assert _prompt_cache(model, torch.tensor([[5]]), torch.tensor([[1]]), 2) is None
    assert len(sample_many(model, tokenizer, [tokenizer.convert_tokens_to_string([one])], 2, 0, SAMPLING)[0]) == 2
