"""Append-only JSON ledger of every privacy-relevant release, for reporting and resume.

File format (UTF-8 JSON)::

    {"format": "privlm-ledger", "version": 1, "private_release": true, "run": "9f2c4e1a0b7d3386",
     "entries": [{"event": {"kind": "poisson_gaussian_step", ...}, "count": 100, "label": "epoch 1"}, ...]}

(``private_release`` is false for seeded runs; a file without it, from an older privlm, reads as true.
``run`` is the identity of the run that writes the ledger (:func:`new_run_id`): two runs with the same settings
book the same events, and only ``run`` tells their ledgers apart; a file without it, from an older privlm,
has none.)

Guarantees: :meth:`Ledger.save` writes a temporary file in the same folder and ``os.replace``-s it, so a
crash never leaves a half-written ledger; it refuses to overwrite a ledger file whose entries are not a
prefix of this ledger's entries (so a stale in-memory copy can never drop entries recorded by another
run) or that names another run than this ledger's (a file without a name, from an older privlm, may be
continued by a ledger with one). Entries are never removed or edited.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privlm.atomic import write_text_atomic
from privlm.errors import UserError
from privlm.privacy.accountant import DEFAULT_DISCRETIZATION, Method, PrivacyAccountant
from privlm.privacy.events import Event, GaussianRelease, PoissonGaussianStep, event_from_dict
from privlm.privacy.validation import check_count

FORMAT = "privlm-ledger"
VERSION = 1


def new_run_id() -> str:
    """A fresh identity for a new run's ledger: 64 random bits from the operating system, as 16 hex digits.
    Public: it is drawn from no data and tells nothing but which run wrote a ledger."""
    return secrets.token_hex(8)


@dataclass(frozen=True)
class LedgerEntry:
    """``count`` repetitions of ``event`` (an event object or its dict form), with a free-text label."""

    event: Event
    count: int = 1
    label: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.event, dict):
            object.__setattr__(self, "event", event_from_dict(self.event))
        elif not isinstance(self.event, (PoissonGaussianStep, GaussianRelease)):
            raise UserError(f"not a privacy event: {self.event!r}")
        check_count(self.count, "count")
        if not isinstance(self.label, str):
            raise UserError(f"ledger label must be a string, got {self.label!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the event as a dict, the count and the label."""
        return {"event": self.event.to_dict(), "count": self.count, "label": self.label}

    @classmethod
    def from_dict(cls, data: Any) -> LedgerEntry:
        """Inverse of :meth:`to_dict`; raises :class:`UserError` on malformed input."""
        if not isinstance(data, dict) or "event" not in data or set(data) - {"event", "count", "label"}:
            raise UserError(f"malformed ledger entry {data!r}")
        return cls(data["event"], data.get("count", 1), data.get("label", ""))


class Ledger:
    """Ordered, append-only list of :class:`LedgerEntry`. ``private_release`` is False when the noise
    behind the entries is reproducible from a user seed (``--seed``): the ε is then what the mechanism
    would give, not a guarantee anyone holds (whoever knows the seed removes the noise). ``run``: the identity
    of the run whose draws the ledger books (:func:`new_run_id`; None for a ledger that books no run's draws,
    e.g. a composition, or one written by an older privlm)."""

    def __init__(
        self,
        entries: tuple[LedgerEntry, ...] | list[LedgerEntry] = (),
        private_release: bool = True,
        run: str | None = None,
    ) -> None:
        if run is not None and (not isinstance(run, str) or not run):
            raise UserError(f"a ledger's run identity must be a non-empty string, got {run!r}")
        self.private_release = bool(private_release)
        self.run = run
        self._entries: list[LedgerEntry] = []
        for entry in entries:
            self.append(entry)

    def append(self, entry: LedgerEntry) -> None:
        """Add one entry at the end."""
        if not isinstance(entry, LedgerEntry):
            raise UserError(f"not a ledger entry: {entry!r}")
        self._entries.append(entry)

    def record(self, event: Event, count: int = 1, label: str = "") -> LedgerEntry:
        """Shorthand for ``append(LedgerEntry(event, count, label))``; returns the entry."""
        entry = LedgerEntry(event, count, label)
        self.append(entry)
        return entry

    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        """All entries, oldest first."""
        return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def count(self) -> int:
        """Releases recorded in all (the sum of the entries' counts: a training ledger's steps)."""
        return sum(entry.count for entry in self._entries)

    def prefix(self, count: int) -> Ledger:
        """The ledger of the first ``count`` releases (an entry cut in two keeps its event and is labelled
        ``steps a-b``): a checkpoint's ledger, when the run's own ledger is already ahead of it."""
        if count == self.count:
            return self
        held, done = Ledger(private_release=self.private_release, run=self.run), 0
        for entry in self._entries:
            if done + entry.count > count:
                if count > done:
                    held.record(entry.event, count - done, f"steps {done + 1}-{count}")
                break
            held.append(entry)
            done += entry.count
        return held

    def __iter__(self) -> Iterator[LedgerEntry]:
        return iter(tuple(self._entries))

    def accountant(
        self, method: Method = "pld", value_discretization: float = DEFAULT_DISCRETIZATION
    ) -> PrivacyAccountant:
        """A fresh accountant holding every entry of this ledger."""
        accountant = PrivacyAccountant(method, value_discretization)
        for entry in self._entries:
            accountant.record(entry.event, entry.count)
        return accountant

    def epsilon(self, delta: float, method: Method = "pld") -> float:
        """ε at δ of everything in the ledger."""
        return self.accountant(method).epsilon(delta)

    def to_dict(self) -> dict[str, Any]:
        """JSON form of the whole ledger (``run`` only when it has one)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "private_release": self.private_release,
            **({"run": self.run} if self.run is not None else {}),
            "entries": [entry.to_dict() for entry in self._entries],
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically; refuse if the file on disk holds entries this ledger does not start with, or is
        another run's (its ``run`` is set and differs from this one's: a second run at the same path)."""
        path = Path(path)
        if path.exists():
            found = Ledger.load(path)
            if found.run is not None and found.run != self.run:
                raise UserError(
                    f"{path}: the ledger on disk is another run's (run {found.run}, this one {self.run}); "
                    "a run never writes over another run's ledger: choose a new output or resume that run"
                )
            on_disk = found.entries
            if self.entries[: len(on_disk)] != on_disk:
                raise UserError(
                    f"{path}: the ledger on disk has entries this one lacks ({len(on_disk)} on disk, "
                    f"{len(self)} here); load it and append instead of overwriting"
                )
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        write_text_atomic(path, text)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Ledger:
        """Read a ledger written by :meth:`save`; :class:`UserError` names the file and the problem."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as err:
            raise UserError(f"{path}: no such ledger file") from err
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise UserError(f"{path}: not a readable JSON ledger ({err})") from err
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: Any, source: str = "ledger") -> Ledger:
        """Inverse of :meth:`to_dict`; :class:`UserError` names ``source`` (where ``data`` was read) and the problem."""
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
            raise UserError(f"{source}: not a privlm ledger (expected format {FORMAT!r} with a list of entries)")
        if data.get("version") != VERSION:
            raise UserError(f"{source}: unsupported ledger version {data.get('version')!r}")
        entries = []
        for index, item in enumerate(data["entries"]):
            try:
                entries.append(LedgerEntry.from_dict(item))
            except UserError as err:
                raise UserError(f"{source}: entry {index}: {err}") from err
        try:
            return cls(entries, private_release=data.get("private_release", True) is not False, run=data.get("run"))
        except UserError as err:
            raise UserError(f"{source}: {err}") from err
