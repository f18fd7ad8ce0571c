"""The chunk journal (:class:`privlm.journal.Journal`): finished chunks survive a reopen under the same key,
another key starts empty, and a last line cut short by a kill is dropped."""

from __future__ import annotations

import json

from privlm.journal import Journal


def test_finished_chunks_are_read_back_under_the_same_key_only(tmp_path) -> None:
    path = tmp_path / "j.jsonl"
    journal = Journal(path, "k")
    assert journal.done == {}
    journal.add(0, ["a", "b"])
    journal.add(5, [["c"]])
    assert Journal(path, "k").done == {0: ["a", "b"], 5: [["c"]]}
    assert Journal(path, "other").done == {}
    assert path.read_text().splitlines() == [json.dumps({"key": "other"})]  # rewritten for the new key
    assert Journal(path, "k").done == {}


def test_a_line_cut_short_is_dropped_and_the_journal_appends_cleanly_after_it(tmp_path) -> None:
    path = tmp_path / "j.jsonl"
    journal = Journal(path, "k")
    journal.add(0, "first")
    with path.open("a") as handle:
        handle.write('{"chunk": 1, "val')  # killed mid-write
    reopened = Journal(path, "k")
    assert reopened.done == {0: "first"}
    reopened.add(1, "second")
    assert Journal(path, "k").done == {0: "first", 1: "second"}
