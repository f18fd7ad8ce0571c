"""The command line's progress lines (a log, not a terminal): start and end lines, the time left from the rate
since the first count, never a private task's count."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from privlm.cli import _progress
from privlm.cli._progress import cli_progress


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(_progress.time, "perf_counter", fake)
    return fake


def _log() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, log_time=False, log_path=False), out


def test_time_left_counts_from_the_first_count_not_from_the_set_up_before_it(clock: _Clock) -> None:
    """A DP-SGD steps task opened before a 200 s private pass: 49 steps in 0.5 s after the first leave about 2 s,
    not the 600 s that 200 s over 50 steps would give."""
    console, out = _log()
    with cli_progress(console) as progress:
        steps = progress.task("DP-SGD steps")
        clock.now = 200.0
        steps.update(completed=1, total=200)
        clock.now = 200.5
        steps.update(completed=50, total=200)
        steps.done()
    lines = out.getvalue().splitlines()
    assert lines[0].strip() == "start: DP-SGD steps"
    assert lines[1].strip() == "DP-SGD steps: 50/200 after 200 s, about 2 s left"
    assert lines[2].strip() == "done: DP-SGD steps (200 s)"


def test_a_first_count_past_a_quarter_is_timed_from_the_start(clock: _Clock) -> None:
    """With one count only, the rate is the elapsed time over it (nothing else is known)."""
    console, out = _log()
    with cli_progress(console) as progress:
        task = progress.task("batches", total=8)
        clock.now = 30.0
        task.advance(2)
    assert out.getvalue().splitlines()[1].strip() == "batches: 2/8 after 30 s, about 90 s left"


def test_a_count_of_zero_or_a_reset_does_not_start_the_rate(clock: _Clock) -> None:
    """A task set to 0 at opening (the runner's steps) and set up for 100 s is timed from its first step; a count
    reset to 0 (GRADMM's steps, batch after batch) is timed from the first count after the reset."""
    console, out = _log()
    with cli_progress(console) as progress:
        task = progress.task("steps")
        task.update(completed=0, total=100)
        clock.now = 100.0
        task.update(completed=1)
        clock.now = 101.0
        task.update(completed=26)
        task.update(completed=0)
        clock.now = 200.0
        task.update(completed=1)
        clock.now = 248.0
        task.update(completed=50)
    lines = [line.strip() for line in out.getvalue().splitlines()]
    assert lines[1:] == ["steps: 26/100 after 101 s, about 3 s left", "steps: 50/100 after 248 s, about 49 s left"]


def test_a_private_task_shows_no_count_and_no_time_left(clock: _Clock) -> None:
    """Opened with its total (as the prefix cache's build is), a private task prints only its start and its end."""
    console, out = _log()
    with cli_progress(console) as progress:
        task = progress.task("reading the private examples", total=640, private=True)
        for _ in range(40):
            clock.now += 1.0
            task.advance(16)
        task.done()
    assert [line.strip() for line in out.getvalue().splitlines()] == [
        "start: reading the private examples",
        "done: reading the private examples (40 s)",
    ]


def test_a_private_bar_in_a_terminal_shows_no_count() -> None:
    """In a terminal (rich bars) a private task's M/N column is blank; a public task's shows its count."""
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True)
    with cli_progress(console) as progress:
        private = progress.task("reading the private examples", total=640, private=True)
        public = progress.task("candidates", total=24)
        private.advance(320)
        public.advance(12)
        private.done()
        public.done()
    shown = out.getvalue()
    assert "24/24" in shown and "reading the private examples" in shown
    assert "640" not in shown and "320" not in shown
