"""Every optimizer (ADMM, generate–select) and the noise-only control behind the wall: the output is a
function of (release, public inputs, seed) — deterministic, resumable without a new draw, and blind to
the private data once the release exists (poison test)."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from privlm.errors import UserError
from privlm.privacy.calibration import gaussian_releases_epsilon
from privlm.progress import Task
from privlm.resources.datasets import BUILTIN
from privlm.resources.tiny import build_tiny_model
from privlm.resources.verbalizers import generic_verbalizer
from privlm.synthesis.gradmm import generate
from privlm.synthesis.gradmm.config import make_config
from privlm.synthesis.gradmm.filtering import Candidate
from privlm.synthesis.gradmm.matching import per_example_matching_loss
from privlm.synthesis.gradmm.pipeline import GradmmPaths, run_gradmm
from privlm.synthesis.gradmm.prompt import build_prompt, head_logits
from privlm.synthesis.gradmm.select import HIDDEN, candidate_factors, candidate_hidden, greedy_match

PRIVATE = [
    ("the movie was a delight from start to finish", 1),
    ("slow, dull and far too long", 0),
    ("a warm, funny and moving story with a wonderful cast", 1),
    ("the plot makes no sense and the acting is wooden", 0),
]
POISONED = [("POISON " * 5 + text[::-1], 1 - label) for text, label in PRIVATE]
SETTINGS = {
    "admm": {"optimizer": "admm"},
    "select": {"optimizer": "select", "oversample": 3.0},
    "admm-full": {"optimizer": "admm", "release": "full"},
    "admm-noise": {"optimizer": "admm", "noise_only": True},
    "select-noise": {"optimizer": "select", "oversample": 3.0, "noise_only": True},
    "select-contrastive": {"optimizer": "select", "oversample": 3.0, "contrastive": True},
    "select-instruct": {"optimizer": "select", "source": "instruct", "contrastive": True},
    "select-instruct-noise": {"optimizer": "select", "source": "instruct", "noise_only": True},
}


@pytest.fixture(scope="module")
def lm():
    model, tokenizer = build_tiny_model("tiny-llama", seed=2)
    model.requires_grad_(False)
    return model, tokenizer, build_prompt(tokenizer, " It was ", ["bad", "great"], ["negative", "positive"])


def _config(name: str):
    return make_config(
        "demo",
        length=4,
        batch=3,
        outer_steps=2,
        inner_steps=2,
        top_k=8,
        seed=1,
        label_filter=False,
        **{"oversample": 2.0, **SETTINGS[name]},
    )


def _run(lm, out: Path, name: str, load_private, overrides: dict | None = None, **kwargs):
    model, tokenizer, prompt = lm
    return run_gradmm(
        model,
        tokenizer,
        prompt,
        load_private,
        out=out,
        per_class=2,
        config=replace(_config(name), **(overrides or {})).validated(),
        dp=True,
        epsilon=4.0,
        delta=1e-5,
        **kwargs,
    )


def _copy_release(src: Path, dst: Path) -> None:
    GradmmPaths(dst).workdir.mkdir(parents=True)
    for name in ("release.pt", "run.json"):
        shutil.copy(GradmmPaths(src).workdir / name, GradmmPaths(dst).workdir / name)


def _first_draw(lm, out: Path, name: str):
    load = (
        (lambda: pytest.fail("the noise-only control must not read data"))
        if "noise" in name
        else (lambda: list(PRIVATE))
    )
    return _run(lm, out, name, load)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_output_is_a_function_of_the_release_and_blind_to_poison(lm, tmp_path, name: str) -> None:
    first = _first_draw(lm, tmp_path / "a.jsonl", name)
    assert len(first.rows) == 4
    _copy_release(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    calls = []
    again = _run(lm, tmp_path / "b.jsonl", name, lambda: calls.append(1) or POISONED, resume=True)
    assert again.reused_release and calls == []
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_resume_after_a_crash_between_batches_needs_no_new_draw(
    lm, tmp_path, monkeypatch, killed_at_call, name: str
) -> None:
    _first_draw(lm, tmp_path / "a.jsonl", name)
    _copy_release(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    real = generate.generate_batch
    monkeypatch.setattr(generate, "generate_batch", killed_at_call(real, at=2))
    with pytest.raises(KeyboardInterrupt):
        _run(lm, tmp_path / "b.jsonl", name, lambda: pytest.fail("the release must be reused"), resume=True)
    monkeypatch.setattr(generate, "generate_batch", real)
    _run(lm, tmp_path / "b.jsonl", name, lambda: pytest.fail("the release must be reused"), resume=True)
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()


def test_noise_only_control_spends_nothing_and_says_so(lm, tmp_path) -> None:
    result = _first_draw(lm, tmp_path / "a.jsonl", "select-noise")
    privacy = json.loads(GradmmPaths(tmp_path / "a.jsonl").sidecar.read_text())
    assert privacy["noise_only"] and privacy["epsilon"] == 0.0
    assert privacy["noise_multiplier"] == result.release.noise_multiplier > 0
    assert not GradmmPaths(tmp_path / "a.jsonl").ledger.exists()
    assert all(row["noise_only"] for row in result.rows)


def test_sidecar_reports_the_released_dimension(lm, tmp_path) -> None:
    model, _, prompt = lm
    _first_draw(lm, tmp_path / "a.jsonl", "admm")
    privacy = json.loads(GradmmPaths(tmp_path / "a.jsonl").sidecar.read_text())
    d = model.get_output_embeddings().weight.shape[1]
    assert privacy["released_rows"] == list(prompt.label_token_ids) and privacy["released_dim_per_class"] == 2 * d
    assert privacy["noise_norm_per_class"] == pytest.approx(privacy["noise_multiplier"] * (2 * d) ** 0.5)
    slack = 2 * (2 * 2 * d * 2**8) * 2.0**-34  # 2dη of the snapped release (clamp 2¹⁶: 2⁸ times the default's η)
    # σ is calibrated with the slack inside the budget: the report is the requested ε, and the Gaussian
    # part alone leaves room for the slack
    assert privacy["epsilon"] == privacy["epsilon_target"]
    gaussian_part = gaussian_releases_epsilon(privacy["noise_multiplier"], 1, privacy["delta"], 0)
    assert gaussian_part <= privacy["epsilon_target"] - slack * 0.999


def test_greedy_match_equals_greedy_on_explicit_vectors() -> None:
    gen = torch.Generator().manual_seed(0)
    vectors = torch.randn(12, 7, generator=gen, dtype=torch.float64)
    target = torch.randn(7, generator=gen, dtype=torch.float64)
    chosen, total = [], torch.zeros(7, dtype=torch.float64)
    for _ in range(5):
        scores = [
            -torch.inf if j in chosen else float(torch.nn.functional.cosine_similarity(total + v, target, dim=0))
            for j, v in enumerate(vectors)
        ]
        chosen.append(max(range(12), key=lambda j: scores[j]))
        total = total + vectors[chosen[-1]]
    assert greedy_match(vectors @ vectors.T, vectors @ target, 5) == chosen


def test_contrastive_greedy_match_equals_greedy_on_explicit_vectors() -> None:
    gen = torch.Generator().manual_seed(1)
    own, other = (torch.randn(10, 6, generator=gen, dtype=torch.float64) for _ in range(2))
    targets = torch.randn(2, 6, generator=gen, dtype=torch.float64)
    cos = torch.nn.functional.cosine_similarity
    chosen, totals = [], torch.zeros(2, 6, dtype=torch.float64)
    for _ in range(4):

        def score(j: int, totals: torch.Tensor = totals) -> float:
            return float(cos(totals[0] + own[j], targets[0], dim=0) - cos(totals[1] + other[j], targets[1], dim=0))

        chosen.append(max((j for j in range(10) if j not in chosen), key=score))
        totals = totals + torch.stack([own[chosen[-1]], other[chosen[-1]]])
    gram = torch.stack([own @ own.T, other @ other.T])
    inner = torch.stack([own @ targets[0], other @ targets[1]])
    assert greedy_match(gram, inner, 4) == chosen
    assert greedy_match(gram[0], inner[0], 4) != chosen  # the rival term matters here


def test_greedy_match_chooses_the_same_set_when_every_target_is_scaled_alike() -> None:
    """So a noise-only control's choice depends on the noise's direction, not on σ: its cells at different ε
    are draws of one control."""
    gen = torch.Generator().manual_seed(2)
    own, other = (torch.randn(30, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    targets = torch.randn(2, 8, generator=gen, dtype=torch.float64)
    gram = torch.stack([own @ own.T, other @ other.T])
    inner = torch.stack([own @ targets[0], other @ targets[1]])
    chosen = greedy_match(gram, inner, 10)
    for scale in (1 / 3.9, 31.0):
        assert greedy_match(gram, scale * inner, 10) == chosen
    assert greedy_match(gram, inner * torch.tensor([[1.0], [3.0]], dtype=torch.float64), 10) != chosen  # norms weigh


@pytest.mark.parametrize("name", ["select", "select-contrastive", "select-instruct"])
def test_generate_select_scores_only_the_candidates_it_keeps(
    lm, tmp_path, monkeypatch, recorded_progress, name: str
) -> None:
    """Generate–select runs no forward pass per candidate batch (its batches stay unscored); each kept row's
    ``match_loss`` is the per-example matching loss of an independent forward pass of its tokens. The
    selection's one forward pass over the candidates is shown, counted candidate by candidate (public)."""
    model, _, prompt = lm
    forward = generate.last_hidden_from_ids
    monkeypatch.setattr(generate, "last_hidden_from_ids", lambda *a, **k: pytest.fail("a batch was scored"))
    result = _run(lm, tmp_path / "a.jsonl", name, lambda: list(PRIVATE), progress=recorded_progress)
    batches = [json.loads(p.read_text()) for p in GradmmPaths(tmp_path / "a.jsonl").batches.iterdir()]
    assert batches and all(c["match_loss"] is None for batch in batches for c in batch)
    candidates = sum(len(batch) for batch in batches)  # no label filter here: every candidate is eligible
    assert (HIDDEN, candidates, False) in recorded_progress.opened
    assert recorded_progress.advanced_by[HIDDEN] == candidates and HIDDEN in recorded_progress.finished
    ids = {c["text"]: c["ids"] for batch in batches for c in batch}
    release = result.release
    assert len(result.rows) == 4
    for row in result.rows:
        label = row["label"]
        hidden = forward(model, [[*prompt.prefix_ids, *ids[row["text"]], *prompt.suffix_ids]])
        logits = head_logits(model, hidden).to(torch.float64)
        target = release.targets[label].to(torch.float64)
        expected = per_example_matching_loss(
            hidden.to(torch.float64), logits, prompt.label_token_ids[label], target, release.rows
        )
        assert row["match_loss"] == pytest.approx(float(expected), rel=1e-4, abs=1e-6)


def test_candidate_factors_give_the_inner_products_of_the_formed_gradients(lm) -> None:
    _, tokenizer, prompt = lm
    model, _ = build_tiny_model("tiny-llama", seed=2, dtype=torch.float64)
    cands = [Candidate(ids=tuple(tokenizer.encode(t)[:5]), text=t, label=0, match_loss=0.0) for t, _ in PRIVATE]
    rows = prompt.label_token_ids
    (resid, other), hidden = candidate_factors(model, prompt, cands, [0, 1], rows)
    assert not torch.equal(resid, other)  # one forward pass, a residual per label
    formed = torch.stack([torch.outer(r, h) for r, h in zip(resid, hidden)])  # M × |R| × d
    target = torch.randn(len(rows), hidden.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    flat = formed.flatten(1)
    torch.testing.assert_close((resid @ resid.T) * (hidden @ hidden.T), flat @ flat.T)
    torch.testing.assert_close((resid * (hidden @ target.T)).sum(1), flat @ target.flatten())


def test_instructed_candidates_are_public_and_shared_between_releases(lm, tmp_path, monkeypatch) -> None:
    """Instructed candidates depend on (model, instruction, seed) only: a run with another release (here the
    noise-only control) reads them from ``public_dir`` instead of generating them again, and selects among
    exactly the same texts."""
    public = tmp_path / "public"
    dp = _run(lm, tmp_path / "dp.jsonl", "select-instruct", lambda: list(PRIVATE), public_dir=public)
    files = sorted(p.name for p in public.iterdir())
    candidate_files = [f for f in files if f.startswith("class")]
    assert len(candidate_files) == 2 * 2  # 2 classes x ceil(2 per class x oversample 2 / batch 3) batches
    monkeypatch.setattr(generate, "sample_texts", lambda *a, **k: pytest.fail("public candidates must be reused"))
    noise = _run(
        lm,
        tmp_path / "noise.jsonl",
        "select-instruct-noise",
        lambda: pytest.fail("the noise-only control must not read data"),
        public_dir=public,
    )
    pooled = {json.dumps(ids) for f in candidate_files for ids in json.loads((public / f).read_text())}
    for rows in (dp.rows, noise.rows):
        assert rows and all(r["text"] for r in rows)
    batches = [json.loads(p.read_text()) for p in GradmmPaths(tmp_path / "noise.jsonl").batches.iterdir()]
    assert {json.dumps(list(c["ids"])) for b in batches for c in b} == pooled
    assert sorted(p.name for p in public.iterdir()) == files


def test_a_pool_seed_shares_the_public_candidates_between_seeds(lm, tmp_path, monkeypatch) -> None:
    """``pool_seed``: runs of other seeds select from one public pool (the candidate files of the first run are
    read, none generated); without it each seed draws its own candidates."""

    def run(out: Path, public: Path, **overrides):
        _run(lm, out, "select-instruct", lambda: list(PRIVATE), overrides, public_dir=public)
        return {p.name: p.read_text() for p in public.iterdir() if p.name.startswith("class")}

    pooled = run(tmp_path / "s1.jsonl", tmp_path / "pool", seed=1, pool_seed=7)
    own = run(tmp_path / "own.jsonl", tmp_path / "own", seed=2)
    assert pooled and own and set(own).isdisjoint(pooled)  # another seed, other candidates
    monkeypatch.setattr(generate, "sample_texts", lambda *a, **k: pytest.fail("the shared pool must be reused"))
    assert run(tmp_path / "s2.jsonl", tmp_path / "pool", seed=2, pool_seed=7) == pooled
    with pytest.raises(UserError, match="pool_seed"):
        replace(_config("select-instruct"), pool_seed=-1).validated()


def test_public_labels_are_computed_once_per_candidate_set(lm, tmp_path, monkeypatch) -> None:
    """The label filter's verdicts on public candidates are kept in ``public_dir`` and reused; another
    candidate set (other texts) gets its own."""
    model, tokenizer, prompt = lm
    cands = [
        Candidate(ids=(1, 2), text=t, label=i % 2, match_loss=0.0)
        for i, t in enumerate(["a good film", "dull", "fine"])
    ]
    first = generate.public_labels(model, tokenizer, prompt, cands, tmp_path)
    assert first == generate.few_shot_labels(model, tokenizer, prompt, [c.text for c in cands])
    monkeypatch.setattr(generate, "few_shot_labels", lambda *a, **k: pytest.fail("public labels must be reused"))
    assert generate.public_labels(model, tokenizer, prompt, cands, tmp_path) == first
    with pytest.raises(pytest.fail.Exception):
        generate.public_labels(model, tokenizer, prompt, cands[:2], tmp_path)
    assert len(list(tmp_path.glob("labels-*.json"))) == 1


def test_public_labels_are_kept_in_pieces_a_longer_pool_reuses(lm, tmp_path, monkeypatch) -> None:
    """Pieces of CHUNK candidates: the labels are those of one pass, a pool that extends another reads the
    other's full pieces and computes only the rest (so an interrupted pass over a large pool resumes)."""
    model, tokenizer, prompt = lm
    texts = ["a good film", "dull", "fine", "the best of the year", "slow", "warm and funny", "bad", "sharp"]
    cands = [Candidate(ids=(1, 2), text=t, label=i % 2, match_loss=0.0) for i, t in enumerate(texts)]
    whole = generate.few_shot_labels(model, tokenizer, prompt, texts, batch_size=2)
    monkeypatch.setattr(generate, "CHUNK", 2)
    real = generate.few_shot_labels
    monkeypatch.setattr(generate, "few_shot_labels", lambda m, t, p, part: real(m, t, p, part, batch_size=2))
    assert generate.public_labels(model, tokenizer, prompt, cands[:5], tmp_path) == whole[:5]
    assert len(list(tmp_path.glob("labels-*.json"))) == 3  # [0, 2), [2, 4), [4, 5)
    asked: list[list[str]] = []
    monkeypatch.setattr(generate, "few_shot_labels", lambda m, t, p, part: asked.append(part) or real(m, t, p, part))
    assert generate.public_labels(model, tokenizer, prompt, cands, tmp_path) == whole
    assert asked == [texts[4:6], texts[6:8]]  # the first two pieces were read, not computed


def test_candidate_hidden_states_are_kept_once_and_give_bitwise_the_same_factors(lm, tmp_path, monkeypatch) -> None:
    from privlm.synthesis.gradmm import select as select_module

    model, tokenizer, prompt = lm
    cands = [
        Candidate(ids=tuple(tokenizer.encode(t, add_special_tokens=False)), text=t, label=0, match_loss=0.0)
        for t in ["a good film", "dull and slow", "fine", "the best of the year"]
    ]
    plain = candidate_factors(model, prompt, cands, [0, 1], None, batch_size=3)
    kept = candidate_factors(model, prompt, cands, [0, 1], None, batch_size=3, public_dir=tmp_path)
    monkeypatch.setattr(
        select_module, "last_hidden_from_ids", lambda *a, **k: pytest.fail("hidden states must be reused")
    )
    reused = candidate_factors(model, prompt, cands, [0, 1], None, batch_size=3, public_dir=tmp_path)
    for other in (kept, reused):
        assert all(torch.equal(a, b) for a, b in zip(plain[0], other[0])) and torch.equal(plain[1], other[1])
    assert len(list(tmp_path.glob("hidden-*.pt"))) == 1
    monkeypatch.undo()
    monkeypatch.setattr(select_module, "CHUNK", 4)  # pieces of 3 candidates (the batch size): bitwise one pass
    pieces = candidate_factors(model, prompt, cands, [0, 1], None, batch_size=3, public_dir=tmp_path / "pieces")
    assert all(torch.equal(a, b) for a, b in zip(plain[0], pieces[0])) and torch.equal(plain[1], pieces[1])
    assert len(list((tmp_path / "pieces").glob("hidden-*.pt"))) == 2


def test_candidate_hidden_counts_each_candidate_once_computed_or_read(lm, tmp_path, monkeypatch) -> None:
    """The forward pass's task advances by every candidate, batch by batch when computed and piece by piece
    when a kept piece is read: in all, the number of candidates, whichever way each was obtained."""
    from privlm.synthesis.gradmm import select as select_module

    model, tokenizer, prompt = lm
    cands = [
        Candidate(ids=tuple(tokenizer.encode(t, add_special_tokens=False)), text=t, label=0, match_loss=0.0)
        for t in ["a good film", "dull and slow", "fine", "the best of the year"]
    ]

    class Counted(Task):
        def __init__(self) -> None:
            self.steps: list[float] = []

        def advance(self, amount: float = 1) -> None:
            self.steps.append(amount)

    def counted(**kwargs) -> list[float]:
        task = Counted()
        candidate_hidden(model, prompt, cands, batch_size=3, task=task, **kwargs)
        return task.steps

    assert counted() == [3, 1]  # computed, batch by batch
    assert counted(public_dir=tmp_path) == [3, 1]  # computed, then kept as one piece
    assert counted(public_dir=tmp_path) == [4]  # the kept piece read
    monkeypatch.setattr(select_module, "CHUNK", 4)  # pieces of 3 candidates
    assert counted(public_dir=tmp_path / "pieces") == [3, 1]
    assert counted(public_dir=tmp_path / "pieces") == [3, 1]  # two kept pieces read


def test_instruct_source_needs_select_and_an_instruction_naming_the_class() -> None:
    with pytest.raises(UserError, match="--optimizer select"):
        make_config("demo", source="instruct", optimizer="admm")
    for bad, fragment in (
        ("Write a review.", "{label_name} or {label_word}"),
        ("Write a {kind} review.", "{kind}"),
        ("Write a {label_name review.", "not a valid template"),
    ):
        with pytest.raises(UserError, match=re.escape(fragment)):
            make_config("demo", source="instruct", optimizer="select", instruction=bad)
    for good in ("Write a {label_word} review.", "Write a {label_name} text like {prompt} {label_word}."):
        assert make_config("demo", source="instruct", optimizer="select", instruction=good).instruction == good


def test_rotten_tomatoes_instructions_are_zero_shots_default_unchanged(lm) -> None:
    """The built-in rotten-tomatoes verbalizer has no instruction: its instructed candidates answer exactly
    the instruction they always did, and the config (the run's settings, the candidate cache key) is as before."""
    _, tokenizer, _ = lm
    verbalizer, names = BUILTIN["rotten-tomatoes"][1], ("negative", "positive")
    prompt = build_prompt(tokenizer, verbalizer.template, verbalizer.label_words, names)
    plain = make_config("demo", source="instruct", optimizer="select")
    config = replace(plain, instructions=verbalizer.instructions(names))
    assert config == plain and config.to_dict() == {**plain.to_dict(), "instructions": None}
    assert generate.instructions_for(prompt, config) == [
        "Write one short negative movie review sentence.",
        "Write one short positive movie review sentence.",
    ]


def test_user_data_instructions_are_the_verbalizers_and_the_users_fields_are_filled(lm) -> None:
    _, tokenizer, _ = lm
    names = ("neg", "pos")
    verbalizer = generic_verbalizer(names, ("bad", "good"))
    prompt = build_prompt(tokenizer, verbalizer.template, verbalizer.label_words, names)
    config = replace(
        make_config("demo", source="instruct", optimizer="select"), instructions=verbalizer.instructions(names)
    )
    assert generate.instructions_for(prompt, config) == [
        'Write one short text for "... Label: bad".',
        'Write one short text for "... Label: good".',
    ]
    own = make_config("demo", source="instruct", optimizer="select", instruction="{label_name}: a {label_word} text")
    assert replace(own, instructions=("ignored", "ignored")).instructions is None  # the user's instruction wins
    assert generate.instructions_for(prompt, own) == ["neg: a bad text", "pos: a good text"]
    assert replace(make_config("demo"), instructions=("a", "b")).instructions is None  # unused by source "sample"
    with pytest.raises(UserError, match="1 instructions for 2 classes"):
        generate.instructions_for(prompt, replace(config, instructions=("one",)))
