"""Secret randomness for noise and probes: generators seeded from the operating system.

Noise must never be reproducible from a user seed, the data or torch's global generator; every
mechanism that is not explicitly seeded for a reproducible (and therefore non-private) run draws its
generator here.
"""

from __future__ import annotations

import os

import torch


def os_seed() -> int:
    """A 63-bit seed from ``os.urandom`` (torch's global generator is left alone)."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def os_seeded_generator(device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator on ``device`` seeded with :func:`os_seed`."""
    return torch.Generator(device=device).manual_seed(os_seed())
