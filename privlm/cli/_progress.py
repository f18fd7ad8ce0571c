"""The command line's :class:`privlm.progress.Progress`: rich bars in a terminal, one line per stage in a log.

In a terminal each task is a rich progress bar. When stderr is not a terminal (``nohup … > log``, CI, a
notebook) bars do not draw, so each task prints a line when it starts and one when it ends, with the
elapsed time (and, for a task with a known total, an estimate of the time left at every quarter, from the rate
since its first count: a task opened before slow set-up work does not count that work as units). A task
opened with ``private=True`` never shows a count or a total (they would be the private set's size).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.progress import Task as RichTask
from rich.text import Text

from privlm.progress import Progress, Task


class _PublicCount(MofNCompleteColumn):
    """M/N for a task, blank for a private one."""

    def render(self, task: RichTask) -> Text:
        return Text("") if task.fields.get("private") else super().render(task)


class _BarTask(Task):
    def __init__(self, bars: RichProgress, task: TaskID, transient: bool = False) -> None:
        self._bars, self._task, self._transient = bars, task, transient

    def update(
        self, *, description: str | None = None, completed: float | None = None, total: float | None = None
    ) -> None:
        self._bars.update(self._task, description=description, completed=completed, total=total)

    def advance(self, amount: float = 1) -> None:
        self._bars.advance(self._task, amount)

    def done(self) -> None:
        if self._transient:
            if self._task in self._bars.task_ids:
                self._bars.remove_task(self._task)
            return
        task = self._bars.tasks[self._task]
        self._bars.update(self._task, total=task.total or 1, completed=task.total or 1)


class _Bars(Progress):
    def __init__(self, bars: RichProgress) -> None:
        self._bars = bars

    def task(
        self, description: str, total: float | None = None, private: bool = False, transient: bool = False
    ) -> Task:
        return _BarTask(self._bars, self._bars.add_task(description, total=total, private=private), transient)


class _LineTask(Task):
    """Prints when it starts, at each quarter of a known total (with time left), and when it ends."""

    def __init__(self, console: Console, description: str, total: float | None, private: bool) -> None:
        self._console, self._description, self._private = console, description, private
        self._total, self._completed, self._quarter, self._finished = total, 0.0, 0, False
        self._start = time.perf_counter()
        self._first: tuple[float, float] | None = None  # (time, count) of the first count reported
        self._console.log(f"start: {description}" + ("" if private or total is None else f" ({total:g})"))

    def update(
        self, *, description: str | None = None, completed: float | None = None, total: float | None = None
    ) -> None:
        if description is not None and description.split(" (")[0] != self._description.split(" (")[0]:
            self._console.log(f"{description} ({time.perf_counter() - self._start:.0f} s)")
        self._description = description or self._description
        self._total = total if total is not None else self._total
        if completed is not None:
            if completed < self._completed:
                self._first = None  # a count set back (a stage begun again): its rate starts over
            self._completed = completed
            self._report()

    def advance(self, amount: float = 1) -> None:
        self._completed += amount
        self._report()

    def _report(self) -> None:
        if self._private or not self._total:
            return
        now = time.perf_counter()
        if self._first is None and self._completed > 0:
            self._first = (now, self._completed)  # the first count, or the first after a reset
        quarter = int(4 * self._completed / self._total)
        if 0 < quarter < 4 and quarter > self._quarter:
            self._quarter = quarter
            elapsed = now - self._start
            left = (self._total - self._completed) * self._seconds_per_unit(now)
            self._console.log(
                f"{self._description.split(' (')[0]}: {self._completed:g}/{self._total:g} "
                f"after {elapsed:.0f} s, about {left:.0f} s left"
            )

    def done(self) -> None:
        if not self._finished:
            self._finished = True
            self._console.log(f"done: {self._description.split(' (')[0]} ({time.perf_counter() - self._start:.0f} s)")

    def _seconds_per_unit(self, now: float) -> float:
        """The rate since the first count above 0 was reported (set: a quarter is crossed only above 0): what
        ran before it (loading, a private pass before the first DP-SGD step) is not the time of one unit. When
        no count has come since that one (it crossed a quarter by itself), the rate since the task opened."""
        assert self._first is not None
        since, base = self._first
        if self._completed > base:
            return (now - since) / (self._completed - base)
        return (now - self._start) / self._completed


class _Lines(Progress):
    def __init__(self, console: Console) -> None:
        self._console = console

    def task(
        self, description: str, total: float | None = None, private: bool = False, transient: bool = False
    ) -> Task:
        return _LineTask(self._console, description, total, private)


@contextlib.contextmanager
def cli_progress(console: Console) -> Iterator[Progress]:
    """Bars on ``console`` if it is a terminal, else one line per stage (module docstring)."""
    if not console.is_terminal:
        yield _Lines(console)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), _PublicCount(), TimeElapsedColumn())
    with RichProgress(*columns, console=console, transient=False) as bars:
        yield _Bars(bars)
