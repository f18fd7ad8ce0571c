"""Sampling settings of the public LM's generation (standard library only: method registrations and the
synthesis configs read them without importing torch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Sampling:
    """Sampling settings of ``model.generate`` (nucleus sampling) and retries for empty outputs."""

    max_new_tokens: int = 40
    temperature: float = 1.0
    top_p: float = 0.95
    max_rounds: int = 5

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Sampling:
        """The settings named in ``params`` (a method's parameters, or a config's fields; other keys are
        ignored), the defaults for the rest."""
        return cls(**{name: params[name] for name in SAMPLING_PARAMS if name in params})


# the settings a method or config may set (all but max_rounds, the retry count)
SAMPLING_PARAMS = tuple(f.name for f in fields(Sampling) if f.name != "max_rounds")
