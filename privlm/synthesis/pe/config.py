"""Public settings of Private Evolution (:mod:`privlm.synthesis.pe.mechanism`); cheap to import."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from privlm.errors import UserError
from privlm.lm.sampling import Sampling

DEFAULT_VARIATION = (
    'Here is a {label_name} movie review sentence: "{text}"\n'
    "Write a new {label_name} movie review sentence that says the same in other words. Reply with the sentence only."
)


@dataclass(frozen=True)
class PEConfig:
    """Public settings of a PE run (none is derived from the private data)."""

    iterations: int = 3  # T: noisy histograms, each one Gaussian release
    population: float = 2.0  # candidates per class M = ⌈population · n⌉
    variations: int = 3  # V: rewrites written for each survivor
    pooling: str = "mean"  # embedding: "mean" or "last" final hidden state of the public model
    max_tokens: int = 64  # texts (private and synthetic) are truncated to this many tokens before embedding
    instructions: tuple[str, ...] | None = None  # zero-shot instruction per class (None: the default)
    variation_instruction: str = DEFAULT_VARIATION  # with {label_name} and {text}
    max_new_tokens: int = 40
    temperature: float = 1.0
    top_p: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("iterations", "variations", "max_tokens", "max_new_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UserError(f"PE {name} must be an integer >= 1 (got {getattr(self, name)!r})")
        if not self.population >= 1:
            raise UserError(f"PE population must be >= 1 (candidates per kept example; got {self.population!r})")
        if self.pooling not in ("mean", "last"):
            raise UserError(f"PE pooling must be 'mean' or 'last' (got {self.pooling!r})")
        if "{text}" not in self.variation_instruction:
            raise UserError("the PE variation instruction must contain {text}")
        if self.instructions is not None:
            object.__setattr__(self, "instructions", tuple(self.instructions))

    def candidates(self, per_class: int) -> int:
        """M, the population of each class (public)."""
        return max(per_class, math.ceil(self.population * per_class))

    def survivors(self, candidates: int) -> int:
        """How many of a class's M ``candidates`` survive an iteration: ⌈M / (1 + V)⌉."""
        return math.ceil(candidates / (1 + self.variations))

    @property
    def sampling(self) -> Sampling:
        """The public LM's sampling settings."""
        return Sampling.from_params(asdict(self))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {**asdict(self), "instructions": None if self.instructions is None else list(self.instructions)}
