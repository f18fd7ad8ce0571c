"""How long work reports its progress, without knowing where it is shown.

Library code (a synthesis method, a training loop) takes a :class:`Progress` and opens :class:`Task`\\ s on
it; the command line supplies one that draws rich progress bars in a terminal and prints one line per
stage otherwise. The base classes report nothing, so library calls need no progress at all.

**Private counts.** A task opened with ``private=True`` counts something private (the examples of a private
pass): a reporter shows its description and elapsed time, never its count or total.
"""

from __future__ import annotations

from collections.abc import Callable


class Task:
    """One stage of work; the base class ignores every update."""

    def update(
        self, *, description: str | None = None, completed: float | None = None, total: float | None = None
    ) -> None:
        """Set the description, the amount done or the total."""

    def advance(self, amount: float = 1) -> None:
        """Count ``amount`` more units done."""

    def done(self) -> None:
        """The stage is over."""


class Progress:
    """A source of :class:`Task`\\ s; the base class reports nothing."""

    def task(
        self, description: str, total: float | None = None, private: bool = False, transient: bool = False
    ) -> Task:
        """Open a stage called ``description`` of ``total`` units (None: unknown); ``private``: its count is
        private; ``transient``: a bar may disappear when the stage is done (one of many short stages)."""
        return Task()


SILENT = Progress()


def shown_steps(
    progress: Progress, epsilon: float | None
) -> tuple[Task, Callable[[int, int, float | None, float | None], None]]:
    """A "DP-SGD steps" task on ``progress`` ("clipped SGD steps (σ = 0, NOT private)" for the run without
    noise, ``epsilon`` None) and the ``on_progress`` callback of :func:`privlm.training.loop.train_loop` that advances it (the
    step count and total are public: the run's settings fix them)."""
    task = progress.task("DP-SGD steps" if epsilon is not None else "clipped SGD steps (σ = 0, NOT private)")

    def on_progress(step: int, total: int, loss: float | None, eps: float | None) -> None:
        task.update(completed=step, total=total)

    return task, on_progress
