"""``PrivateTrainer`` does DP-SGD exactly: same weights as the engine driven by hand (same seed, SGD,
constant learning rate), steps accounted, a clean stop when the budget is spent, and refusals."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader
from transformers import TrainingArguments, default_data_collator

from privlm.dpsgd.engine import PrivacyEngine
from privlm.dpsgd.loss_release import LossRelease
from privlm.errors import UserError
from privlm.privacy import Ledger, dpsgd_epsilon
from privlm.resources.tiny import build_tiny_model
from privlm.training.trainer import PrivacyArguments, PrivateTrainer

LR, SIGMA, CLIP, SEED = 0.05, 0.8, 0.5, 11
SIGMA_EFF = SIGMA / (1 + 0.2**2) ** 0.5  # accounted: gradient + DP loss (default α = 0.2) share the noise


def _rows(tokenizer, n: int = 24) -> list[dict]:
    rows = []
    for i in range(n):
        enc = tokenizer(
            f"text {i}: " + "great film " * (1 + i % 4),
            max_length=20,
            truncation=True,
            padding="max_length",
            return_tensors="pt",
        )
        ids, mask = enc["input_ids"][0], enc["attention_mask"][0]
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})
    return rows


def _args(tmp_path, **overrides) -> TrainingArguments:
    settings = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_train_epochs=2,
        learning_rate=LR,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        logging_steps=1000,
    )
    return TrainingArguments(**{**settings, **overrides})


def _privacy(**overrides) -> PrivacyArguments:
    return PrivacyArguments(
        **{"noise_multiplier": SIGMA, "max_grad_norm": CLIP, "norm_mode": "ghost", "seed": SEED, **overrides}
    )


def test_trainer_matches_the_engine_driven_by_hand(tmp_path):
    model, tokenizer = build_tiny_model("tiny-llama", seed=0)
    rows = _rows(tokenizer)
    trainer = PrivateTrainer(model=model, args=_args(tmp_path), train_dataset=rows, privacy=_privacy())
    trainer.train()
    assert trainer.state.global_step == trainer.engine.steps == 6  # q = 8/24: 3 steps per epoch, 2 epochs

    reference, _ = build_tiny_model("tiny-llama", seed=0)
    reference.train()
    engine = PrivacyEngine("ghost", seed=SEED)
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    private, optimizer, loader = engine.make_private(
        reference,
        optimizer,
        DataLoader(rows, batch_size=8, collate_fn=default_data_collator),
        noise_multiplier=SIGMA,
        max_grad_norm=CLIP,
        loss_reduction="mean",
        loss_release=LossRelease(10.0, 0.2),
    )
    released = []
    for _ in range(2):
        for batch in loader:
            optimizer.zero_grad()
            private.clipped_backward(batch)
            optimizer.step()
            released.append(optimizer.released_loss)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=name)
    assert any(
        not torch.equal(p, q)
        for p, q in zip(model.parameters(), build_tiny_model("tiny-llama", seed=0)[0].parameters())
    )
    assert trainer.epsilon() == pytest.approx(dpsgd_epsilon(SIGMA_EFF, 8 / 24, 6, 1e-5), rel=1e-9)
    assert trainer.released_losses == pytest.approx(released, rel=1e-6)


def test_trainer_logs_only_the_released_dp_loss(tmp_path):
    model, tokenizer = build_tiny_model("tiny-llama", seed=0)
    trainer = PrivateTrainer(
        model=model, args=_args(tmp_path, logging_steps=2), train_dataset=_rows(tokenizer), privacy=_privacy()
    )
    output = trainer.train()
    history = trainer.state.log_history
    assert not any(key in logs for logs in history for key in ("loss", "train_loss"))
    released = trainer.released_losses
    assert [logs["dp_loss"] for logs in history if "dp_loss" in logs] == pytest.approx(
        [sum(released[i : i + 2]) / 2 for i in (0, 2, 4)]
    )
    assert output.training_loss == pytest.approx(sum(released) / len(released))
    assert "train_loss" not in output.metrics

    with pytest.raises(UserError, match="already holds a privacy ledger"):
        trainer.train()
    quiet = PrivateTrainer(
        model=build_tiny_model("tiny-llama", seed=0)[0],
        args=_args(tmp_path / "quiet", logging_steps=2),
        train_dataset=_rows(tokenizer),
        privacy=_privacy(loss_noise_fraction=0.0),
    )
    quiet.train()
    assert not any("loss" in key for logs in quiet.state.log_history for key in logs)
    assert quiet.epsilon() == pytest.approx(dpsgd_epsilon(SIGMA, 8 / 24, 6, 1e-5), rel=1e-9)


def test_trainer_stops_when_the_budget_is_spent(tmp_path):
    model, tokenizer = build_tiny_model("tiny-llama", seed=0)
    budget = dpsgd_epsilon(SIGMA_EFF, 8 / 24, 4, 1e-5) * 1.0001  # enough for 4 steps, not for 5
    trainer = PrivateTrainer(
        model=model,
        args=_args(tmp_path, num_train_epochs=3),
        train_dataset=_rows(tokenizer),
        privacy=_privacy(epsilon=budget),
    )
    trainer.train()
    assert trainer.state.global_step == trainer.engine.steps == 4
    assert trainer.epsilon() <= budget < dpsgd_epsilon(SIGMA_EFF, 8 / 24, 5, 1e-5)


def test_trainer_calibrates_sigma_for_its_planned_steps(tmp_path):
    model, tokenizer = build_tiny_model("tiny-llama", seed=0)
    trainer = PrivateTrainer(
        model=model,
        args=_args(tmp_path),
        train_dataset=_rows(tokenizer),
        privacy=PrivacyArguments(epsilon=2.0, norm_mode="hutchinson", probes=16, seed=1),
    )
    trainer.train()
    assert trainer.engine.steps == 6
    assert 1.9 < trainer.epsilon() <= 2.0
    assert trainer.private_model.clipper.step == 7  # fresh probes every step, though the Trainer never calls zero_grad


def test_unsupported_settings_are_refused(tmp_path):
    model, tokenizer = build_tiny_model("tiny-llama", seed=0)
    with pytest.raises(UserError, match="gradient_accumulation_steps"):
        PrivateTrainer(
            model=model,
            args=_args(tmp_path, gradient_accumulation_steps=2),
            train_dataset=_rows(tokenizer),
            privacy=_privacy(),
        )
    trainer = PrivateTrainer(model=model, args=_args(tmp_path), train_dataset=_rows(tokenizer), privacy=_privacy())
    with pytest.raises(UserError, match="resume"):
        trainer.train(resume_from_checkpoint=str(tmp_path))


def test_trainer_writes_its_ledger_and_keeps_private_batch_statistics_out(tmp_path):
    model, tokenizer = build_tiny_model("tiny-llama", seed=0)
    trainer = PrivateTrainer(
        model=model, args=_args(tmp_path, logging_steps=2), train_dataset=_rows(tokenizer), privacy=_privacy()
    )
    trainer.train()
    ledger = Ledger.load(tmp_path / "privacy.json")
    assert sum(entry.count for entry in ledger) == trainer.engine.steps == 6
    assert ledger.private_release is False  # seeded (SEED): the noise is reproducible
    assert trainer.state.total_flos == 0 and all(entry.get("total_flos", 0) == 0 for entry in trainer.state.log_history)
    with pytest.raises(UserError, match="num_input_tokens_seen"):
        PrivateTrainer(
            model=model,
            args=_args(tmp_path, include_num_input_tokens_seen=True),
            train_dataset=_rows(tokenizer),
            privacy=_privacy(),
        )


def test_trainer_trains_on_completion_batches_with_the_prompt_masked(tmp_path):
    """``collate_completions`` batches (labels -100 on the prompt and the padding) through the Trainer: the
    default per-sample loss is the mean cross-entropy of each row's completion tokens only, and training
    runs and is accounted."""
    from privlm.dpsgd.losses import causal_lm_losses
    from privlm.lm.completion import HEADLINE_TEMPLATE, collate_completions, encode_completions
    from privlm.lm.prompts import IGNORE_INDEX, pad_token_id

    model, tokenizer = build_tiny_model("tiny-llama", seed=0)
    pairs = [(f"article {i}: the market rose today " * (1 + i % 3), "shares gain " * (1 + i % 2)) for i in range(24)]
    rows = encode_completions(tokenizer, pairs, max_length=40, template=HEADLINE_TEMPLATE)
    pad = pad_token_id(tokenizer)

    def collate(batch):
        return collate_completions(batch, pad)

    trainer = PrivateTrainer(
        model=model, args=_args(tmp_path), train_dataset=rows, data_collator=collate, privacy=_privacy()
    )
    trainer.train()
    assert trainer.state.global_step == trainer.engine.steps == 6
    assert any(
        not torch.equal(p, q)
        for p, q in zip(model.parameters(), build_tiny_model("tiny-llama", seed=0)[0].parameters())
    )
    batch = collate(rows[:5])
    assert bool((batch["labels"][:, :5] == IGNORE_INDEX).all())  # the prompt is masked
    losses = trainer.private_model.clipper.loss_fn(model, batch)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    for i, row in enumerate(rows[:5]):
        start = len(row.input_ids) - row.n_completion_tokens  # the first completion token
        targets = torch.tensor(row.input_ids[start:])
        expected = torch.nn.functional.cross_entropy(logits[i, start - 1 : len(row.input_ids) - 1], targets)
        torch.testing.assert_close(losses[i], expected, rtol=1e-5, atol=1e-6)
    every_token = causal_lm_losses(model, {**batch, "labels": batch["input_ids"]}, reduction="mean")
    assert not torch.allclose(losses, every_token)  # the prompt tokens are not in the loss
