"""Training-set JSONL reader, atomic writes and the append-only results log (torn last line)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from privlm.errors import UserError
from privlm.experiments.records import ResultsLog, read_training_set, write_jsonl_atomic

NAMES = ["bad", "great"]


def test_training_set_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    write_jsonl_atomic(path, [{"text": "ok", "label": 1, "label_name": "great"}, {"text": "meh", "label": 0}])
    assert read_training_set(path, NAMES) == [("ok", 1), ("meh", 0)]
    assert [p.name for p in tmp_path.iterdir()] == ["train.jsonl"]  # no temp file left
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    cases = {
        '{"text": "a", "label": 0}\n{"text": "b", "label": true}\n': f"{path}:2: 'label' must be an integer",
        '{"text": "", "label": 0}\n': f"{path}:1: expected an object",
        "not json\n": f"{path}:1: not valid JSON",
        '{"text": "a", "label": 0, "label_name": "great"}\n': "does not match class 0",
        "\n": "no examples",
    }
    for content, message in cases.items():
        path.write_text(content)
        with pytest.raises(UserError, match=message):
            read_training_set(path, NAMES)
    path.write_bytes(b'{"text": "\xff", "label": 0}\n')
    with pytest.raises(UserError, match="not UTF-8"):
        read_training_set(path, NAMES)


def test_atomic_write_leaves_the_old_file_when_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    write_jsonl_atomic(path, [{"text": "old", "label": 0}])

    def rows():
        yield {"text": "new", "label": 1}
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_jsonl_atomic(path, rows())
    assert path.read_text() == '{"label": 0, "text": "old"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["set.jsonl"]


def test_results_log_appends_and_drops_a_torn_last_line(tmp_path: Path) -> None:
    log = ResultsLog(tmp_path / "results.jsonl")
    assert log.read() == []
    log.append({"cell": "a", "accuracy": 0.5})
    log.append({"cell": "b", "accuracy": 0.75})
    with open(log.path, "a") as handle:
        handle.write('{"cell": "c", "accur')  # crash mid-write
    assert [r["cell"] for r in log.read()] == ["a", "b"]
    assert log.path.read_text().endswith("}\n")
    log.append({"cell": "c", "accuracy": 1.0})
    assert [json.loads(line)["cell"] for line in log.path.read_text().splitlines()] == ["a", "b", "c"]
    log.path.write_text('{"cell": "a"}\ngarbage\n{"cell": "b"}\n')
    with pytest.raises(UserError, match="results.jsonl:2"):
        log.read()
