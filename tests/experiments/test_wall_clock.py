"""A cell's wall clock: each process's segment kept on disk while it runs, summed over processes and stages."""

from __future__ import annotations

import json
import time
from pathlib import Path

from privlm.experiments.wall_clock import WallClock, read_segments


def test_segments_of_later_processes_follow_the_earlier_ones_and_stages_sum_apart(tmp_path: Path) -> None:
    path = tmp_path / "cell" / "wall.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"set": [100.0, 20.5]}) + "\n")  # two earlier processes made part of the set
    with WallClock(path, "set") as clock:
        time.sleep(0.02)
        assert clock.count("set") == 3 and 120.5 < clock.seconds("set") < 121.5
        clock.stage("evaluation")
        set_s = clock.seconds("set")
        time.sleep(0.02)
        assert clock.seconds("set") == set_s  # the set's segment stopped when the stage moved on
        assert clock.count("evaluation") == 1 and 0 < clock.seconds("evaluation") < 1
        assert set_s + clock.seconds("evaluation") <= clock.seconds()
    saved = read_segments(path)
    assert abs(saved["set"][2] - (set_s - 120.5)) < 2e-3
    assert saved["set"][:2] == [100.0, 20.5] and saved["set"][2] >= 0.02
    assert len(saved["evaluation"]) == 1 and saved["evaluation"][0] >= 0.02


def test_a_running_segment_is_on_disk_before_the_process_ends(tmp_path: Path) -> None:
    """A process killed at the end of a stop never exits the clock: its time so far is already in the file."""
    path = tmp_path / "wall.json"
    with WallClock(path, "set", every=0.01):
        deadline = time.monotonic() + 10
        while not (path.exists() and read_segments(path)["set"][0] > 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert read_segments(path)["set"][0] > 0


def test_no_file_means_no_earlier_segments(tmp_path: Path) -> None:
    assert read_segments(tmp_path / "wall.json") == {}


def test_a_cell_begun_without_a_clock_has_a_segment_of_unknown_length(tmp_path: Path) -> None:
    path = tmp_path / "wall.json"
    with WallClock(path, "set", unrecorded=True) as clock:
        assert clock.count("set") == 2 and clock.unrecorded("set") == 1 and clock.unrecorded("evaluation") == 0
        assert 0 <= clock.seconds("set") < 1  # the known segment only: a lower bound
    assert read_segments(path)["set"][0] is None
    with WallClock(path, "evaluation") as clock:  # a later process keeps the unknown segment where it was
        assert clock.unrecorded() == 1 and clock.count("set") == 2


def test_the_segment_is_on_disk_from_the_start_and_a_folder_moved_aside_is_not_recreated(tmp_path: Path) -> None:
    """Written on entry (a process killed within its first minute leaves its segment, so the next one does not take
    the cell for one begun without a clock); a cell's folder moved to stale/ meanwhile is left moved."""
    path = tmp_path / "work" / "cell" / "wall.json"
    with WallClock(path, "set", every=0.01):
        assert list(read_segments(path)) == ["set"]
        (tmp_path / "work" / "cell").rename(tmp_path / "stale")
        time.sleep(0.1)
    assert not (tmp_path / "work" / "cell").exists() and (tmp_path / "stale" / "wall.json").exists()
