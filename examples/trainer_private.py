"""Private fine-tuning with a Hugging Face ``Trainer``: the two added lines are marked ``# privlm``.

Runs in seconds on CPU with a tiny random Llama (no download); swap in any causal LM and dataset.

    python examples/trainer_private.py
"""

from __future__ import annotations

import tempfile

import torch
from transformers import TrainingArguments

from privlm.resources.tiny import build_tiny_model
from privlm.training.trainer import PrivacyArguments, PrivateTrainer  # privlm

TEXTS = [f"review {i}: the film was " + ("great fun" if i % 2 else "slow and dull") for i in range(64)]


def main() -> None:
    model, tokenizer = build_tiny_model("tiny-llama", seed=0)
    train = []
    for text in TEXTS:
        ids = tokenizer(text, max_length=32, truncation=True, padding="max_length", return_tensors="pt")
        train.append(
            {
                "input_ids": ids["input_ids"][0],
                "attention_mask": ids["attention_mask"][0],
                "labels": ids["input_ids"][0].masked_fill(ids["attention_mask"][0] == 0, -100),
            }
        )
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=16,
            num_train_epochs=2,
            learning_rate=5e-3,
            logging_steps=2,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
        )
        trainer = PrivateTrainer(
            model=model,
            args=args,
            train_dataset=train,
            privacy=PrivacyArguments(epsilon=3.0, delta=1e-5, norm_mode="hutchinson"),  # privlm
        )
        trainer.train()
        print(f"{trainer.state.global_step} private steps, ε = {trainer.epsilon():.3f} at δ = 1e-5")
        assert torch.isfinite(torch.cat([p.flatten() for p in model.parameters()])).all()


if __name__ == "__main__":
    main()
