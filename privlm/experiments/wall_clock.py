"""The seconds a grid cell's work took, summed over every process (and machine) that worked on it.

A cell longer than one process lives (PE at n = 1,000: hours of rewriting, resumed across stops and machines) is
made in segments, and a process killed at the end of a stop never gets to say how long it ran. ``work/<cell>/``
:data:`WALL` lists each segment's seconds per stage (``{"set": [...], "evaluation": [...]}``); while a segment
runs, a daemon thread rewrites its entry every ``every`` seconds (atomically), so a killed process loses at most
that much of its time. A cell another process holds starts no segment (the runner enters the clock under the
cell's lock); waits within a cell's work (for a shared DP run another cell is training, for the lock of the
keeps) count as its time. A cell begun before it kept a clock (by an earlier privlm, or
restored from a mirror that kept none) gets a ``null`` segment: its earlier time is unknown, and every sum
here is then a lower bound (:meth:`WallClock.unrecorded` says how many such segments there are).

:mod:`privlm.experiments.kept_runs` mirrors the file beside an unfinished cell's mirrored run folders and
writes it back with them, so a set made on a second machine states the first machine's time too. Time
spent after the last keep on a machine that is then lost is lost with it. Like ``set_s`` and ``wall_time_s``
in ``results.jsonl``, these are research measurements, not a DP release: a run's wall time follows its
private rows' lengths and is not protected (``docs/threat-model.md``).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import TracebackType

from privlm.atomic import write_text_atomic

WALL = "wall.json"


def read_segments(path: Path) -> dict[str, list[float | None]]:
    """The segments recorded at ``path`` per stage, ``None`` for one whose seconds are unknown ({}: no file)."""
    if not path.is_file():
        return {}
    saved = json.loads(path.read_text())
    return {stage: [None if s is None else float(s) for s in seconds] for stage, seconds in saved.items()}


class WallClock:
    """Record this process's segment of a cell's work at ``path`` (a context manager), under ``stage``, after
    the segments earlier processes recorded there; :meth:`stage` moves the running segment's later seconds to
    another stage, and :meth:`seconds` sums them (earlier processes' and this one's, so far). ``unrecorded``: the
    cell was begun under ``stage`` by processes that kept no clock (a ``null`` segment goes before this one's).
    The file is written on entry (its folder created), at every heartbeat while that folder exists (a cell's
    folder moved aside meanwhile is not recreated) and on exit."""

    def __init__(self, path: Path, stage: str, *, every: float = 60.0, unrecorded: bool = False) -> None:
        self.path, self.every, self._unrecorded = Path(path), every, unrecorded
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._closed: dict[str, list[float | None]] = {}  # earlier segments, this process's finished stages too
        self._stage, self._running, self._since = stage, 0.0, 0.0
        self._thread = threading.Thread(target=self._beat, name=f"wall clock {self.path}", daemon=True)

    def __enter__(self) -> WallClock:
        self._closed = read_segments(self.path)
        if self._unrecorded:
            self._closed.setdefault(self._stage, []).append(None)
        self._since = time.perf_counter()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write()  # a process killed within its first heartbeat still leaves its (short) segment
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._write()

    def stage(self, stage: str) -> None:
        """From now on, this process's seconds count under ``stage`` (a new segment of it)."""
        if stage == self._stage:
            return
        with self._lock:
            self._tick()
            self._closed.setdefault(self._stage, []).append(self._running)
            self._stage, self._running = stage, 0.0
        self._write()

    def seconds(self, stage: str | None = None) -> float:
        """The seconds recorded under ``stage`` (None: every stage), this process's so far included; a lower
        bound when a segment's are unknown (:meth:`unrecorded`)."""
        with self._lock:
            self._tick()
            return float(sum(s for s in self._segments(stage) if s is not None))

    def count(self, stage: str) -> int:
        """How many segments (processes, or stage changes within one) have worked under ``stage``."""
        with self._lock:
            return len(self._segments(stage))

    def unrecorded(self, stage: str | None = None) -> int:
        """How many segments under ``stage`` (None: every stage) have unknown seconds."""
        with self._lock:
            return sum(s is None for s in self._segments(stage))

    def _segments(self, stage: str | None) -> list[float | None]:
        """Every segment under ``stage`` (None: all), the running one last (the caller holds the lock)."""
        found = [s for name, seconds in self._closed.items() if stage in (None, name) for s in seconds]
        return found + [self._running] if stage in (None, self._stage) else found

    def _tick(self) -> None:
        """Bring the running segment up to now (the caller holds the lock)."""
        now = time.perf_counter()
        self._running, self._since = self._running + now - self._since, now

    def _write(self) -> None:
        with self._lock:
            self._tick()
            saved = {k: list(v) for k, v in self._closed.items()}
            saved.setdefault(self._stage, []).append(self._running)
            text = json.dumps(
                {k: [None if s is None else round(s, 3) for s in v] for k, v in saved.items()}, sort_keys=True
            )
            if self.path.parent.is_dir():
                write_text_atomic(self.path, text + "\n")

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            self._write()
