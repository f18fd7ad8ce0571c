"""The head-only classifier's fit settings (standard library only: an experiment's configuration is read, and
``privlm experiment --pending`` answers, without loading torch; :mod:`privlm.training.head_probe` fits it)."""

from __future__ import annotations

from dataclasses import dataclass

from privlm.errors import UserError


@dataclass(frozen=True)
class HeadProbeConfig:
    """The fit: ``epochs`` passes of AdamW (``lr``, no weight decay) in mini-batches of ``batch_size``; prompts
    cut from the left to ``max_length`` tokens (the end, next to the label word, is kept)."""

    epochs: int = 40
    lr: float = 1e-2
    batch_size: int = 64
    max_length: int = 256

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "max_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"head_probe.{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not self.lr > 0:
            raise UserError(f"head_probe.lr must be a number > 0, got {self.lr!r}")
