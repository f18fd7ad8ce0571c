"""Private Evolution on a tiny model: accounting against μ-GDP, sensitivity 1, convergence without noise,
the wall (poison test), resume without a redraw, refusals."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

import privlm.randomness as randomness
import privlm.synthesis.generation.baselines as baselines
import privlm.synthesis.pe.mechanism as pe
from privlm.errors import UserError
from privlm.lm.sampling import Sampling
from privlm.privacy.calibration import gaussian_releases_epsilon
from privlm.privacy.snapping import snapping_eta
from privlm.resources.tiny import build_tiny_model
from privlm.runfolder import LOCK, claim
from privlm.synthesis.pe.config import PEConfig
from privlm.synthesis.pe.mechanism import (
    CandidateEmbedder,
    PEPaths,
    histogram_snapped,
    nearest_candidates,
    noise_multiplier,
    run_pe,
    vote_counts,
)

NAMES = ["negative", "positive"]
PRIVATE = [
    ("a joyful, clever film", 1),
    ("tedious and empty", 0),
    ("moving and beautifully acted", 1),
    ("a mess of a movie", 0),
]
POISONED = [("POISON " * 5 + text[::-1], 1 - label) for text, label in PRIVATE]
CONFIG = PEConfig(iterations=2, population=2.0, variations=1, max_new_tokens=6, max_tokens=16, seed=3)


@pytest.fixture(scope="module")
def lm():
    model, tokenizer = build_tiny_model("tiny-llama", seed=2)
    return model.requires_grad_(False), tokenizer


def _run(lm, out: Path, load_private, **kwargs):
    model, tokenizer = lm
    return run_pe(
        model,
        tokenizer,
        NAMES,
        load_private,
        out=out,
        per_class=2,
        config=kwargs.pop("config", CONFIG),
        epsilon=kwargs.pop("epsilon", 4.0),
        delta=1e-5,
        **kwargs,
    )


def gdp_epsilon(mu: float, delta: float) -> float:
    """ε at δ of μ-GDP (Dong, Roth & Su): δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), solved by bisection."""

    def gdp_delta(eps: float) -> float:
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)

    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if gdp_delta(mid) <= delta else (mid, hi)
    return hi


@pytest.mark.parametrize("epsilon, iterations", [(1.0, 1), (1.0, 10), (4.0, 3), (4.0, 20)])
def test_epsilon_agrees_with_mu_gdp_and_pld_is_never_below(epsilon: float, iterations: int) -> None:
    config = PEConfig(iterations=iterations)
    sigma = noise_multiplier(epsilon, 1e-5, config, 2, 100)
    snapped = histogram_snapped(2, config.candidates(100))
    pld = gaussian_releases_epsilon(sigma, iterations, 1e-5, snapped)
    gdp = gdp_epsilon(math.sqrt(iterations) / sigma, 1e-5)  # T Gaussians of multiplier σ compose to μ = √T/σ exactly
    slack = 2 * snapping_eta(snapped * iterations)  # what snapping adds to ε (≈ 1.2e-5 per histogram here)
    assert pld <= epsilon  # calibrated to meet the target
    assert gdp <= pld  # the pessimistic PLD is never below the exact composition
    assert 0 <= pld - slack - gdp <= 1e-4  # and agrees with it within the discretisation once the slack is removed
    assert (
        gaussian_releases_epsilon(sigma / 1.002, iterations, 1e-5, snapped) > epsilon
    )  # σ is the smallest (rtol 1e-3)


def test_one_example_moves_the_histogram_by_exactly_one_in_l2() -> None:
    rng = np.random.default_rng(0)
    private, labels = rng.normal(size=(30, 5)), rng.integers(0, 3, size=30)
    candidates = [rng.normal(size=(4, 5)) for _ in range(3)]
    full = np.concatenate(vote_counts(private, labels, candidates))
    assert full.sum() == 30
    for i in range(30):
        keep = np.arange(30) != i
        neighbour = np.concatenate(vote_counts(private[keep], labels[keep], candidates))
        assert np.linalg.norm(full - neighbour) == 1.0


def _exact_ties(rng: np.random.Generator, rows: int, candidates: np.ndarray) -> np.ndarray:
    """Unit embeddings on exact ties: the normalised midpoints of random pairs of distinct candidates."""
    pairs = rng.integers(0, len(candidates), size=(3 * rows, 2))
    pairs = pairs[pairs[:, 0] != pairs[:, 1]][:rows]
    mid = (candidates[pairs[:, 0]] + candidates[pairs[:, 1]]) / 2
    return mid / np.linalg.norm(mid, axis=1, keepdims=True)


@pytest.mark.parametrize("position", ["first", "middle", "last"])
def test_adding_one_example_changes_no_other_examples_vote_even_on_exact_ties(position) -> None:
    """Every vote is a function of its own example: adding one (at any position, any count of rows, so
    chunked searches would cut the others differently) leaves every other vote unchanged, ties included,
    and the histogram moves by exactly one vote. A batched nearest-neighbour search failed this: adding
    one example in front of 256 tied rows moved another row's vote in 15 of 40 trials."""
    rng = np.random.default_rng(7)
    cand = rng.standard_normal((64, 64))
    cand /= np.linalg.norm(cand, axis=1, keepdims=True)
    moved = 0
    for rows in (255, 256, 257, 300):
        tied = _exact_ties(rng, rows, cand)
        base = nearest_candidates(tied, cand)
        assert (base == [nearest_candidates(t[None], cand)[0] for t in tied]).all()  # = each row alone
        for extra in (rng.standard_normal(64), tied[rows // 3]):  # a random example, and another tie
            at = {"first": 0, "middle": rows // 2, "last": rows}[position]
            added = np.insert(tied, at, extra / np.linalg.norm(extra), axis=0)
            others = np.delete(nearest_candidates(added, cand), at)
            moved += int((others != base).sum())
            labels = np.zeros(rows, dtype=np.int64)
            before = vote_counts(tied, labels, [cand])[0]
            after = vote_counts(added, np.zeros(rows + 1, dtype=np.int64), [cand])[0]
            assert np.abs(after - before).sum() == 1 and np.linalg.norm(after - before) == 1.0
    assert moved == 0


def test_without_noise_pe_converges_to_the_candidates_nearest_the_private_examples(lm, tmp_path, monkeypatch) -> None:
    # the public LM proposes the private texts among distractors; without noise they take every vote and survive
    def proposals(model, tokenizer, label_names, n, seed, **kwargs):
        mine = {k: [t for t, y in PRIVATE if y == k] for k in range(2)}
        return [
            {"text": text, "label": k}
            for k in range(2)
            for text in [f"distractor {k} {j} zz" for j in range(n - 2)] + mine[k]
        ]

    def rewrites(model, tokenizer, prompts, per_prompt, seed, sampling, task=None, journal=None):
        return [[f"rewrite {seed} {i} {j} qq" for j in range(per_prompt)] for i in range(len(prompts))]

    monkeypatch.setattr(pe, "zero_shot", proposals)
    monkeypatch.setattr(pe, "sample_many", rewrites)
    config = PEConfig(iterations=3, population=3.0, variations=2, max_new_tokens=6, max_tokens=16)
    result = _run(lm, tmp_path / "a.jsonl", lambda: list(PRIVATE), epsilon=None, config=config)
    assert sorted((r["text"], r["label"]) for r in result.rows) == sorted(PRIVATE)
    assert all(r["noisy_votes"] == 1.0 and r["dp"] is False for r in result.rows)
    assert result.privacy["dp"] is False and not PEPaths(tmp_path / "a.jsonl").ledger.exists()


@pytest.fixture(scope="module")
def reference(lm, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "pe.jsonl"
    with pytest.MonkeyPatch.context() as mp:  # a fixed noise key, so this file is deterministic
        mp.setattr(randomness.os, "urandom", lambda n: bytes(range(n)))
        _run(lm, out, lambda: list(PRIVATE))
    return out


def test_output_rows_ledger_and_sidecar(reference) -> None:
    rows = [json.loads(line) for line in reference.read_text().splitlines()]
    assert [r["label"] for r in rows] == [0, 0, 1, 1] and all(r["dp"] for r in rows)
    privacy = json.loads(PEPaths(reference).sidecar.read_text())
    assert privacy["epsilon_target"] == 4.0 and 4.0 <= privacy["epsilon"] and privacy["epsilon_accounted"] <= 4.0
    assert privacy["iterations"] == 2 and len(privacy["ledger"]) == 2
    assert privacy["ledger"][0]["event"] == {
        "kind": "gaussian_release",
        "noise_multiplier": privacy["noise_multiplier"],
        "snapped": histogram_snapped(2, 4),
    }


def _copy_state(src: Path, dst: Path) -> None:
    shutil.copytree(PEPaths(src).workdir, PEPaths(dst).workdir)


def test_poisoning_private_data_after_the_histograms_leaves_output_bit_identical(lm, reference, tmp_path) -> None:
    model, tokenizer = lm
    candidates = [np.eye(8)[:4], np.eye(8)[4:]]
    embed = lambda texts: pe.hidden_features(model, tokenizer, texts, "mean", max_length=16)  # noqa: E731
    before = pe.vote_counts(
        pe.unit_rows(embed([t for t, _ in PRIVATE])[:, :8]), np.array([y for _, y in PRIVATE]), candidates
    )
    after = pe.vote_counts(
        pe.unit_rows(embed([t for t, _ in POISONED])[:, :8]), np.array([y for _, y in POISONED]), candidates
    )
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))  # the poison would change a fresh histogram
    out = tmp_path / "pe.jsonl"
    _copy_state(reference, out)
    for name in (
        "population0.json",
        "population1.json",
    ):  # only the noisy histograms (and run.json, the ledger) carry over
        (PEPaths(out).workdir / name).unlink()
    calls = []
    result = _run(lm, out, lambda: calls.append(1) or POISONED, resume=True)
    assert calls == [] and result.reused_histograms == 2
    assert out.read_bytes() == reference.read_bytes()


def test_a_resume_starts_at_the_latest_population_and_needs_no_earlier_one(
    lm, reference, tmp_path, monkeypatch
) -> None:
    """Another machine's resume holds the histograms and the latest population only (kept_runs): the run goes on
    from there, with no zero-shot population made again and no private read, to the uninterrupted output."""
    out = tmp_path / "pe.jsonl"
    _copy_state(reference, out)
    PEPaths(out).population(0).unlink()
    monkeypatch.setattr(pe, "zero_shot", lambda *a, **k: pytest.fail("population 0 is not needed"))
    result = _run(lm, out, lambda: pytest.fail("every histogram is saved"), resume=True)
    assert result.reused_histograms == 2 and out.read_bytes() == reference.read_bytes()
    PEPaths(out).histogram(0).unlink()
    with pytest.raises(UserError, match="histogram0.json is not"):
        _run(lm, out, lambda: list(PRIVATE), resume=True)


def test_resume_after_a_crash_reuses_every_histogram_and_never_redraws(lm, tmp_path, monkeypatch) -> None:
    out, drawn = tmp_path / "pe.jsonl", []
    real_noise, real_next = pe.noisy_histograms, pe.next_population
    monkeypatch.setattr(pe, "noisy_histograms", lambda counts, sigma: drawn.append(1) or real_noise(counts, sigma))

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pe, "next_population", crash)
    with pytest.raises(KeyboardInterrupt):
        _run(lm, out, lambda: list(PRIVATE))
    first = PEPaths(out).histogram(0).read_bytes()
    assert drawn == [1] and not out.exists()
    monkeypatch.setattr(pe, "next_population", real_next)
    result = _run(lm, out, lambda: list(PRIVATE), resume=True)
    assert drawn == [1, 1] and result.reused_histograms == 1
    assert PEPaths(out).histogram(0).read_bytes() == first
    assert len(result.privacy["ledger"]) == CONFIG.iterations
    again = _run(lm, out, lambda: pytest.fail("every histogram is saved"), resume=True)
    assert drawn == [1, 1] and again.reused_histograms == 2 and again.rows == result.rows


def test_a_run_killed_in_its_rewrites_resumes_after_the_classes_it_finished_with_the_same_output(
    lm, reference, tmp_path, monkeypatch
) -> None:
    """Killed while class 1 of iteration 1 is rewritten: class 0's rewrites come back from their journal (no
    generation), class 1's are written again, and the output is the uninterrupted run's; the journals go once
    the population is saved."""
    model, _ = lm
    monkeypatch.setattr(randomness.os, "urandom", lambda n: bytes(range(n)))  # the reference's noise key
    out, real = tmp_path / "pe.jsonl", pe.sample_many

    def killed_at_class_1(*args, journal=None, **kwargs):
        if journal == PEPaths(out).rewrites(1, 1):
            raise KeyboardInterrupt
        return real(*args, journal=journal, **kwargs)

    monkeypatch.setattr(pe, "sample_many", killed_at_class_1)
    with pytest.raises(KeyboardInterrupt):
        _run(lm, out, lambda: list(PRIVATE))
    assert PEPaths(out).rewrites(1, 0).exists() and not PEPaths(out).population(1).exists()
    generated: dict[str, int] = {}
    real_generate = model.generate

    def counted(*args, journal=None, **kwargs):
        calls = []
        monkeypatch.setattr(model, "generate", lambda *a, **k: calls.append(1) or real_generate(*a, **k))
        try:
            return real(*args, journal=journal, **kwargs)
        finally:
            monkeypatch.delattr(model, "generate")
            generated[journal.name] = len(calls)

    monkeypatch.setattr(pe, "sample_many", counted)
    result = _run(lm, out, lambda: list(PRIVATE), resume=True)
    assert generated["rewrites1-0.jsonl"] == 0 and generated["rewrites1-1.jsonl"] >= 1
    assert result.reused_histograms == 1 and out.read_bytes() == reference.read_bytes()
    assert not list(PEPaths(out).workdir.glob("rewrites*"))


def test_survivors_are_embedded_once_and_their_rows_are_bitwise_a_fresh_pass(lm) -> None:
    """The next population's survivors keep their rows (only the texts not embedded last time are embedded),
    and every class's matrix is bitwise the one a fresh fixed-shape pass over it gives."""
    model, tokenizer = lm
    embedded: list[str] = []

    def embed(texts):
        embedded.extend(texts)
        return pe.hidden_features(model, tokenizer, texts, "mean", max_length=16, fixed_shape=True)

    first = [[text for text, label in PRIVATE if label == k] for k in (0, 1)]
    second = [[first[0][1], "a new rewrite", "another rewrite of it"], [first[1][0], "a fresh, longer rewrite here"]]
    embedder = CandidateEmbedder(embed)
    embedder(first)
    embedded.clear()
    rows = embedder(second)
    assert embedded == ["a new rewrite", "another rewrite of it", "a fresh, longer rewrite here"]
    for texts, matrix in zip(second, rows):
        assert np.array_equal(matrix, pe.unit_rows(embed(texts)))


def test_every_embedding_pass_of_a_run_uses_fixed_shape_batches(lm, tmp_path, monkeypatch) -> None:
    """The private pass and every candidate pass: a row is then a function of its text alone, which the
    private side's votes need and the candidates' kept rows (:class:`CandidateEmbedder`) rely on."""
    real, shapes = pe.hidden_features, []
    monkeypatch.setattr(pe, "hidden_features", lambda *a, **k: shapes.append(k.get("fixed_shape")) or real(*a, **k))
    _run(lm, tmp_path / "pe.jsonl", lambda: list(PRIVATE))
    assert len(shapes) == 1 + CONFIG.iterations and all(shape is True for shape in shapes)


def test_a_run_killed_while_population_0_is_sampled_resumes_after_the_pieces_it_kept(
    lm, reference, tmp_path, monkeypatch, killed_at_call
) -> None:
    """Killed while class 1's zero-shot piece is sampled: class 0's piece comes back from the run folder (not
    sampled again), and the output is the uninterrupted run's; the pieces go once population 0 is saved."""
    monkeypatch.setattr(randomness.os, "urandom", lambda n: bytes(range(n)))  # the reference's noise key
    out, real = tmp_path / "pe.jsonl", baselines.sample_texts
    monkeypatch.setattr(baselines, "sample_texts", killed_at_call(real, at=2))
    with pytest.raises(KeyboardInterrupt):
        _run(lm, out, lambda: pytest.fail("no histogram is drawn before population 0 is made"))
    assert len(list(PEPaths(out).pieces().iterdir())) == 1 and not PEPaths(out).population(0).exists()
    monkeypatch.setattr(baselines, "sample_texts", counted := killed_at_call(real))
    result = _run(lm, out, lambda: list(PRIVATE), resume=True)
    assert counted.calls == 1 and result.reused_histograms == 0  # the one piece left, sampled once
    assert out.read_bytes() == reference.read_bytes() and not PEPaths(out).pieces().exists()


def test_a_run_shows_its_stages_with_public_counts_and_the_private_pass_without_one(
    lm, tmp_path, recorded_progress
) -> None:
    """T histograms, K·M zero-shot candidates, K·⌈M/(1+V)⌉·V rewrites per iteration after the first, each
    advanced to its total; the private examples are read inside a private task (no count, no total). A run on
    more private examples shows exactly the same public events: no public count depends on N."""
    config = PEConfig(iterations=3, population=3.0, variations=2, max_new_tokens=6, max_tokens=16, seed=3)
    private_task = ("PE: embedding the private examples", None, True)
    read = []

    def loader(rows, shown):
        def load_private():
            assert shown.opened[-1] == private_task and private_task[0] not in shown.finished  # read inside it
            read.append(len(rows))
            return rows

        return load_private

    _run(lm, tmp_path / "pe.jsonl", loader(list(PRIVATE), recorded_progress), config=config, progress=recorded_progress)
    m = config.candidates(2)  # 6 per class
    rewrites = 2 * config.survivors(m) * config.variations  # 2 classes · 2 survivors · 2 rewrites
    public = {description: total for description, total, private in recorded_progress.opened if not private}
    assert public == {
        "PE: noisy histograms": 3,
        "sampling 6 texts per class": 2 * m,
        "PE: rewrites 1/2": rewrites,
        "PE: rewrites 2/2": rewrites,
    }
    assert recorded_progress.advanced_by == public  # every public task counted up to its total, no further
    assert [entry for entry in recorded_progress.opened if entry[2]] == [private_task]
    more = type(recorded_progress)()
    larger = list(PRIVATE) + [("an unexpected delight", 1), ("a chore to sit through", 0), ("dull", 0)]
    _run(lm, tmp_path / "more.jsonl", loader(larger, more), config=config, progress=more)
    assert read == [4, 7] and more.public_view() == recorded_progress.public_view()


def test_an_existing_run_needs_resume_and_the_same_settings(lm, reference, tmp_path) -> None:
    out = tmp_path / "pe.jsonl"
    _copy_state(reference, out)
    with pytest.raises(UserError, match="--resume"):
        _run(lm, out, lambda: list(PRIVATE))
    with pytest.raises(UserError, match="epsilon"):
        _run(lm, out, lambda: list(PRIVATE), resume=True, epsilon=2.0)


def test_resume_refuses_another_model_or_private_cut(lm, reference, tmp_path) -> None:
    out = tmp_path / "pe.jsonl"
    _copy_state(reference, out)
    other = build_tiny_model("tiny-llama", seed=5)[0].requires_grad_(False), lm[1]
    with pytest.raises(UserError, match="model_fingerprint"):
        _run(other, out, lambda: pytest.fail("refused before the data is read"), resume=True)
    with pytest.raises(UserError, match="private_per_class"):
        _run(
            lm,
            out,
            lambda: pytest.fail("refused before the data is read"),
            resume=True,
            settings={"private_per_class": 1},
        )


def test_a_kill_during_the_private_pass_books_nothing_and_every_draw_is_booked_first(lm, tmp_path, monkeypatch) -> None:
    out = tmp_path / "pe.jsonl"

    def killed(*args):
        raise KeyboardInterrupt

    real_counts, real_noise = pe.vote_counts, pe.noisy_histograms
    monkeypatch.setattr(pe, "vote_counts", killed)
    with pytest.raises(KeyboardInterrupt):
        _run(lm, out, lambda: list(PRIVATE))
    assert not PEPaths(out).ledger.exists()  # nothing was drawn, so nothing is booked
    monkeypatch.setattr(pe, "vote_counts", real_counts)
    booked = []

    def noise(counts, sigma):  # at every draw the ledger already holds it, and no histogram lacks its entry
        booked.append(len(pe.Ledger.load(PEPaths(out).ledger)))
        assert not PEPaths(out).histogram(len(booked) - 1).exists()
        return real_noise(counts, sigma)

    monkeypatch.setattr(pe, "noisy_histograms", noise)
    result = _run(lm, out, lambda: list(PRIVATE), resume=True)
    assert booked == [1, 2] and len(result.privacy["ledger"]) == 2


def test_a_run_folder_in_use_is_refused(lm, tmp_path) -> None:
    out = tmp_path / "pe.jsonl"
    with claim(PEPaths(out).workdir / LOCK) as mine:  # another open file description: as another process would
        assert mine
        with pytest.raises(UserError, match="in use by another process"):
            _run(lm, out, lambda: pytest.fail("refused before the data is read"))
    assert not PEPaths(out).manifest.exists()
    assert _run(lm, out, lambda: list(PRIVATE)).rows  # free again once released


def test_rewrites_that_may_not_fit_the_context_are_refused_before_anything_is_read_or_drawn(lm, tmp_path) -> None:
    """The tiny model's context is 128 tokens: texts of 40 tokens and 40 new ones around the instruction may not
    fit, so the run is refused before the private pass (a rewrite would fail after the first histogram was drawn);
    the check lets through exactly the sizes that fit with its margin; one iteration writes no rewrites and runs."""
    model, tokenizer = lm
    out = tmp_path / "pe.jsonl"
    with pytest.raises(UserError, match="context is 128: lower max_new_tokens"):
        _run(lm, out, lambda: pytest.fail("refused before the data is read"), config=PEConfig(max_new_tokens=40))
    assert not PEPaths(out).workdir.exists()
    special = not tokenizer.chat_template  # as the check and sample_many encode a prompt
    instruction = max(
        len(tokenizer(pe.rewrite_prompt(tokenizer, CONFIG, n, ""), add_special_tokens=special)["input_ids"])
        for n in NAMES
    )
    fits = (128 - instruction - pe.REWRITE_MARGIN) // 2  # the largest max_new_tokens the check lets through
    assert CONFIG.max_new_tokens <= fits < 40
    pe.check_rewrite_context(model, tokenizer, NAMES, PEConfig(max_new_tokens=fits))
    with pytest.raises(UserError, match="lower max_new_tokens"):
        pe.check_rewrite_context(model, tokenizer, NAMES, PEConfig(max_new_tokens=fits + 1))
    one = PEConfig(iterations=1, max_new_tokens=40, max_tokens=16)
    assert len(_run(lm, tmp_path / "one.jsonl", lambda: list(PRIVATE), config=one).rows) == 4


def test_bad_settings_are_refused() -> None:
    with pytest.raises(UserError, match="iterations"):
        PEConfig(iterations=0)
    with pytest.raises(UserError, match="pooling"):
        PEConfig(pooling="max")
    with pytest.raises(UserError, match="text"):
        PEConfig(variation_instruction="no placeholder")
    assert PEConfig(population=2.0).candidates(5) == 10 and PEConfig(population=2.0, variations=3).survivors(10) == 3
    assert Sampling(max_new_tokens=6) == CONFIG.sampling


def test_the_noise_only_control_reads_nothing_private_spends_nothing_and_is_seeded(lm, tmp_path, monkeypatch) -> None:
    """Every histogram is the seeded pure noise at the DP run's σ: no private row is read (the loader fails), no
    ledger is written, the sidecar states ε = 0, and a second run (another folder) writes the same file."""
    monkeypatch.setattr(pe, "noisy_histograms", lambda *a: pytest.fail("the control draws no DP histogram"))
    results = [
        _run(lm, tmp_path / f"{name}.jsonl", lambda: pytest.fail("the control reads nothing private"), noise_only=True)
        for name in ("a", "b")
    ]
    paths = PEPaths(tmp_path / "a.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert not paths.ledger.exists()
    privacy = results[0].privacy
    sigma = noise_multiplier(4.0, 1e-5, CONFIG, 2, 2)
    assert privacy["noise_only"] and privacy["epsilon"] == 0.0 and privacy["epsilon_of_the_noise"] == 4.0
    assert privacy["noise_multiplier"] == sigma and "ledger" not in privacy
    for t in range(CONFIG.iterations):
        saved = json.loads(paths.histogram(t).read_text())["histograms"]
        assert saved == [h.tolist() for h in pe.noise_only_histograms([4, 4], sigma, CONFIG.seed, t)]
    last = [np.array(h) for h in saved]
    expected = [(k, float(v)) for k in (0, 1) for v in sorted(last[k], reverse=True)[:2]]
    assert [(r["label"], r["noisy_votes"]) for r in results[0].rows] == expected  # the top of the last noise
    assert all(r["noise_only"] and r["dp"] for r in results[0].rows)
    assert json.loads(paths.manifest.read_text())["noise_only"] is True  # a resume must repeat it


def test_the_noise_only_control_needs_the_epsilon_whose_noise_it_copies(lm, tmp_path) -> None:
    with pytest.raises(UserError, match="needs an epsilon"):
        _run(lm, tmp_path / "a.jsonl", lambda: list(PRIVATE), epsilon=None, noise_only=True)
    assert not PEPaths(tmp_path / "a.jsonl").workdir.exists()


def test_noise_only_histograms_are_seeded_per_iteration() -> None:
    a, b = pe.noise_only_histograms([3, 5], 2.0, 7, 0), pe.noise_only_histograms([3, 5], 2.0, 7, 1)
    assert [len(h) for h in a] == [3, 5]
    assert all(np.array_equal(x, y) for x, y in zip(a, pe.noise_only_histograms([3, 5], 2.0, 7, 0)))
    assert not np.array_equal(a[0], b[0])
    draws = np.concatenate([np.concatenate(pe.noise_only_histograms([1000], 2.0, 7, t)) for t in range(20)])
    assert abs(draws.std() - 2.0) < 0.05 and abs(draws.mean()) < 0.05  # N(0, σ²): 20,000 draws, 3.5 se and more
