"""``dp-head-pool``: a DP-SGD-trained head-only labeller chooses among GRADMM's public candidates — its set checked
against forward passes of a model whose LM head holds the trained rows, its run reused without reading the private
pool again, its sidecar against its ledger; its noise-only control against the engine's own clipped sums."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from privlm.dpsgd.optimizer import DPOptimizer
from privlm.errors import UserError
from privlm.privacy.ledger import Ledger
from privlm.resources.tiny import build_tiny_model
from privlm.runfolder import LEDGER, sidecar_path
from privlm.synthesis.dp_head_pool import method
from privlm.synthesis.dp_head_pool.labeller import ROWS, LabellerConfig, train_labeller
from privlm.synthesis.dp_head_pool.method import NOISE_ROWS, dp_head_pool_rows
from privlm.synthesis.gradmm import generate
from privlm.synthesis.gradmm.config import make_config
from privlm.synthesis.gradmm.filtering import eligible_by_class, uniform_draw
from privlm.synthesis.gradmm.generate import LABEL_FILTER, candidate_jobs
from privlm.synthesis.gradmm.pipeline import PRIVATE_PASS
from privlm.synthesis.gradmm.pool import public_candidates_dir
from privlm.synthesis.gradmm.prompt import build_prompt
from privlm.synthesis.gradmm.release import private_factors
from privlm.synthesis.gradmm.select import HIDDEN
from privlm.synthesis.registry import MethodContext

PRIVATE = [
    ("a warm and funny story", 1),
    ("slow, dull and far too long", 0),
    ("I loved every minute of it", 1),
    ("one of the worst films of the year", 0),
    ("a delight from start to finish", 1),
    ("the acting is wooden", 0),
    ("moving and beautiful", 1),
    ("boring and clumsy", 0),
]
NAMES, WORDS, TEMPLATE = ["negative", "positive"], ["bad", "great"], "{text} It was "
POOL = {"preset": "instruct", "batch": 3, "oversample": 6.0, "pool_seed": 7}  # 12 candidates per class at n = 2
RECIPE = {"epochs": 5.0, "batch_size": 4, "lr": 0.01}
EPS = 30.0  # little enough noise that the tiny labeller moves with the data


@pytest.fixture
def seeded_training(monkeypatch):
    """The labeller's DP-SGD run with seed 0 (sampling and noise): deterministic. On the tiny model a head trained
    under most noise draws gives every candidate one class (its hidden states share one large direction); this
    seed's does not, so the draw has something to choose."""
    _seed_noise(monkeypatch, 0)


@pytest.fixture(scope="module")
def lm():
    model, tokenizer = build_tiny_model("tiny-llama", seed=4, dtype=torch.float64)
    return model.requires_grad_(False), tokenizer


def _context(lm, work: Path, cell: str, pool, epsilon: float | None = EPS, seed: int = 0, **params) -> MethodContext:
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
        epsilon=epsilon,
        delta=1e-5,
        workdir=work / cell,
        pool_features=lambda: pytest.fail("dp-head-pool reads the pool through its labeller only"),
        params={**POOL, **RECIPE, **params},
        private_cache=work / "private-cache",
    )


def test_a_cell_draws_among_the_candidates_its_dp_labeller_agrees_with(
    lm, tmp_path, seeded_training, head_votes
) -> None:
    model, tokenizer = lm
    work = tmp_path / "work"
    ctx = _context(lm, work, "dp-head-pool_n2_seed0_eps4", list(PRIVATE))
    rows = dp_head_pool_rows(ctx)
    # the labeller's run: one DP-SGD release, accounted within the target, its rows saved
    (run_dir,) = (work / "private-cache").glob("dphead-*")
    ledger = Ledger.load(run_dir / LEDGER)
    privacy = json.loads(sidecar_path(ctx.out).read_text())
    assert privacy["dp"] and privacy["epsilon"] == EPS and ledger.epsilon(1e-5) <= EPS
    assert (sidecar_path(ctx.out).parent / privacy["ledger_file"]).resolve() == (run_dir / LEDGER).resolve()
    assert all(r["epsilon_spent"] == EPS and r["method"] == "dp-head-pool" for r in rows)
    # the set: a uniform draw among the label-filtered candidates that the trained head gives their class
    eligible = _eligible(lm, work)
    trained = torch.load(run_dir / ROWS, weights_only=True)
    _assert_drawn_among_agreed(lm, rows, trained, eligible, head_votes)


def test_the_private_pass_is_shown_without_a_count_the_public_stages_with_theirs(
    lm, tmp_path, seeded_training, recorded_progress, poisoned_pool
) -> None:
    """The labeller's forward pass over the private examples is a task of its own (private: no count, and the
    steps' time left does not include it); the public candidates, their label filter and their hidden states
    (the eligible ones, counted one by one) show public counts. A second cell on the same labeller reads no
    private example and opens no private pass."""
    work = tmp_path / "work"
    ctx = replace(_context(lm, work, "dp-head-pool_n2_seed0_eps30", list(PRIVATE)), progress=recorded_progress)
    dp_head_pool_rows(ctx)
    jobs = candidate_jobs(2, make_config(**POOL), len(NAMES))
    eligible = len(_eligible(lm, work))
    assert 0 < eligible < 2 * 12
    assert recorded_progress.opened == [
        ("public candidates (instructed answers)", len(jobs), False),
        (LABEL_FILTER, 2 * 12, False),
        ("DP-SGD steps", None, False),
        (PRIVATE_PASS, None, True),
        (HIDDEN, eligible, False),
    ]
    assert recorded_progress.advanced_by[PRIVATE_PASS] == len(PRIVATE)
    assert recorded_progress.advanced_by[LABEL_FILTER] == 2 * 12
    assert recorded_progress.advanced_by[HIDDEN] == eligible and HIDDEN in recorded_progress.finished
    second = type(recorded_progress)()
    again = _context(lm, work, "dp-head-pool_n2_seed0_eps30b", poisoned_pool)
    dp_head_pool_rows(replace(again, progress=second))
    assert second.opened and PRIVATE_PASS not in [description for description, _, _ in second.opened]


def _seed_noise(monkeypatch, seed: int) -> None:
    made = LabellerConfig.train_config
    monkeypatch.setattr(LabellerConfig, "train_config", lambda self, *a: replace(made(self, *a), seed=seed))


def test_the_noise_only_control_reads_only_the_pool_size_and_spends_nothing(
    lm, tmp_path, monkeypatch, head_votes, size_only_pool
) -> None:
    # seed 1: of seeds 0-11 the only noise-only run whose head leaves the tiny pool's classes non-empty (a
    # pure-noise labeller is a random head: the next test)
    _seed_noise(monkeypatch, 1)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # a temporary run folder would show here
    calls: dict[str, list] = {"sums": [], "std": []}
    add_noise = DPOptimizer._add_noise

    def recorded(self, summed, std):
        calls["std"].append(std)
        calls["sums"].append([t.clone() for t in summed.values()])
        return add_noise(self, summed, std)

    monkeypatch.setattr(DPOptimizer, "_add_noise", recorded)
    work = tmp_path / "work"
    ctx = _context(lm, work, "dp-head-pool@noise_n2_seed0_eps30", size_only_pool(len(PRIVATE)), noise_only=True)
    rows = dp_head_pool_rows(ctx)
    noise_sums, noise_std = calls["sums"], calls["std"]
    # every step's clipped sum is exactly zero: the noised gradient is the Gaussian noise alone ...
    assert noise_sums and not any(t.any() for step in noise_sums for t in step)
    # ... at the σ·C and for the steps of the DP labeller's run on the real pool of the same size and ε
    calls["sums"], calls["std"] = [], []
    model, tokenizer = lm
    prompt = build_prompt(tokenizer, TEMPLATE, WORDS, NAMES)
    train_labeller(
        model,
        prompt,
        lambda: private_factors(model, tokenizer, PRIVATE, prompt, max_tokens=16),
        epsilon=EPS,
        delta=1e-5,
        config=LabellerConfig(**RECIPE),
        max_tokens=16,
        run_dir=tmp_path / "dp",
    )
    assert noise_std == calls["std"] and len(noise_sums) == len(calls["sums"])
    assert any(t.any() for step in calls["sums"] for t in step)  # the real run's sums are not zero
    privacy = json.loads(sidecar_path(ctx.out).read_text())
    assert privacy["noise_only"] and privacy["epsilon"] == 0.0 and privacy["delta"] == 0.0
    assert "public" in privacy["assumption"] and privacy["noise_labeller"]["steps"] == len(noise_sums)
    assert privacy["noise_labeller"]["noise_multiplier"] * privacy["noise_labeller"]["clip"] == noise_std[0]
    assert all(r["epsilon_spent"] == 0.0 and r["noise_only"] for r in rows)
    # nothing for a grid to count from the control: the only ledger is the DP run's, no temporary folder is left
    assert list(tmp_path.rglob(LEDGER)) == [tmp_path / "dp" / LEDGER]
    assert not any((tmp_path / "tmp").glob("*"))
    noise = torch.load(ctx.workdir / NOISE_ROWS, weights_only=True)
    _assert_drawn_among_agreed(lm, rows, noise, _eligible(lm, work), head_votes)


def test_a_noise_only_labeller_that_gives_a_class_nothing_is_refused_and_names_itself(
    lm, tmp_path, monkeypatch, size_only_pool
) -> None:
    _seed_noise(monkeypatch, 0)
    ctx = _context(lm, tmp_path, "dp-head-pool@noise_n2_seed0_eps30", size_only_pool(len(PRIVATE)), noise_only=True)
    for _ in range(2):  # the second time from the kept rows: the control is drawn once, never redrawn until it fits
        with pytest.raises(UserError, match="the noise-only labeller gives class 'negative' to none"):
            dp_head_pool_rows(ctx)
        assert not sidecar_path(ctx.out).exists()  # no set, no statement
        monkeypatch.setattr(method, "noise_labeller", lambda *a, **k: pytest.fail("the control was drawn again"))


def _eligible(lm, work: Path) -> list:
    """The public candidates of the tiny pool that the label filter gives their class, rebuilt independently."""
    model, tokenizer = lm
    config = make_config(**POOL, seed=0)
    prompt = build_prompt(tokenizer, TEMPLATE, WORDS, NAMES)
    public = public_candidates_dir(work, model, config, prompt)
    cands = [
        c
        for k, j in generate.candidate_jobs(2, config, 2)
        for c in generate.unscored(
            tokenizer,
            generate.instructed_batch(
                model, tokenizer, prompt, k, config, generate.batch_seed(config.candidate_seed, k, j), public
            ),
            k,
        )
    ]
    predicted = generate.public_labels(model, tokenizer, prompt, cands, public)
    return [c for p in eligible_by_class(cands, predicted, 2) for c in p]


def _assert_drawn_among_agreed(lm, rows: list[dict], labeller: torch.Tensor, eligible: list, head_votes) -> None:
    """``rows`` are the uniform draw (seed 0, n = 2) among the ``eligible`` candidates that a model copy whose LM
    head holds the ``labeller`` rows gives their class, and the labeller moved from the zero-shot rows."""
    model, tokenizer = lm
    prompt = build_prompt(tokenizer, TEMPLATE, WORDS, NAMES)
    start = model.get_output_embeddings().weight[list(prompt.label_token_ids)].double()
    assert labeller.shape == start.shape and not torch.equal(labeller, start)  # it trained
    votes = head_votes(model, prompt, labeller, eligible)
    agreed = [c for c, v in zip(eligible, votes, strict=True) if v == c.label]
    assert 0 < len(agreed) < len(eligible)  # the labeller drops candidates the public filter kept
    expected = uniform_draw(agreed, [c.label for c in agreed], 2, 2, seed=0)
    assert [(r["text"], r["label"]) for r in rows] == [(c.text, c.label) for c in expected]
    assert len(rows) == 2 * min(2, *(sum(c.label == k for c in agreed) for k in (0, 1))) > 0


def test_another_cell_of_the_same_run_reuses_it_and_the_private_pool_is_read_once(
    lm, tmp_path, monkeypatch, seeded_training, poisoned_pool
) -> None:
    work = tmp_path / "work"
    first = dp_head_pool_rows(_context(lm, work, "a", list(PRIVATE)))
    monkeypatch.setattr(generate, "sample_texts", lambda *a, **k: pytest.fail("the public pool must be reused"))
    again = dp_head_pool_rows(_context(lm, work, "b", poisoned_pool))
    assert again == first and len(list((work / "private-cache").glob("dphead-*"))) == 1
    # another seed is another DP run (its own draw, its own ledger), on the factors already cached
    dp_head_pool_rows(_context(lm, work, "c", poisoned_pool, seed=1))
    assert len(list((work / "private-cache").glob("dphead-*/" + LEDGER))) == 2


def test_a_run_of_other_settings_in_the_same_folder_is_refused(lm, tmp_path, seeded_training) -> None:
    model, tokenizer = lm
    prompt = build_prompt(tokenizer, TEMPLATE, WORDS, NAMES)

    def factors():
        return private_factors(model, tokenizer, PRIVATE, prompt, max_tokens=16)

    config = LabellerConfig(**RECIPE)
    run = {"delta": 1e-5, "run_dir": tmp_path / "run"}
    train_labeller(model, prompt, factors, epsilon=4.0, config=config, max_tokens=16, **run)
    for changed, name in (
        ({"epsilon": 1.0, "config": config, "max_tokens": 16}, "epsilon"),
        ({"epsilon": 4.0, "config": replace(config, lr=0.1), "max_tokens": 16}, "labeller"),
        ({"epsilon": 4.0, "config": config, "max_tokens": 32}, "max_tokens"),
    ):
        with pytest.raises(UserError, match=name):
            train_labeller(model, prompt, factors, **changed, **run)


def test_a_cell_without_epsilon_is_refused(lm, tmp_path) -> None:
    with pytest.raises(UserError, match="DP method"):
        dp_head_pool_rows(_context(lm, tmp_path, "none", list(PRIVATE), epsilon=None))
