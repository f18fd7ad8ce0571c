"""fit_and_score: plain, with a hyperparameter grid chosen on validation, and with an empty set."""

from __future__ import annotations

import sys
from pathlib import Path

from privlm.evaluation.evaluate import fit_and_score
from privlm.lm.finetune_config import preset
from privlm.lm.scoring import evaluate_accuracy
from privlm.resources.tiny import build_tiny_model

sys.path.insert(0, str(Path(__file__).parents[1] / "lm"))
from test_finetune import SUFFIX, TEST, TRAIN, VALID, WORDS  # noqa: E402


def test_grid_selection_reports_the_validation_choice_and_counts_steps_across_the_grid() -> None:
    model, tok = build_tiny_model("tiny-llama", seed=0)
    grid = [preset("tiny", epochs=2, lr=1e-6), preset("tiny", epochs=3, lr=3e-3)]
    steps: list[int] = []
    row = fit_and_score(
        model,
        tok,
        TRAIN,
        TEST,
        SUFFIX,
        WORDS,
        grid[0],
        validation=VALID,
        grid=grid,
        on_step=lambda step, loss: steps.append(step),
    )
    accs = [g["validation_accuracy"] for g in row["grid"]]
    assert row["selected"]["lr"] == [1e-6, 3e-3][accs.index(max(accs))]
    assert row["validation_accuracy"] == max(accs)
    assert steps == list(range(1, (2 + 3) * 4 + 1))  # 32 examples, batch 8: 4 steps per epoch


def test_empty_training_set_scores_the_base_model() -> None:
    model, tok = build_tiny_model("tiny-llama", seed=0)
    row = fit_and_score(model, tok, [], TEST, SUFFIX, WORDS, preset("tiny"), members=TRAIN[:4], nonmembers=VALID[:4])
    assert row["n_train"] == 0 and row["best_epoch"] == 0
    assert row["accuracy"] == evaluate_accuracy(model, tok, TEST, SUFFIX, WORDS).value
    assert 0 <= row["mia_advantage"] <= 1
