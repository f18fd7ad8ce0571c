"""Fine-tuning hyperparameters and named presets (standard library only: the CLI's help lists them)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from privlm.errors import UserError


@dataclass(frozen=True)
class FinetuneConfig:
    """Hyperparameters of one fine-tuning run; ``lora_rank=0`` means full fine-tuning."""

    epochs: int = 10
    lr: float = 2e-5
    batch_size: int = 8
    weight_decay: float = 0.0
    lora_rank: int = 0
    lora_alpha: int = 16
    max_length: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "max_length"):
            if getattr(self, name) < 1:
                raise UserError(f"fine-tuning {name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.lora_rank < 0:
            raise UserError(
                f"fine-tuning needs lr > 0 and lora_rank >= 0, got lr={self.lr}, lora_rank={self.lora_rank}"
            )


PRESETS: dict[str, FinetuneConfig] = {
    # Tiny random models in tests and smoke runs: large steps, many epochs.
    "tiny": FinetuneConfig(epochs=20, lr=3e-3, batch_size=8, max_length=96),
    # SmolLM2-135M, full fine-tuning on a few dozen examples.
    "smollm2": FinetuneConfig(epochs=8, lr=2e-5, batch_size=8, max_length=128),
    # SmolLM2-135M with LoRA rank 8 on all linear layers.
    "smollm2-lora": FinetuneConfig(epochs=8, lr=5e-4, batch_size=8, max_length=128, lora_rank=8),
}


def preset(name: str, **overrides: object) -> FinetuneConfig:
    """A named preset, optionally with some fields replaced."""
    if name not in PRESETS:
        raise UserError(f"unknown fine-tuning preset {name!r}; known: {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides)
