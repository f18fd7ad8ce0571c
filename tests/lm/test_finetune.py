"""Label-word fine-tuning on tiny models: it learns, leaves the input model alone, selects on validation."""

from __future__ import annotations

import random

import pytest
import torch

from privlm.errors import UserError
from privlm.lm.finetune import finetune_classifier, select_and_finetune
from privlm.lm.finetune_checkpoint import EpochCheckpoint
from privlm.lm.finetune_config import FinetuneConfig, preset
from privlm.lm.scoring import evaluate_accuracy
from privlm.resources.tiny import build_tiny_model

SUFFIX = " It was "
WORDS = ["bad", "great"]
GOOD = ["warm", "funny", "moving", "smart", "honest", "wonderful", "delight", "loved"]
BAD = ["slow", "dull", "wooden", "worst", "terrible", "sad", "tired", "long"]
FILLER = ["the film is", "this movie was", "a story that is", "the cast is", "the plot was", "the picture is"]


def keyword_task(n: int, seed: int) -> list[tuple[str, int]]:
    """Sentences whose label is given by a sentiment keyword: learnable by a tiny model."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % 2
        words = rng.sample(GOOD if label else BAD, 2)
        rows.append((f"{rng.choice(FILLER)} {words[0]} and {words[1]}", label))
    return rows


TRAIN, VALID, TEST = keyword_task(32, 0), keyword_task(24, 1), keyword_task(40, 2)


def params_of(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_full_finetuning_learns_keyword_task_and_leaves_input_model_unchanged() -> None:
    model, tok = build_tiny_model("tiny-llama", seed=0)
    model.requires_grad_(False)  # as GRADMM leaves a shared model: fine-tuning must still train all weights
    before = params_of(model)
    start = evaluate_accuracy(model, tok, TEST, SUFFIX, WORDS).value
    result = finetune_classifier(model, tok, TRAIN, SUFFIX, WORDS, preset("tiny"))
    after = evaluate_accuracy(result.model, tok, TEST, SUFFIX, WORDS).value
    assert start < 0.7 and after >= 0.9, (start, after)
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not any(p.requires_grad for p in model.parameters())
    assert not result.model.training


def test_lora_on_gpt2_conv1d_learns_and_returns_a_merged_plain_model() -> None:
    model, tok = build_tiny_model("tiny-gpt2", seed=0)
    config = preset("tiny", lora_rank=4, lora_alpha=8, lr=1e-2)
    result = finetune_classifier(model, tok, TRAIN, SUFFIX, WORDS, config)
    assert type(result.model) is type(model)
    assert evaluate_accuracy(result.model, tok, TEST, SUFFIX, WORDS).value >= 0.85
    # Embeddings are not LoRA targets, so merging leaves them as they were.
    assert torch.equal(result.model.transformer.wte.weight, model.transformer.wte.weight)


def test_validation_keeps_the_best_epoch_weights_and_runs_are_seeded() -> None:
    model, tok = build_tiny_model("tiny-llama", seed=1)
    config = preset("tiny", epochs=6, lr=1e-2)
    result = finetune_classifier(model, tok, TRAIN, SUFFIX, WORDS, config, validation=VALID)
    accs = [h["validation_accuracy"] for h in result.history]
    assert result.best_epoch == accs.index(max(accs)) + 1
    assert evaluate_accuracy(result.model, tok, VALID, SUFFIX, WORDS).value == result.validation_accuracy == max(accs)
    again = finetune_classifier(model, tok, TRAIN, SUFFIX, WORDS, config, validation=VALID)
    assert again.history == result.history


def test_grid_selection_keeps_the_best_validation_configuration() -> None:
    model, tok = build_tiny_model("tiny-llama", seed=0)
    grid = [preset("tiny", epochs=2, lr=1e-5), preset("tiny", epochs=4, lr=3e-3)]
    result, rows = select_and_finetune(model, tok, TRAIN, VALID, SUFFIX, WORDS, grid)
    accs = [r["validation_accuracy"] for r in rows]
    assert result.config == grid[accs.index(max(accs))]
    assert result.validation_accuracy == max(accs)
    assert [r["lr"] for r in rows] == [1e-5, 3e-3]


def test_bad_input_is_refused() -> None:
    model, tok = build_tiny_model("tiny-llama")
    with pytest.raises(UserError, match="label 2"):
        finetune_classifier(model, tok, [("x", 2)], SUFFIX, WORDS, preset("tiny"))
    with pytest.raises(UserError, match="epochs"):
        FinetuneConfig(epochs=0)
    with pytest.raises(UserError, match="nope"):
        preset("nope")


class Killed(Exception):
    """Stands in for the process being killed mid-run."""


def kill_at(step: int):
    """An ``on_step`` that records the steps it sees and raises at ``step``."""
    seen: list[int] = []

    def on_step(s: int, loss: float) -> None:
        seen.append(s)
        if s == step:
            raise Killed

    return on_step, seen


LORA = {"lora_rank": 4, "lora_alpha": 8, "lr": 1e-2}


def with_dropout(model, p: float = 0.2):
    """``model`` with every dropout layer at ``p``: training then draws from torch's global generator."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = p
    return model


@pytest.mark.parametrize(
    ("name", "overrides", "validation", "every_s", "kill", "resumed_from"),
    [
        ("tiny-llama", {}, VALID, 600, 10, 9),  # killed at the third epoch's second step: epochs 1–2 are saved
        ("tiny-gpt2", LORA, None, 600, 10, 9),
        ("tiny-llama", {}, VALID, 0, 10, 11),  # saved after every step: resumed after step 10
        ("tiny-gpt2", LORA, None, 0, 8, 8),  # an epoch's last step is saved with the epoch: resumed after 7
        ("tiny-gpt2", {}, VALID, 0, 6, 7),  # with dropout (the global generator's state is resumed too)
    ],
)
def test_a_killed_finetune_resumes_at_its_last_save_and_returns_the_uninterrupted_result(
    tmp_path, name, overrides, validation, every_s, kill, resumed_from
) -> None:
    model, tok = build_tiny_model(name, seed=0)
    if name == "tiny-gpt2" and not overrides:
        model = with_dropout(model)
    config = preset("tiny", epochs=4, batch_size=8, **overrides)  # 32 rows: 4 steps per epoch
    torch.manual_seed(1)
    whole = finetune_classifier(model, tok, TRAIN, SUFFIX, WORDS, config, validation=validation)
    checkpoint = EpochCheckpoint(tmp_path / "ft.pt", model_key="m", every_s=every_s)
    on_step, seen = kill_at(kill)
    torch.manual_seed(1)
    with pytest.raises(Killed):
        finetune_classifier(
            model, tok, TRAIN, SUFFIX, WORDS, config, validation=validation, on_step=on_step, checkpoint=checkpoint
        )
    if every_s:  # as written before saves within an epoch existed: no "within" entry
        state = torch.load(checkpoint.path, weights_only=True)
        del state["within"]
        torch.save(state, checkpoint.path)
    torch.manual_seed(2)  # the resumed run takes the saved generator state, not the caller's
    on_step, seen = kill_at(-1)
    resumed = finetune_classifier(
        model, tok, TRAIN, SUFFIX, WORDS, config, validation=validation, on_step=on_step, checkpoint=checkpoint
    )
    assert seen == list(range(resumed_from, 17))
    assert resumed.history == whole.history and resumed.best_epoch == whole.best_epoch
    assert resumed.validation_accuracy == whole.validation_accuracy
    assert all(
        torch.equal(a, b) for a, b in zip(resumed.model.state_dict().values(), whole.model.state_dict().values())
    )
    on_step, seen = kill_at(-1)  # a finished checkpoint: no step runs again, same result
    again = finetune_classifier(
        model, tok, TRAIN, SUFFIX, WORDS, config, validation=validation, on_step=on_step, checkpoint=checkpoint
    )
    assert seen == [] and again.history == whole.history


def test_a_checkpoint_of_other_rows_settings_or_model_is_not_resumed(tmp_path) -> None:
    model, tok = build_tiny_model("tiny-llama", seed=0)
    config = preset("tiny", epochs=2)
    checkpoint = EpochCheckpoint(tmp_path / "ft.pt", model_key="m")
    finetune_classifier(model, tok, TRAIN, SUFFIX, WORDS, config, checkpoint=checkpoint)
    other_rows = TRAIN[:-1] + [(TRAIN[-1][0], 1 - TRAIN[-1][1])]
    for rows, cfg, key in [
        (other_rows, config, "m"),
        (TRAIN, preset("tiny", epochs=2, lr=1e-2), "m"),
        (TRAIN, config, "another model"),
    ]:
        on_step, seen = kill_at(-1)
        fresh = finetune_classifier(
            model, tok, rows, SUFFIX, WORDS, cfg, on_step=on_step, checkpoint=EpochCheckpoint(checkpoint.path, key)
        )
        assert seen == list(range(1, 9))  # from scratch
        assert fresh.history == finetune_classifier(model, tok, rows, SUFFIX, WORDS, cfg).history


@pytest.mark.parametrize(("every_s", "resumed"), [(600, [13, 14, 15, 16]), (0, [15, 16])])
def test_a_killed_grid_selection_keeps_the_configurations_it_finished(tmp_path, every_s, resumed) -> None:
    model, tok = build_tiny_model("tiny-llama", seed=0)
    grid = [preset("tiny", epochs=2, lr=1e-5), preset("tiny", epochs=2, lr=3e-3)]
    whole, rows = select_and_finetune(model, tok, TRAIN, VALID, SUFFIX, WORDS, grid)
    checkpoint = EpochCheckpoint(tmp_path / "ft.pt", model_key="m", every_s=every_s)
    on_step, _ = kill_at(14)  # the second configuration's second epoch
    with pytest.raises(Killed):
        select_and_finetune(model, tok, TRAIN, VALID, SUFFIX, WORDS, grid, on_step, checkpoint)
    on_step, seen = kill_at(-1)
    result, resumed_rows = select_and_finetune(model, tok, TRAIN, VALID, SUFFIX, WORDS, grid, on_step, checkpoint)
    assert seen == resumed and resumed_rows == rows and result.config == whole.config
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ft-0.pt", "ft-1.pt"]
