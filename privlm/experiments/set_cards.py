"""The data card of each grid cell's set: ``DIR/sets/<cell>.card.md`` (and ``<cell>.privacy.json``, a DP set's
privacy statement), so a set taken out of a study folder carries what it costs and what it rests on.

The card is :func:`privlm.synthesis.card.data_card` (what ``privlm synth`` writes), from public inputs only:
the grid's public settings, the method's parameters and privacy label, the released rows, and the privacy
statement the method wrote beside its set in ``DIR/work/<cell>/`` (its sidecar). No private row, count or
statistic is read. A set whose method reads no private data is stated as such; one that uses private rows
directly, or a DP method's set whose sidecar is missing, is stated as NOT differentially private: the card
never claims a guarantee the sidecar does not back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from privlm.atomic import write_text_atomic
from privlm.experiments.config import Cell, ExperimentConfig
from privlm.runfolder import sidecar_path
from privlm.synthesis.card import card_path, write_data_card
from privlm.synthesis.registry import PUBLIC, SET_FILE, Method

GRID_NOTE = (
    "This set is one cell of an experiment grid. Its privacy statement covers this set alone; publishing the "
    "sets of several cells of the grid costs their composition, stated in the grid's report (its grid-privacy "
    "statement), never the largest ε of one cell."
)


def cell_privacy(method: Method, workdir: Path) -> tuple[dict[str, Any], bool, bool]:
    """``(statement, from_sidecar, private_release)``: the sidecar the method wrote in ``workdir`` (less
    ``ledger_file``, a path into the private work folder; the ledger's entries stay), or for a method that
    reads no private data ``{"public": True}``, or else ``{"dp": False, "warning": ...}``.
    ``private_release``: the ledger's flag (False: seeded noise, which the card warns of)."""
    from privlm.privacy.ledger import Ledger

    sidecar = sidecar_path(workdir / SET_FILE)
    if sidecar.exists():
        statement = json.loads(sidecar.read_text())
        ledger = statement.pop("ledger_file", None)
        private = ledger is None or not (workdir / ledger).exists() or Ledger.load(workdir / ledger).private_release
        return statement, True, private
    if method.privacy == PUBLIC:
        return {"public": True}, False, True
    return {"dp": False, "warning": method.privacy}, False, True


def write_set_card(
    out: Path,
    cell: Cell,
    method: Method,
    config: ExperimentConfig,
    public: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
) -> Path:
    """Write ``out/sets/<cell>.card.md`` for the cell's released ``rows`` (and ``<cell>.privacy.json`` when the
        method wrote a sidecar); ``public``: the grid's public inputs (class names, label words, template,
        description), to which the method's parameters and the grid's configuration (``configs/<hash>.json`` of the run that writes the card)
    are added; nothing run-specific (times, paths, the command line), so an interrupted and resumed grid writes
    the cards an uninterrupted one does. Returns the card's path."""
    from privlm import __version__

    set_path = out / "sets" / f"{cell.key}.jsonl"
    privacy, has_sidecar, private_release = cell_privacy(method, out / "work" / cell.key)
    if has_sidecar:
        write_text_atomic(sidecar_path(set_path), json.dumps(privacy, indent=2, sort_keys=True) + "\n")
    spec = next(m for m in config.methods if m.name == cell.method)
    return write_data_card(
        set_path,
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
        note=GRID_NOTE,
        sidecar=has_sidecar,
    )


def has_card(out: Path, cell: Cell) -> bool:
    """Whether the cell's set already has its card."""
    return card_path(out / "sets" / f"{cell.key}.jsonl").exists()
