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


def test_a_whole_last_line_without_its_newline_is_kept_and_the_next_chunk_goes_on_its_own_line(tmp_path) -> None:
    path = tmp_path / "j.jsonl"
    Journal(path, "k").add(0, "first")
    path.write_text(path.read_text() + json.dumps({"chunk": 1, "value": "second"}))  # killed before the newline
    reopened = Journal(path, "k")
    reopened.add(2, "third")
    assert Journal(path, "k").done == {0: "first", 1: "second", 2: "third"}


def test_an_unreadable_line_drops_what_follows_it_never_a_wrong_chunk(tmp_path) -> None:
    path = tmp_path / "j.jsonl"
    journal = Journal(path, "k")
    for chunk in range(3):
        journal.add(chunk, chunk * 10)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1], '{"other": 1}', lines[3]]) + "\n")
    assert Journal(path, "k").done == {0: 0}
