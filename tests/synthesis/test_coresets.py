"""Coreset selections against brute-force definitions on small inputs; last-token features."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from privlm.errors import UserError
from privlm.lm.features import hidden_features, last_token_features
from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.coresets.selection import herding, k_center_greedy, select_per_class


def brute_herding(x: np.ndarray, k: int) -> list[int]:
    """Definition: each step tries every unpicked point and keeps the subset whose mean is closest to μ."""
    mu = x.mean(axis=0)
    chosen: list[int] = []
    for _ in range(k):
        best, best_gap = None, np.inf
        for i in range(len(x)):
            if i in chosen:
                continue
            gap = np.linalg.norm(mu - x[chosen + [i]].mean(axis=0))
            if gap < best_gap:
                best, best_gap = i, gap
        chosen.append(best)
    return chosen


def brute_k_center(x: np.ndarray, k: int, first: int) -> list[int]:
    """Definition: each step adds the point whose distance to its nearest center is largest."""
    chosen = [first]
    for _ in range(k - 1):
        far = max(range(len(x)), key=lambda i: (min(np.linalg.norm(x[i] - x[c]) for c in chosen), -i))
        chosen.append(far)
    return chosen


def radius(x: np.ndarray, centers: list[int]) -> float:
    return max(min(np.linalg.norm(p - x[c]) for c in centers) for p in x)


@pytest.mark.parametrize("seed", range(12))
def test_herding_equals_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(int(rng.integers(5, 15)), int(rng.integers(1, 6))))
    k = int(rng.integers(1, len(x) + 1))
    assert herding(x, k) == brute_herding(x, k)


@pytest.mark.parametrize("seed", range(12))
def test_k_center_greedy_equals_brute_force_and_is_a_2_approximation(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    x = rng.normal(size=(int(rng.integers(5, 11)), int(rng.integers(1, 4))))
    k = int(rng.integers(1, 5))
    got = k_center_greedy(x, k, seed)
    assert got[0] == int(np.random.default_rng(seed).integers(len(x)))
    assert got == brute_k_center(x, k, got[0])
    optimum = min(radius(x, list(c)) for c in itertools.combinations(range(len(x)), k))
    assert radius(x, got) <= 2 * optimum + 1e-12


def test_herding_of_the_whole_set_is_a_permutation() -> None:
    x = np.random.default_rng(0).normal(size=(9, 3))
    assert sorted(herding(x, 9)) == list(range(9))


def test_select_per_class_stays_within_classes_and_is_seeded() -> None:
    rng = np.random.default_rng(1)
    labels = np.array([0] * 7 + [1] * 5 + [2] * 6)
    rng.shuffle(labels)
    x = rng.normal(size=(len(labels), 4))
    for method in ("random", "herding", "k-center"):
        picks = select_per_class(method, x, labels, 3, seed=4)
        assert len(set(picks)) == 9
        assert sorted(labels[picks].tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
        assert picks == select_per_class(method, x, labels, 3, seed=4)
    members = np.flatnonzero(labels == 1)
    assert select_per_class("herding", x, labels, 3)[3:6] == [int(members[i]) for i in herding(x[members], 3)]
    with pytest.raises(UserError, match="class 1 has 5"):
        select_per_class("random", x, labels, 6)
    with pytest.raises(UserError, match="kmeans"):
        select_per_class("kmeans", x, labels, 2)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_last_token_features_equal_unpadded_final_hidden_state(name: str) -> None:
    model, tok = build_tiny_model(name, seed=5)
    texts = ["A warm, funny and moving story.", "Dull.", "The plot makes no sense and the acting is wooden."]
    got = last_token_features(model, tok, texts, batch_size=2)
    with torch.no_grad():
        want = np.stack(
            [
                model(torch.tensor([tok(t)["input_ids"]]), output_hidden_states=True)
                .hidden_states[-1][0, -1]
                .double()
                .numpy()
                for t in texts
            ]
        )
    assert got.shape == (3, 32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_hidden_features_take_the_backbones_output_width() -> None:
    """A backbone whose output width is not ``config.hidden_size`` (OPT with ``word_embed_proj_dim``)."""
    from transformers import OPTConfig, OPTForCausalLM

    from privlm.resources.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    config = OPTConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        word_embed_proj_dim=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        ffn_dim=32,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = OPTForCausalLM(config).eval()
    for fixed_shape in (False, True):
        features = hidden_features(
            model,
            tokenizer,
            ["a good film", "a dull one"],
            "mean",
            batch_size=4,
            max_length=16,
            fixed_shape=fixed_shape,
        )
        assert features.shape == (2, 16)


def test_selectors_outside_uses_features_pick_the_same_without_them() -> None:
    from privlm.synthesis.coresets.selection import SELECTORS, USES_FEATURES

    assert USES_FEATURES <= set(SELECTORS)
    features = np.random.default_rng(0).normal(size=(30, 4))
    labels = [i % 3 for i in range(30)]
    for kind in set(SELECTORS) - USES_FEATURES:
        assert select_per_class(kind, np.empty((30, 0)), labels, 4, seed=1) == select_per_class(
            kind, features, labels, 4, seed=1
        )
