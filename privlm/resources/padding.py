"""Right-padded batches, optionally of one fixed shape.

**Why fixed shapes on the private side.** A model's output for one row can change in its last bits with
the shape of the batch it is computed in (kernels pick other blockings). If private examples were
batched by length, adding one example would move others into batches of another width and change their
features by ~1e-7 — harmless for a sum clipped to C up to rounding, but a *discrete* use (PE's
nearest-candidate vote) can turn that into a whole vote moved, and an attacker may craft examples that sit
on such ties. With every batch padded to a public width and a public number of rows, a row's output is a
function of that row alone (tested bitwise: ``tests/resources/test_padding.py``).

**Buckets.** Padding every private row to the longest possible prompt wastes most of a pass over short
texts. :func:`shape_buckets` instead gives each row the smallest of a public ladder of widths that holds it
and fills batches of one public row count within each width: a row's batch shape is then a function of its
own length, so its output is still a function of that row alone. Each batch holds at most ``rows − 1``
real rows, so it always has a filler row: a batch whose rows all fill its width could let the model drop
the attention mask and take another kernel (transformers skips the mask for SDPA when no position is
padded), which would make a row's output depend on whether its batch-mates happen to be full.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

WIDTH_STEP = 16  # the public ladder of private batch widths: 16, 32, 48, … tokens, capped at the longest


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
        raise ValueError(
            f"{len(sequences)} sequences of up to {int(lengths.max())} tokens exceed the shape {total} × {width}"
        )
    ids = torch.full((total, width), pad_id, dtype=torch.long)
    mask = torch.zeros(total, width, dtype=torch.long)
    mask[len(sequences) :, 0] = 1  # filler rows attend to one pad token (an all-masked row is undefined)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask, lengths


def shape_buckets(
    lengths: Sequence[int], rows: int, max_width: int, step: int = WIDTH_STEP
) -> list[tuple[list[int], int]]:
    """Private batches as ``(indices, width)``: each index ``i`` goes to width ``min(max_width, step·⌈lengths[i]/step⌉)``
    (a function of its own length), and each width's indices, in order, are cut into batches of at most
    ``rows − 1`` — to be padded with :func:`padded_batch` to exactly ``rows × width``, at least one filler
    row included. Every index appears once. ``rows < 2`` or a length above ``max_width`` is a ``ValueError``."""
    if rows < 2 or step < 1:
        raise ValueError(f"rows must be >= 2 and step >= 1 (got {rows}, {step})")
    by_width: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        if n > max_width:
            raise ValueError(f"a sequence of {n} tokens exceeds the width {max_width}")
        by_width.setdefault(min(max_width, step * -(-n // step)), []).append(i)
    return [
        (indices[start : start + rows - 1], width)
        for width, indices in sorted(by_width.items())
        for start in range(0, len(indices), rows - 1)
    ]
