"""How big each audit cell is: the public sizes an audited mechanism reads (:class:`Scale`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scale:
    """How big each cell is: canaries per DP-SGD cell, steps, sampling rate, ordinary LM rows trained
    alongside the gradient canaries, canaries per GRADMM release, physical batch size, probes, the
    white-box canaries' norm (units of C), canaries and steps of the (slow) SmolLM2 black-box cells
    (LoRA r = 8 on the last 2 blocks), and canaries per PE run (T histograms). Each mechanism reads only
    its own fields (:attr:`privlm.audit.registry.AuditedMechanism.scale_fields`)."""

    canaries: int = 1000
    steps: int = 50
    sample_rate: float = 0.5
    real_examples: int = 64
    gradmm_canaries: int = 1000
    physical_batch_size: int = 256
    probes: int = 32
    canary_norm: float = 2.0
    smollm2_canaries: int = 256
    smollm2_steps: int = 20
    pe_canaries: int = 1000


QUICK = Scale(
    canaries=200,
    steps=10,
    real_examples=16,
    gradmm_canaries=64,
    physical_batch_size=64,
    smollm2_canaries=32,
    smollm2_steps=2,
    pe_canaries=64,
)
