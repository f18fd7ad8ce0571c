"""``instruct-pool``: a seeded uniform draw of GRADMM's label-filtered instructed candidates — checked against a
GRADMM run's own candidates and label filter (the same pool, read from the shared folder, with no private data
touched); the draw itself is tested in ``tests/synthesis/gradmm/test_filtering.py``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from privlm.errors import UserError
from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.gradmm import generate
from privlm.synthesis.gradmm.config import make_config
from privlm.synthesis.gradmm.filtering import uniform_draw
from privlm.synthesis.gradmm.pipeline import GradmmPaths, run_gradmm
from privlm.synthesis.gradmm.pool import public_candidates_dir
from privlm.synthesis.gradmm.prompt import build_prompt
from privlm.synthesis.instruct_pool.method import instruct_pool_rows
from privlm.synthesis.registry import MethodContext

PRIVATE = [("a warm and funny story", 1), ("slow, dull and far too long", 0)]
NAMES, WORDS, TEMPLATE = ["negative", "positive"], ["bad", "great"], "{text} It was "
POOL = {"preset": "instruct", "batch": 3, "oversample": 6.0, "pool_seed": 7}  # 12 candidates per class


@pytest.fixture(scope="module")
def lm():
    model, tokenizer = build_tiny_model("tiny-llama", seed=3)  # its label filter leaves 8 and 5 of these eligible
    return model.requires_grad_(False), tokenizer


def _context(lm, workdir: Path, seed: int, params: dict, pool: list) -> MethodContext:
    """An ``instruct-pool`` cell's context for 2 per class whose private pool and features fail when read."""
    model, tokenizer = lm
    return MethodContext(
        model=model,
        tokenizer=tokenizer,
        pool=pool,
        label_names=NAMES,
        template=TEMPLATE,
        label_words=WORDS,
        n_per_class=2,
        seed=seed,
        epsilon=None,
        delta=1e-5,
        workdir=workdir,
        pool_features=lambda: pytest.fail("instruct-pool must not read the private pool"),
        params=params,
    )


@pytest.mark.parametrize("label_filter", [True, False])
def test_a_cell_draws_from_the_gradmm_cells_pool_without_private_data(
    lm, tmp_path, monkeypatch, label_filter, poisoned_pool
) -> None:
    """A GRADMM cell makes the public pool; an ``instruct-pool`` cell of the same experiment reads the same
    candidates and label verdicts (nothing is generated or classified again, the private pool is never read) and
    returns exactly the draw of GRADMM's own eligible candidates; another seed draws another subset."""
    model, tokenizer = lm
    config = replace(make_config(**POOL, seed=0), label_filter=label_filter, noise_only=True)
    prompt = build_prompt(tokenizer, TEMPLATE, WORDS, NAMES)
    work = tmp_path / "work"
    public = public_candidates_dir(work, model, config, prompt)
    out = work / "gradmm" / "synthetic.jsonl"
    out.parent.mkdir(parents=True)
    run_gradmm(
        model,
        tokenizer,
        prompt,
        lambda: list(PRIVATE),
        out=out,
        per_class=2,
        config=config,
        dp=True,
        epsilon=1.0,
        delta=1e-5,
        public_dir=public,
    )
    batches = GradmmPaths(out).batches
    pool = [
        c
        for k, j in generate.candidate_jobs(2, config, 2)
        for c in generate.load_batch(batches / f"class{k}_batch{j}.json")
    ]
    predicted = (
        generate.public_labels(model, tokenizer, prompt, pool, public) if label_filter else [c.label for c in pool]
    )
    eligible = [c for c, p in zip(pool, predicted, strict=True) if c.label == p]
    assert 0 < len(eligible) < len(pool) if label_filter else len(eligible) == len(pool) == 24
    monkeypatch.setattr(generate, "sample_texts", lambda *a, **k: pytest.fail("the public pool must be reused"))
    monkeypatch.setattr(generate, "few_shot_labels", lambda *a, **k: pytest.fail("the label verdicts must be reused"))
    ctx = _context(lm, work / "instruct-pool", 5, {**POOL, "label_filter": label_filter}, poisoned_pool)
    rows = instruct_pool_rows(ctx)
    expected = uniform_draw(pool, predicted, 2, 2, seed=5)
    assert len(rows) == 4 and [(r["text"], r["label"]) for r in rows] == [(c.text, c.label) for c in expected]
    assert all(r["uses_private_data"] is False and r["label_name"] == NAMES[r["label"]] for r in rows)
    assert instruct_pool_rows(replace(ctx, seed=6)) != rows


def test_a_pool_of_another_source_is_refused(lm, tmp_path, poisoned_pool) -> None:
    ctx = _context(lm, tmp_path / "cell", 0, {"preset": "demo"}, poisoned_pool)
    with pytest.raises(UserError, match="source 'instruct'"):
        instruct_pool_rows(ctx)
