"""privlm: differentially private fine-tuning and synthetic text for Hugging Face causal LMs.

The public API, importable from the top level (each name is imported on first use, so ``import privlm``
and ``privlm --help`` stay fast)::

    from privlm import PrivacyEngine, PrivacyAccountant, PrivateTrainer, PrivacyArguments

- Private training: :class:`PrivacyEngine` (``make_private`` on any ``nn.Module`` and loss),
  :class:`PrivateTrainer` / :class:`PrivacyArguments` (Hugging Face ``Trainer``), :class:`TrainConfig`.
- Accounting: :class:`PrivacyAccountant`, :class:`Ledger`, :func:`calibrate_noise_multiplier`,
  :func:`calibrate_gaussian_releases`.
- Private synthetic text: :func:`run_gradmm` / :class:`GradmmConfig` (GRADMM; :func:`synthesize`
  is its in-memory core), :func:`run_pe` /
  :class:`PEConfig` (Private Evolution), :func:`run_dp_finetune` / :class:`DPFinetuneConfig`
  (DP fine-tune-then-generate).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "PrivacyEngine": "privlm.dpsgd.engine",
    "PrivateModel": "privlm.dpsgd.engine",
    "PrivacyAccountant": "privlm.privacy.accountant",
    "Ledger": "privlm.privacy.ledger",
    "calibrate_noise_multiplier": "privlm.privacy.calibration",
    "calibrate_gaussian_releases": "privlm.privacy.calibration",
    "PrivateTrainer": "privlm.training.trainer",
    "PrivacyArguments": "privlm.training.trainer",
    "TrainConfig": "privlm.training.loop",
    "DPSGDSettings": "privlm.dpsgd.settings",
    "run_gradmm": "privlm.synthesis.gradmm.pipeline",
    "synthesize": "privlm.synthesis.gradmm.generate",
    "GradmmConfig": "privlm.synthesis.gradmm.config",
    "run_pe": "privlm.synthesis.pe.mechanism",
    "PEConfig": "privlm.synthesis.pe.config",
    "run_dp_finetune": "privlm.synthesis.dp_finetune.mechanism",
    "DPFinetuneConfig": "privlm.synthesis.dp_finetune.config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import an exported name's module on first use (module docstring)."""
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'privlm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
