"""The run-folder pieces shared by PE, dp-finetune and GRADMM: run.json bound or written (byte layout kept),
the write-ahead ledger, and the ε a sidecar reports (never below the target, NaN never hidden)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from privlm.errors import UserError
from privlm.privacy.events import GaussianRelease
from privlm.privacy.ledger import Ledger, LedgerEntry
from privlm.runfolder import (
    RunFolder,
    check_or_write_settings,
    epsilon_statement,
    reported_epsilon,
    write_ahead,
)

ENTRY = LedgerEntry(GaussianRelease(2.0, snapped=4), 1, "a release")


def test_settings_are_written_in_each_layout_then_checked(tmp_path) -> None:
    settings = {"b": 1, "a": [1, 2]}
    for indent, newline, text in (
        (2, True, json.dumps(settings, indent=2, sort_keys=True) + "\n"),
        (None, True, '{"a": [1, 2], "b": 1}\n'),
        (2, False, json.dumps(settings, indent=2, sort_keys=True)),
    ):
        path = tmp_path / f"{indent}{newline}" / "run.json"
        check_or_write_settings(path, settings, indent=indent, newline=newline)
        assert path.read_text() == text
        check_or_write_settings(path, dict(settings), indent=indent, newline=newline)  # same settings: accepted
        assert path.read_text() == text
        with pytest.raises(UserError, match="--resume: b was 1"):
            check_or_write_settings(path, {**settings, "b": 2})


def test_settings_check_can_be_forced_off_or_upgraded(tmp_path) -> None:
    path = tmp_path / "run.json"
    check_or_write_settings(path, {"a": 1})
    check_or_write_settings(path, {"a": 2}, check=False)  # a fresh draw rewrites the settings
    assert json.loads(path.read_text()) == {"a": 2}
    check_or_write_settings(path, {"a": 2, "new": 0}, upgrade=lambda saved: {**saved, "new": 0})
    with pytest.raises(UserError, match="new"):
        check_or_write_settings(path, {"a": 2, "new": 0})


def test_write_ahead_appends_every_entry_unless_recorded(tmp_path) -> None:
    path = tmp_path / "privacy.json"
    write_ahead(path, ENTRY)
    write_ahead(path, ENTRY)
    write_ahead(path, ENTRY, unless_recorded=True)
    assert [e.event for e in Ledger.load(path)] == [ENTRY.event, ENTRY.event]
    assert Ledger.load(path).run is not None  # a new ledger has its run's identity, kept by every append
    write_ahead(tmp_path / "another" / "privacy.json", ENTRY)
    assert Ledger.load(tmp_path / "another" / "privacy.json").run not in (None, Ledger.load(path).run)


def test_reported_epsilon_is_never_below_the_target_and_never_hides_nan() -> None:
    assert reported_epsilon(4.0, 3.0) == 4.0 and reported_epsilon(4.0, 5.0) == 5.0
    assert reported_epsilon(4.0, math.inf) == math.inf
    assert math.isnan(reported_epsilon(4.0, math.nan))


def test_epsilon_statement_reports_the_ledger() -> None:
    ledger = Ledger([ENTRY])
    block = epsilon_statement(
        ledger, 0.001, 1e-5, ledger_file=Path("out.jsonl.x/privacy.json"), sidecar=Path("out.privacy.json")
    )
    accounted = ledger.epsilon(1e-5)
    assert block == {
        "dp": True,
        "epsilon": max(0.001, accounted),
        "epsilon_target": 0.001,
        "epsilon_accounted": accounted,
        "delta": 1e-5,
        "ledger": [ENTRY.to_dict()],
        "ledger_file": "out.jsonl.x/privacy.json",
    }  # relative to the sidecar's folder; a ledger without an identity names none
    named = Ledger([ENTRY], run="0123456789abcdef")
    block = epsilon_statement(named, 0.001, 1e-5, ledger_file=Path("l.json"), sidecar=Path("s.privacy.json"))
    assert block["ledger_run"] == "0123456789abcdef"


def test_run_folder_paths(tmp_path) -> None:
    class Paths(RunFolder):
        SUFFIX = ".x"

    paths = Paths(tmp_path / "a.jsonl")
    assert paths.workdir == tmp_path / "a.jsonl.x" and paths.manifest == tmp_path / "a.jsonl.x" / "run.json"
    assert paths.ledger == tmp_path / "a.jsonl.x" / "privacy.json" and paths.sidecar == tmp_path / "a.privacy.json"
