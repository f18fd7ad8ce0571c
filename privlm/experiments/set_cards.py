"""The data card of each grid cell's set, ``DIR/sets/<cell>.card.md``, so a set taken out of a study folder
carries what it costs and what it rests on.

The card is :func:`privlm.synthesis.card.data_card` (what ``privlm synth`` writes), from public inputs only:
the grid's public settings, the method's parameters and privacy label, the released rows, and the privacy
statement the method wrote beside its set in ``DIR/work/<cell>/`` (its sidecar; where that folder was lost, the
copy kept in ``DIR/accounting.json``). No private row, count or
statistic is read. A set whose method reads no private data is stated as such; one that uses private rows
directly, or a DP method's set whose sidecar is missing, is stated as NOT differentially private: the card
never claims a guarantee the sidecar does not back. Only a set that spends privacy carries the grid's note on
composing the cells' releases (:data:`GRID_NOTE`); a public, noise-only or non-private set composes nothing.
The sidecar itself is not copied beside the set: the grid's rows already state each cell's release (and
``research/privacy_across_studies.py`` counts every committed sidecar as a release of its own, so a copy would
be counted twice).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from privlm.experiments.config import Cell, ExperimentConfig
from privlm.experiments.grid_privacy import kept_copy
from privlm.runfolder import sidecar_path
from privlm.synthesis.card import card_path, spends_privacy, write_data_card
from privlm.synthesis.registry import NON_PRIVATE, PUBLIC, SET_FILE, Method

GRID_NOTE = (
    "This set is one cell of an experiment grid. Its privacy statement covers this set alone; publishing the "
    "sets of several cells of the grid costs their composition, stated in the grid's report (its grid-privacy "
    "statement), never the largest ε of one cell."
)


def cell_privacy(method: Method, workdir: Path) -> tuple[dict[str, Any], bool]:
    """``(statement, private_release)``: the sidecar the method wrote in ``workdir`` (``DIR/work/<cell>``; less
    ``ledger_file``, a path into the private work folder), else its copy kept in ``DIR/accounting.json``
    (:func:`~privlm.experiments.grid_privacy.keep_accounting`: the work folder was lost), or for a method that
    reads no private data ``{"public": True}``, or else ``{"dp": False, "warning": ...}`` (a DP method's
    warning says its statement was lost: a card never claims a guarantee it cannot read). ``private_release``:
    the sidecar's own flag, else that of the ledger it names; False (the card warns of seeded noise) when
    neither can be read."""
    from privlm.privacy.ledger import Ledger

    sidecar = sidecar_path(workdir / SET_FILE)
    out = workdir.parent.parent
    kept = kept_copy(out, sidecar.relative_to(out).as_posix())
    if not sidecar.exists() and kept is None:
        if method.privacy == PUBLIC:
            return {"public": True}, True
        if method.privacy.startswith(NON_PRIVATE):  # its own words follow the prefix
            return {"dp": False, "warning": method.privacy}, True
        lost = "this cell's privacy statement (its sidecar and ledger) was lost, so no guarantee is claimed"
        return {"dp": False, "warning": f"{lost}; the method: {method.privacy}"}, True
    statement = dict(kept or {}) if not sidecar.exists() else json.loads(sidecar.read_text())
    ledger = statement.pop("ledger_file", None)
    if "private_release" in statement:
        return statement, statement["private_release"] is not False
    if ledger is None:
        return statement, False
    if (workdir / ledger).exists():
        return statement, Ledger.load(workdir / ledger).private_release
    copy = kept_copy(out, posixpath.normpath(f"{workdir.relative_to(out).as_posix()}/{ledger}"))
    return statement, copy is not None and Ledger.from_dict(copy, "kept ledger").private_release


def write_set_card(
    out: Path,
    cell: Cell,
    method: Method,
    config: ExperimentConfig,
    public: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
) -> Path:
    """Write ``out/sets/<cell>.card.md`` for the cell's released ``rows``. ``public``: the grid's public
    inputs (class names, label words, template, description), to which the method's parameters and the
    grid's configuration (``configs/<hash>.json`` of the run that writes the card) are added; nothing
    run-specific (times, paths, the command line), so an interrupted and resumed grid writes the cards an
    uninterrupted one does. Returns the card's path."""
    from privlm import __version__

    privacy, private_release = cell_privacy(method, out / "work" / cell.key)
    spec = next(m for m in config.methods if m.name == cell.method)
    return write_data_card(
        out / "sets" / f"{cell.key}.jsonl",
        method=cell.method,
        model=config.model,
        data=str(config.dataset or config.train),
        rows=rows,
        privacy=privacy,
        private_release=private_release,
        public={
            **public,
            **{f"method parameter {k}": v for k, v in sorted(spec.params.items())},
            "grid configuration": f"configs/{config.hash}.json",
        },
        version=__version__,
        note=GRID_NOTE if spends_privacy(privacy) else None,
        sidecar=False,
    )


def has_card(out: Path, cell: Cell) -> bool:
    """Whether the cell's set already has its card."""
    return card_path(out / "sets" / f"{cell.key}.jsonl").exists()
