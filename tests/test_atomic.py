"""Atomic writes: a failure before the rename leaves the previous file untouched."""

from __future__ import annotations

import pytest

import privlm.atomic as atomic


@pytest.mark.parametrize("write", ["text", "bytes"])
def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch, write: str) -> None:
    path = tmp_path / "out.jsonl"
    put = atomic.write_text_atomic if write == "text" else lambda p, s: atomic.write_bytes_atomic(p, s.encode())
    put(path, "old\n")

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", crash)
    with pytest.raises(OSError):
        put(path, "new\n")
    assert path.read_text() == "old\n" and list(tmp_path.iterdir()) == [path]  # no temporary left either
    monkeypatch.undo()
    put(path, "new\n")
    assert path.read_text() == "new\n"


def test_exception_while_writing_leaves_no_file_and_no_temporary(tmp_path) -> None:
    path = tmp_path / "sub" / "out.bin"

    def chunks():
        yield "half"
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        atomic.write_text_atomic(path, chunks())
    assert not path.exists() and list(path.parent.iterdir()) == []


def test_json_once_makes_a_value_once_and_returns_what_was_saved(tmp_path) -> None:
    calls = []

    def make() -> dict:
        calls.append(1)
        return {"b": [1, 2], "a": len(calls)}

    path = tmp_path / "sub" / "value.json"
    assert atomic.json_once(path, make) == {"a": 1, "b": [1, 2]}
    assert atomic.json_once(path, make) == {"a": 1, "b": [1, 2]} and len(calls) == 1
    assert atomic.json_once(None, make) == {"a": 2, "b": [1, 2]}  # no path: made each time
    assert atomic.json_once(None, make)["a"] == 3
