"""The JSON ledger: round trip, atomic save, never loses an entry, bad files name themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privlm.errors import UserError
from privlm.privacy.accountant import PrivacyAccountant
from privlm.privacy.events import GaussianRelease, PoissonGaussianStep
from privlm.privacy.ledger import Ledger, LedgerEntry, new_run_id


def _ledger() -> Ledger:
    ledger = Ledger()
    ledger.append(LedgerEntry(PoissonGaussianStep(0.02, 1.2), 100, "epoch 1"))
    ledger.record(PoissonGaussianStep(0.02, 1.2, "hutchpp", 96), 50, "epoch 2")
    ledger.append(LedgerEntry({"kind": "gaussian_release", "noise_multiplier": 40.0}, 2))
    return ledger


def test_save_load_round_trip(tmp_path: Path) -> None:
    ledger = _ledger()
    path = tmp_path / "run" / "ledger.json"
    ledger.save(path)
    loaded = Ledger.load(path)
    assert loaded.entries == ledger.entries
    assert json.loads(path.read_text())["entries"][1]["event"]["clipping"] == "hutchpp"
    assert [p.name for p in path.parent.iterdir()] == ["ledger.json"]  # no temporary file left behind


def test_ledger_epsilon_equals_accountant_of_its_entries(tmp_path: Path) -> None:
    ledger = _ledger()
    direct = PrivacyAccountant(value_discretization=1e-3)
    direct.record(PoissonGaussianStep(0.02, 1.2), 100)
    direct.record(PoissonGaussianStep(0.02, 1.2, "hutchpp", 96), 50)
    direct.record(GaussianRelease(40.0), 2)
    assert ledger.accountant(value_discretization=1e-3).epsilon(1e-5) == pytest.approx(direct.epsilon(1e-5), rel=1e-12)


def test_resume_appends_and_refuses_to_drop_entries(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    first = _ledger()
    first.save(path)
    resumed = Ledger.load(path)
    resumed.record(PoissonGaussianStep(0.02, 1.2), 10, "resumed")
    resumed.save(path)
    assert len(Ledger.load(path)) == 4
    with pytest.raises(UserError, match="ledger.json"):
        first.save(path)  # stale copy: would lose the resumed entry
    assert len(Ledger.load(path)) == 4


def test_failed_save_leaves_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.json"
    ledger = _ledger()
    ledger.save(path)
    before = path.read_text()
    ledger.record(GaussianRelease(3.0))

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("privlm.privacy.ledger.os.replace", boom)
    with pytest.raises(OSError):
        ledger.save(path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not a readable JSON"),
        ('{"format": "other", "entries": []}', "not a privlm ledger"),
        ('{"format": "privlm-ledger", "version": 1, "entries": [{"event": {"kind": "x"}}]}', "entry 0"),
        (
            '{"format": "privlm-ledger", "version": 1, "entries": [{"event": {"kind": "gaussian_release", '
            '"noise_multiplier": 1.0}, "count": 0}]}',
            "entry 0",
        ),
    ],
)
def test_bad_file_raises_user_error_naming_it(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(UserError, match=message) as info:
        Ledger.load(path)
    assert "bad.json" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such ledger"):
        Ledger.load(tmp_path / "absent.json")


def test_seeded_ledgers_say_they_are_not_private_releases(tmp_path):
    seeded = Ledger(private_release=False)
    seeded.record(GaussianRelease(noise_multiplier=2.0), 1, "seeded")
    seeded.save(tmp_path / "seeded.json")
    assert json.loads((tmp_path / "seeded.json").read_text())["private_release"] is False
    assert Ledger.load(tmp_path / "seeded.json").private_release is False
    old = Ledger.load(tmp_path / "seeded.json").to_dict()
    del old["private_release"]  # a ledger written before the flag existed reads as a private release
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert Ledger.load(tmp_path / "old.json").private_release is True


def test_prefix_keeps_the_first_releases_and_cuts_an_entry_in_two():
    step = PoissonGaussianStep(0.01, 1.0)
    ledger = Ledger(private_release=False)
    ledger.record(step, 3, "steps 1-3")
    ledger.record(step, 4, "steps 4-7")
    assert ledger.count == 7 and ledger.prefix(7) is ledger
    cut = ledger.prefix(5)
    assert [(e.count, e.label) for e in cut] == [(3, "steps 1-3"), (2, "steps 4-5")]
    assert cut.count == 5 and cut.private_release is False
    assert [e.count for e in ledger.prefix(3)] == [3] and ledger.prefix(0).count == 0


def test_a_run_identity_is_kept_through_save_load_and_prefix_and_read_as_none_from_older_files(tmp_path):
    ledger = Ledger(run=new_run_id())
    ledger.record(GaussianRelease(noise_multiplier=2.0), 3)
    assert len(ledger.run) == 16 and new_run_id() != ledger.run  # 64 random bits: two runs never share one
    ledger.save(tmp_path / "run.json")
    assert Ledger.load(tmp_path / "run.json").run == ledger.run == ledger.prefix(1).run
    old = ledger.to_dict()
    del old["run"]  # written before ledgers had an identity
    assert Ledger.from_dict(old).run is None and "run" not in Ledger.from_dict(old).to_dict()
    with pytest.raises(UserError, match="kept: a ledger's run identity"):
        Ledger.from_dict({**old, "run": 7}, "kept")


def test_a_run_never_writes_over_another_runs_ledger_even_with_the_same_events(tmp_path):
    path = tmp_path / "privacy.json"
    first = Ledger(run=new_run_id())
    first.record(GaussianRelease(noise_multiplier=2.0), 1, "release")
    first.save(path)
    again = Ledger(run=new_run_id())  # a second run at the same path, the same settings: the same events
    again.record(GaussianRelease(noise_multiplier=2.0), 1, "release")
    with pytest.raises(UserError, match="another run's"):
        again.save(path)
    with pytest.raises(UserError, match="another run's"):
        Ledger(first.entries).save(path)  # nor may a ledger without an identity
    resumed = Ledger.load(path)
    resumed.record(GaussianRelease(noise_multiplier=2.0), 1, "release")
    resumed.save(path)  # the same run goes on
    assert Ledger.load(path).count == 2 and Ledger.load(path).run == first.run
    older = tmp_path / "older.json"
    Ledger(first.entries).save(older)  # written by an older privlm: no identity
    Ledger([*first.entries, *first.entries], run=first.run).save(older)  # may be continued under one
    assert Ledger.load(older).run == first.run
