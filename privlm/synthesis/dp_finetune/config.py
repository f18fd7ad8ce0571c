"""Public settings of DP fine-tune-then-generate (:mod:`privlm.synthesis.dp_finetune.mechanism`); cheap to import."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from privlm.errors import UserError
from privlm.lm.sampling import SAMPLING_PARAMS

CACHE_DTYPE = "bfloat16"  # the prefix cache's dtype, as privlm train's default

if TYPE_CHECKING:
    from privlm.training.loop import TrainConfig


@dataclass(frozen=True)
class DPFinetuneConfig:
    """Public settings of the DP fine-tuning run and of sampling (module docstring for the CPU cuts)."""

    lora: int = 8
    lora_layers: int = 2  # LoRA on the last N decoder blocks only (the backward pass stops there)
    batch_size: int = 256  # expected Poisson batch B (q = B/N)
    physical_batch_size: int = 32
    epochs: float = 1.0
    lr: float = 2e-3
    max_grad_norm: float = 1.0  # the DP-SGD names and meanings of privlm.dpsgd.settings.DPSGDSettings
    norm_mode: str = "hutchinson"
    probes: int = 32
    max_text_tokens: int = 48  # each private text is cut to its first tokens
    cache: bool = True  # the hidden states entering the trained blocks computed once per example (top-blocks path)
    instructions: tuple[str, ...] | None = None  # the public prompt of each class (None: the zero-shot default)
    max_new_tokens: int = 40
    temperature: float = 1.0
    top_p: float = 0.95
    seed: int = 0  # LoRA initialisation and sampling (public); never the noise

    def __post_init__(self) -> None:
        if self.instructions is not None:
            object.__setattr__(self, "instructions", tuple(self.instructions))
        if not isinstance(self.max_text_tokens, int) or self.max_text_tokens < 1:
            raise UserError(f"max_text_tokens must be an integer >= 1 (got {self.max_text_tokens!r})")

    def train_config(self, epsilon: float | None, delta: float, max_length: int) -> TrainConfig:
        """The DP-SGD settings (validated by :class:`TrainConfig`); the noise keys come from the OS. ``epsilon``
        None: the same run with σ = 0 (per-example clipping without noise, NOT private: the ablation that
        separates what the noise costs from what the recipe can do)."""
        from privlm.training.loop import TrainConfig

        return TrainConfig(
            task="lm",
            epsilon=epsilon,
            noise_multiplier=0.0 if epsilon is None else None,
            delta=delta,
            norm_mode=self.norm_mode,
            probes=self.probes,
            max_length=max_length,
            batch_size=self.batch_size,
            epochs=self.epochs,
            lr=self.lr,
            max_grad_norm=self.max_grad_norm,
            physical_batch_size=self.physical_batch_size,
            lora=self.lora,
            lora_layers=None if self.cache else self.lora_layers,
            train_layers=self.lora_layers if self.cache else None,
            cache=CACHE_DTYPE if self.cache else None,
            checkpoint_every=5,
            log_every=5,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {**asdict(self), "instructions": None if self.instructions is None else list(self.instructions)}

    def training_dict(self) -> dict[str, Any]:
        """The settings that determine the trained adapters (all but sampling's): what a reused run must repeat."""
        return {k: v for k, v in self.to_dict().items() if k not in SAMPLING_PARAMS}  # sampling reads those
