"""Public names of choices (norm modes, tasks, models), shared by the CLI's help and the code behind it.

Standard library only: ``privlm --help`` reads these without importing torch or transformers.
"""

from __future__ import annotations

from privlm.norm_modes import NORM_MODES

__all__ = ["DEFAULT_MODEL", "MODEL_NAMES", "NORM_MODES", "TASKS", "TINY_MODELS"]

TASKS: tuple[str, ...] = ("classify", "lm", "generate")
DEFAULT_MODEL = "smollm2-135m"
TINY_MODELS: tuple[str, ...] = ("tiny-llama", "tiny-gpt2")
MODEL_NAMES: tuple[str, ...] = (DEFAULT_MODEL, *TINY_MODELS)
