"""Right-padded batches, optionally of one fixed shape.

**Why fixed shapes on the private side.** A model's output for one row can change in its last bits with
the shape of the batch it is computed in (kernels pick other blockings). If private examples were
batched by length, adding one example would move others into batches of another width and change their
features by ~1e-7 — harmless for a sum clipped to C up to rounding, but a *discrete* use (PE's
nearest-candidate vote) can turn that into a whole vote moved, and an attacker may craft examples that sit
on such ties. With every batch padded to a public width and a public number of rows, a row's output is a
function of that row alone (tested bitwise: ``tests/resources/test_padding.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def padded_batch(
    sequences: Sequence[Sequence[int]], pad_id: int = 0, *, width: int | None = None, rows: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, mask, lengths)``: ``sequences`` right-padded with ``pad_id`` to ``width`` tokens (default: the
    longest) and, when ``rows`` is given, followed by one-token filler rows up to ``rows`` rows (ids and
    mask are ``rows × width``; ``lengths`` covers the real sequences only). ``width`` and ``rows`` must be
    public bounds: a sequence longer than ``width`` or more than ``rows`` sequences is a ``ValueError``."""
    if not sequences:
        raise ValueError("no sequences to pad")
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    width = int(lengths.max()) if width is None else width
    total = len(sequences) if rows is None else rows
    if len(sequences) > total or int(lengths.max()) > width:
        raise ValueError(f"{len(sequences)} sequences of up to {int(lengths.max())} tokens exceed the shape {total} × {width}")
    ids = torch.full((total, width), pad_id, dtype=torch.long)
    mask = torch.zeros(total, width, dtype=torch.long)
    mask[len(sequences) :, 0] = 1  # filler rows attend to one pad token (an all-masked row is undefined)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask, lengths
