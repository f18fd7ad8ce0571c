"""Loss-based membership inference: ROC statistics against scipy's two-sample tests; ≈0 vs ≈1."""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy import stats

from privlm.errors import UserError
from privlm.evaluation.mia import attack_from_losses, example_losses, membership_inference
from privlm.lm.finetune import finetune_classifier
from privlm.lm.finetune_config import preset
from privlm.lm.scoring import option_scores
from privlm.resources.tiny import build_tiny_model

SUFFIX = " It was "


@pytest.mark.parametrize("seed", range(5))
def test_advantage_is_the_ks_statistic_and_auc_the_mann_whitney_fraction(seed: int) -> None:
    rng = np.random.default_rng(seed)
    members = rng.normal(-0.3, 1.0, size=int(rng.integers(20, 200)))
    nonmembers = rng.normal(0.0, 1.2, size=int(rng.integers(20, 200)))
    got = attack_from_losses(members, nonmembers)
    # max over thresholds of |TPR - FPR| = sup |F_members - F_nonmembers| for continuous losses
    assert got.advantage == pytest.approx(stats.ks_2samp(members, nonmembers).statistic, abs=1e-12)
    # AUC = P(member loss < non-member loss)
    u = stats.mannwhitneyu(nonmembers, members).statistic
    assert got.auc == pytest.approx(u / (members.size * nonmembers.size), abs=1e-12)


def test_identically_distributed_members_and_nonmembers_give_no_advantage() -> None:
    rng = np.random.default_rng(0)
    got = attack_from_losses(rng.gamma(2.0, size=2000), rng.gamma(2.0, size=2000))
    # KS critical value at level 0.001 for 2000 vs 2000: 1.95 * sqrt(2 / 2000) = 0.062
    assert got.advantage < 0.062
    assert abs(got.auc - 0.5) < 0.04
    assert (got.n_members, got.n_nonmembers) == (2000, 2000)


def test_separated_losses_give_full_advantage_and_empty_input_is_refused() -> None:
    got = attack_from_losses(np.array([0.01, 0.02, 0.03]), np.array([0.5, 0.7, 0.9]))
    assert got.advantage == 1.0 and got.auc == 1.0
    with pytest.raises(UserError):
        attack_from_losses(np.array([]), np.array([1.0]))


# Single-token words of the tiny tokenizer, used as 16 class labels.
MANY_WORDS = "great good the of and to in is it was for on with as be one".split()


def random_examples(n: int, seed: int) -> list[tuple[str, int]]:
    """Random word strings with random labels out of 16: only memorization can fit them."""
    rng = random.Random(seed)
    vocab = "the film plot cast story warm dull slow smart long world water house light picture".split()
    return [(" ".join(rng.choices(vocab, k=6)), rng.randrange(len(MANY_WORDS))) for _ in range(n)]


def test_memorizing_tiny_model_is_detected() -> None:
    """An overfit model is confident on members; a non-member only scores as well by a lucky guess
    of its random label (probability 1/16 each), so the advantage is near 1 but not forced to be."""
    model, tok = build_tiny_model("tiny-llama", seed=0)
    members, nonmembers = random_examples(16, 10), random_examples(16, 20)
    memorized = finetune_classifier(model, tok, members, SUFFIX, MANY_WORDS, preset("tiny", epochs=40, lr=1e-2)).model
    losses = example_losses(memorized, tok, members, SUFFIX, MANY_WORDS)
    scores = option_scores(memorized, tok, [t for t, _ in members], SUFFIX, MANY_WORDS)
    np.testing.assert_allclose(losses, -scores[np.arange(16), [y for _, y in members]])
    result = membership_inference(memorized, tok, members, nonmembers, SUFFIX, MANY_WORDS)
    assert result.advantage >= 0.85 and result.auc >= 0.9, result
