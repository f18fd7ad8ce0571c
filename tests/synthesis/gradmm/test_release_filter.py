"""Generate–select's ``filter`` rule: the release's one-step head as a second label filter, then a seeded uniform
draw — checked against a forward pass of a model whose LM head holds the stepped rows (micro-batch of one), and
its step against the agreement of every step computed the same independent way."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from privlm.errors import UserError
from privlm.progress import SILENT
from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.gradmm import head_select
from privlm.synthesis.gradmm.config import make_config
from privlm.synthesis.gradmm.filtering import Candidate, uniform_draw
from privlm.synthesis.gradmm.generate import FILTER_STEP, load_batch
from privlm.synthesis.gradmm.pipeline import GradmmPaths, run_gradmm
from privlm.synthesis.gradmm.prompt import build_prompt
from privlm.synthesis.gradmm.release import Release, draw_release, head_fingerprint, private_factors
from privlm.synthesis.gradmm.release_filter import (
    STEPS,
    balanced_agreement,
    chosen_step,
    filter_select,
    label_rows_and_direction,
    stepped_rows,
)
from privlm.synthesis.gradmm.select import HIDDEN, select_matching

PRIVATE = [
    ("a delight from start to finish", 1),
    ("slow, dull and far too long", 0),
    ("I loved every minute of it", 1),
    ("one of the worst films of the year", 0),
    ("a warm and funny story", 1),
    ("the acting is wooden", 0),
]
TEXTS = ["fun", "boring plot", "great cast", "awful", "so good", "dull", "moving", "bad acting", "nice", "meh"]


@pytest.fixture(scope="module")
def lm():
    model, tokenizer = build_tiny_model("tiny-llama", seed=4, dtype=torch.float64)
    model.requires_grad_(False)
    return model, tokenizer, build_prompt(tokenizer, " It was ", ["bad", "great"], ["negative", "positive"])


def _release(lm, rows: str = "label-rows") -> Release:
    """A release without noise (dp False): its direction is the data's own, so the filter has something to find."""
    model, tokenizer, prompt = lm
    factors = private_factors(model, tokenizer, PRIVATE, prompt, max_tokens=16)
    kept = tuple(prompt.label_token_ids) if rows == "label-rows" else None
    return draw_release(model, prompt, factors, epsilon=None, delta=None, dp=False, rows=kept)


def _candidates(lm) -> list[Candidate]:
    _, tokenizer, _ = lm
    return [
        Candidate(ids=tuple(tokenizer.encode(t, add_special_tokens=False)), text=t, label=k, match_loss=None)
        for t in TEXTS
        for k in (0, 1)
    ]


def test_the_direction_is_the_summed_targets_on_the_label_rows_of_either_release(lm) -> None:
    model, _, prompt = lm
    start, direction = label_rows_and_direction(model, _release(lm))
    labels = list(prompt.label_token_ids)
    torch.testing.assert_close(start, model.get_output_embeddings().weight[labels].double())
    full_start, full_direction = label_rows_and_direction(model, _release(lm, "full"))
    torch.testing.assert_close(full_start, start)
    torch.testing.assert_close(full_direction, direction)
    assert direction.norm() > 0
    torch.testing.assert_close(stepped_rows(start, direction, 0.0), start)
    torch.testing.assert_close(stepped_rows(start, torch.zeros_like(direction), 2.0), start)
    step = start - stepped_rows(start, direction, 0.5)
    torch.testing.assert_close(step.norm(), 0.5 * start.norm())
    torch.testing.assert_close(step / step.norm(), direction / direction.norm())


def test_the_step_is_the_shortest_of_those_that_agree_best() -> None:
    """Zero-shot rows that call everything class 0; a direction that separates the classes from t ≈ 0.5 on."""
    start = torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    direction = torch.tensor([[0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)  # descent: row 1 gains +x₂
    hidden = torch.tensor([[1.0, -1.0], [1.0, -2.0], [1.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1])
    assert balanced_agreement(hidden @ start.T, labels, 2) == 0.5
    t = chosen_step(start, direction, hidden, labels)
    assert balanced_agreement(hidden @ stepped_rows(start, direction, t).T, labels, 2) == 1.0
    shorter = [s for s in STEPS if s < t]
    assert shorter and all(
        balanced_agreement(hidden @ stepped_rows(start, direction, s).T, labels, 2) < 1.0 for s in shorter
    )
    assert chosen_step(start, torch.zeros_like(direction), hidden, labels) == 0.0  # nothing to gain: no step


def test_filter_select_draws_among_the_candidates_a_head_with_the_stepped_rows_agrees_with(lm, head_votes) -> None:
    model, _, prompt = lm
    release = _release(lm)
    cands = _candidates(lm)
    predicted = [c.label if i % 5 else 1 - c.label for i, c in enumerate(cands)]  # the public filter drops some
    chosen, t = filter_select(model, release, cands, predicted, 3, seed=7)
    eligible = [c for c, p in zip(cands, predicted) if c.label == p]
    start, direction = label_rows_and_direction(model, release)
    labels = torch.tensor([c.label for c in eligible])
    agreements = []
    for s in STEPS:  # the step, read off independent forward passes
        votes = torch.tensor(head_votes(model, prompt, stepped_rows(start, direction, s), eligible))
        agreements.append(float(torch.stack([(votes[labels == k] == k).double().mean() for k in (0, 1)]).mean()))
    assert t == STEPS[max(range(len(STEPS)), key=lambda i: (agreements[i], -i))]
    votes = head_votes(model, prompt, stepped_rows(start, direction, t), eligible)
    agreed = [c for c, v in zip(eligible, votes) if v == c.label]
    assert 0 < len(agreed) < len(eligible)  # the head drops candidates the public filter kept
    expected = uniform_draw(agreed, [c.label for c in agreed], 3, 2, seed=7)
    assert chosen == expected and len(chosen) == 2 * min(3, *(sum(c.label == k for c in agreed) for k in (0, 1)))
    assert all(c.match_loss is None for c in chosen)
    assert filter_select(model, release, cands, predicted, 3, seed=8)[0] != chosen


def test_a_release_drawn_for_another_head_is_read_on_its_own_rows(lm) -> None:
    """The filter reads the release's rows by token id, not by position: rows stored in another order give the
    same direction."""
    model, _, prompt = lm
    release = _release(lm)
    swapped = Release(
        targets=release.targets.flip(1),
        prompt=release.prompt,
        dp=False,
        epsilon=None,
        delta=None,
        noise_multiplier=None,
        clip=release.clip,
        max_tokens=release.max_tokens,
        model_fingerprint=head_fingerprint(model),
        rows=tuple(reversed(release.rows)),
    )
    torch.testing.assert_close(label_rows_and_direction(model, swapped)[1], label_rows_and_direction(model, release)[1])


def test_bad_selections_are_refused() -> None:
    with pytest.raises(UserError, match="--selection 'vote' is not one of match, filter"):
        make_config("instruct", selection="vote")
    with pytest.raises(UserError, match="--selection filter needs --optimizer select"):
        make_config("paper", selection="filter")


def test_a_class_the_head_gives_no_candidate_is_refused(lm, monkeypatch) -> None:
    """Candidates that all look alike to the head: every step gives them one class, so the set would be empty."""
    model, _, _ = lm
    release = _release(lm)
    cands = _candidates(lm)
    same = torch.ones(model.config.hidden_size, dtype=torch.float64)
    monkeypatch.setattr(head_select, "candidate_hidden", lambda m, p, c, **k: same.expand(len(c), -1).clone())
    with pytest.raises(
        UserError, match="gives class .(negative|positive). to none of its 10 label-filtered candidates"
    ):
        filter_select(model, release, cands, [c.label for c in cands], 3, seed=0)


def test_a_filter_run_is_a_function_of_its_release_and_records_its_step(lm, tmp_path, recorded_progress) -> None:
    """The whole pipeline with ``selection = "filter"``: the rows are the filter's choice among the run's own
    candidates, the step is written beside the batches, and a run resumed from a copy of the release reproduces
    the set byte for byte without reading the (poisoned) private data."""
    model, tokenizer, prompt = lm
    config = make_config("demo", optimizer="select", selection="filter", label_filter=False, oversample=10.0, seed=3)

    def run(out, load, progress=SILENT):
        return run_gradmm(
            model,
            tokenizer,
            prompt,
            load,
            out=out,
            per_class=2,
            config=config,
            dp=False,
            epsilon=None,
            delta=None,
            resume=out.name == "b.jsonl",
            progress=progress,
        )

    first = run(tmp_path / "a.jsonl", lambda: list(PRIVATE), recorded_progress)
    paths = GradmmPaths(tmp_path / "a.jsonl")
    cands = [c for f in sorted(paths.batches.glob("class*.json")) for c in load_batch(f)]
    assert (HIDDEN, len(cands), False) in recorded_progress.opened  # no label filter here: every candidate
    chosen, t = filter_select(model, first.release, cands, [c.label for c in cands], 2, seed=3)
    assert [(r["text"], r["label"]) for r in first.rows] == [(c.text, c.label) for c in chosen] and len(chosen) == 4
    assert json.loads((paths.batches / FILTER_STEP).read_text()) == {"step": t}
    again = GradmmPaths(tmp_path / "b.jsonl")
    again.workdir.mkdir(parents=True)
    for name in ("release.pt", "run.json"):
        shutil.copy(paths.workdir / name, again.workdir / name)
    second = run(tmp_path / "b.jsonl", lambda: pytest.fail("the release must be reused"))
    assert second.reused_release and (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()


def test_a_class_the_public_filter_leaves_empty_is_named_as_such(lm) -> None:
    _, _, prompt = lm
    cands = _candidates(lm)
    pool = [[c for c in cands if c.label == 0], []]
    hidden = [torch.zeros(len(pool[0]), 4, dtype=torch.float64), torch.zeros(0, 4, dtype=torch.float64)]
    with pytest.raises(UserError, match="the public label filter keeps no candidate of class 'positive'"):
        head_select.head_draw(torch.eye(2, 4, dtype=torch.float64), pool, hidden, 2, 0, prompt, "a head")


@pytest.mark.parametrize("rule", ["match", "filter"])
def test_the_selections_forward_pass_counts_the_candidates_the_label_filter_keeps(
    lm, recorded_progress, rule: str
) -> None:
    """Both selection rules show their forward pass over the candidates, counted over those the public label filter
    keeps (generated for a class and predicted as it), not over every candidate."""
    model, _, _ = lm
    release, cands = _release(lm), _candidates(lm)
    predicted = [c.label if i % 3 else 1 - c.label for i, c in enumerate(cands)]  # the filter drops every third
    eligible = sum(p == c.label for c, p in zip(cands, predicted, strict=True))
    assert 0 < eligible < len(cands)
    if rule == "match":
        select_matching(model, release, cands, predicted, 3, progress=recorded_progress)
    else:
        filter_select(model, release, cands, predicted, 3, seed=0, progress=recorded_progress)
    assert recorded_progress.opened == [(HIDDEN, eligible, False)]
    assert recorded_progress.advanced_by == {HIDDEN: eligible} and recorded_progress.finished == [HIDDEN]
