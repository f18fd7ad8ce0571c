"""Timing side by side: variants run in turn after a warm-up, so machine load affects them alike."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def alternate(
    variants: dict[str, Callable[[], float]], repeats: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Run every variant once (warm-up), then ``repeats`` rounds of each in turn; each call returns its own
    time in seconds. Returns the times per variant and their medians."""
    for run in variants.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            times[name].append(run())
    return times, {name: statistics.median(t) for name, t in times.items()}
