"""The cache root and the all-or-nothing folder writes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from privlm.resources.cache import CACHE_ENV, STALE_AFTER_S, atomic_directory, cache_root


def test_cache_root_default_and_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "privlm"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "elsewhere"))
    assert cache_root() == tmp_path / "elsewhere"


def test_complete_block_publishes_the_folder(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"
    with atomic_directory(target) as tmp:
        (tmp / "weights.bin").write_bytes(b"123")
        assert not target.exists()
    assert (target / "weights.bin").read_bytes() == b"123"
    assert sorted(p.name for p in target.parent.iterdir()) == ["m"]


def test_failed_block_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "m"
    with pytest.raises(KeyboardInterrupt):
        with atomic_directory(target) as tmp:
            (tmp / "half.bin").write_bytes(b"1")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_existing_complete_folder_wins_a_race(tmp_path: Path) -> None:
    target = tmp_path / "m"
    with atomic_directory(target) as tmp:
        (tmp / "mine.bin").write_bytes(b"mine")
        target.mkdir()
        (target / "theirs.bin").write_bytes(b"theirs")
    assert sorted(p.name for p in target.iterdir()) == ["theirs.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_stale_leftovers_of_a_killed_writer_are_removed(tmp_path: Path) -> None:
    target = tmp_path / "m"
    old, recent, other = tmp_path / ".m.old1.tmp", tmp_path / ".m.new1.tmp", tmp_path / ".other.old2.tmp"
    for folder in (old, recent, other):
        folder.mkdir()
    long_ago = time.time() - STALE_AFTER_S - 60
    os.utime(old, (long_ago, long_ago))
    os.utime(other, (long_ago, long_ago))
    with atomic_directory(target) as tmp:
        (tmp / "w.bin").write_bytes(b"1")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m", recent.name, other.name])
