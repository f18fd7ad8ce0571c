"""Run folders shared by privlm's resumable mechanisms (PE, dp-finetune, GRADMM): an exclusive claim
(``flock``) while a process draws into a folder, the check that a resumed or reused run repeats the public
settings it was started with (``run.json``), the write-ahead ledger (``privacy.json``) and the ε block of the
``FILE.privacy.json`` sidecar reported from it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from privlm.atomic import write_text_atomic
from privlm.errors import UserError

if TYPE_CHECKING:  # privlm.privacy is imported where it is used: ``privlm --help`` stays light
    from privlm.privacy.ledger import Ledger, LedgerEntry

LOCK = ".lock"
MANIFEST = "run.json"
LEDGER = "privacy.json"


@dataclass(frozen=True)
class RunFolder:
    """Where a run writing ``out`` keeps its files: the folder ``out`` + :attr:`SUFFIX` with its ``run.json``
    and ledger, and the sidecar ``FILE.privacy.json`` beside ``out``. Subclasses name the suffix and their
    own files."""

    SUFFIX: ClassVar[str]
    out: Path

    @property
    def workdir(self) -> Path:
        return self.out.with_name(self.out.name + self.SUFFIX)

    @property
    def manifest(self) -> Path:
        return self.workdir / MANIFEST

    @property
    def ledger(self) -> Path:
        return self.workdir / LEDGER

    @property
    def sidecar(self) -> Path:
        return sidecar_path(self.out)

    def saved_settings(self) -> dict[str, Any]:
        """The settings saved in ``run.json``; {} when it is missing or unreadable (a folder being made, or moved)."""
        try:
            saved = json.loads(self.manifest.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return {}
        return saved if isinstance(saved, dict) else {}

    def public_files(self) -> list[Path]:
        """The files of the run folder that a resume on another machine needs besides the ledger and that are
        public: functions of the ledger's noisy draws and of public inputs only (never of the private data
        otherwise). :mod:`privlm.experiments.kept_runs` publishes them for an unfinished run. Default: none (the
        run restarts on a new machine, its lost draws still counted from the kept ledger)."""
        return []

    def releases_nothing(self) -> bool:
        """Whether the run is one that reads no private data and so books nothing and keeps no ledger (a noise-only
        control), as its settings say: :mod:`privlm.experiments.kept_runs` keeps its public files without a ledger.
        Default: False (a run whose files are kept only with the ledger that books their draws)."""
        return False


@contextlib.contextmanager
def claim(path: Path, *, wait: bool = False) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` for the block: ``False`` when another live process holds it
    (``wait``: block until it is free instead). The kernel drops the lock when its process dies, so a crash
    leaves no stale claim."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True


@contextlib.contextmanager
def hold(folder: Path, *, wait: bool = False) -> Iterator[None]:
    """Claim the run folder ``folder`` (created if needed) for the block, or a :class:`UserError` when another
    process holds it (``wait``: wait for it instead)."""
    with claim(folder / LOCK, wait=wait) as mine:
        if not mine:
            raise UserError(f"{folder} is in use by another process; wait for it to finish or use another output")
        yield


def check_settings(path: Path, settings: dict[str, Any], saved: dict[str, Any] | None = None) -> None:
    """A :class:`UserError` naming the first key (sorted) where ``settings`` differ from those saved in ``path``
    (``saved``: already read from it)."""
    saved = json.loads(path.read_text()) if saved is None else saved
    for key in sorted(set(saved) | set(settings)):
        if saved.get(key) != settings.get(key):
            raise UserError(
                f"--resume: {key} was {saved.get(key)!r} in the earlier run ({path}) but is now "
                f"{settings.get(key)!r}; resume with the same settings or remove {path.parent}"
            )


def check_or_write_settings(
    path: Path,
    settings: dict[str, Any],
    *,
    check: bool | None = None,
    upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    indent: int | None = 2,
    newline: bool = True,
) -> None:
    """Bind a run to its public settings: when ``check`` (default: ``path`` exists), :func:`check_settings`
    against those saved in ``path`` (``upgrade``: applied to the saved ones first, e.g. defaults of settings
    added since); else write ``settings`` to ``path`` (atomic; its folder created), as JSON with sorted keys,
    ``indent`` and a final newline or not (each mechanism keeps the layout its run folders always had)."""
    if path.exists() if check is None else check:
        saved = json.loads(path.read_text())
        check_settings(path, settings, upgrade(saved) if upgrade is not None else saved)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(settings, indent=indent, sort_keys=True) + ("\n" if newline else ""))


def write_ahead(path: Path, entry: LedgerEntry, *, unless_recorded: bool = False) -> None:
    """Append ``entry`` to the ledger ``path`` (a new one if there is none), durably (fsync'd, atomic), before
    the release it books is drawn; the caller holds the run folder (:func:`hold`), so no append is lost.
    ``unless_recorded``: append only when no entry of the ledger has the same event already. A new ledger gets
    a new run identity (:func:`privlm.privacy.ledger.new_run_id`)."""
    from privlm.privacy.ledger import Ledger, new_run_id

    ledger = Ledger.load(path) if path.exists() else Ledger(run=new_run_id())
    if unless_recorded and any(e.event == entry.event for e in ledger):
        return
    ledger.append(entry)
    ledger.save(path)


def reported_epsilon(target: float, accounted: float) -> float:
    """The ε a sidecar reports: the larger of the calibration ``target`` and the ledger's ``accounted`` ε, so it is
    never under-reported; an ``accounted`` that is not finite (∞, or NaN when the accountant failed) is reported
    as it is, never replaced by the target."""
    return max(target, accounted) if math.isfinite(accounted) else accounted


def sidecar_path(out: Path) -> Path:
    """``FILE.privacy.json``, the privacy sidecar of the output ``FILE.jsonl``."""
    return Path(out).with_suffix(".privacy.json")


def epsilon_statement(
    ledger: Ledger, target: float, delta: float, *, ledger_file: Path, sidecar: Path
) -> dict[str, Any]:
    """The ε part of the DP sidecar ``sidecar``: ``epsilon`` (:func:`reported_epsilon`), ``epsilon_target``,
    ``epsilon_accounted`` (PLD at ``delta`` over every entry of ``ledger``, redraws included), ``delta``, the
    ``ledger`` itself and ``ledger_file``, the write-ahead ledger it was read from, relative to the sidecar's
    folder (so a results folder can move), with ``ledger_run``, the identity of the run that ledger books (when
    it has one): :mod:`privlm.experiments.grid_privacy` follows them to compose a grid's cells, each draw once
    (a run made again at the same path has the same events and another identity)."""
    accounted = ledger.epsilon(delta)
    return {
        "dp": True,
        "epsilon": reported_epsilon(target, accounted),
        "epsilon_target": target,
        "epsilon_accounted": accounted,
        "delta": delta,
        "ledger": [entry.to_dict() for entry in ledger],
        "ledger_file": os.path.relpath(ledger_file, Path(sidecar).parent),
        **({"ledger_run": ledger.run} if ledger.run is not None else {}),
    }
