"""The data card of a synthetic set: ``FILE.card.md`` beside ``FILE.jsonl`` and its sidecar ``FILE.privacy.json``.

What a person who receives the set reads first: what it is (method, public model, size per class), what it
costs in privacy and what that guarantee covers and rests on, which inputs were public, and how it was
made. Everything on the card comes from the run's public settings, its privacy statement (the sidecar) and
the released rows themselves: no private row, count or statistic is read to write it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from privlm.atomic import write_text_atomic

CARD_SUFFIX = ".card.md"
# sidecar keys the card states in its own words, or that are too long for a card (the sidecar has them all)
_STATED = {
    "dp",
    "public",
    "noise_only",
    "epsilon",
    "delta",
    "epsilon_target",
    "epsilon_accounted",
    "ledger",
    "ledger_file",
    "ledger_run",
    "warning",
}
_GUARANTEE = (
    "Example-level (ε, δ)-differential privacy with respect to the private set the run read (add/remove-one "
    "adjacency: any one example added or removed changes the probability of any output by at most e^ε, up "
    "to δ). It covers this file as a whole; every other release of the same private data (another set, a "
    "model trained on it) costs its own ε, and releases compose."
)
_ASSUMPTIONS = (
    "the noise comes from the operating system's randomness (no user seed reproduces it)",
    "everything after the noisy release (generation, filtering, selection) reads only the release and "
    "public inputs: post-processing",
    "the private set is what the run read (its train split, or the file given); a selection from a larger "
    "file is not covered as that file",
    "the public inputs below were not derived from the private rows",
)
# a ledger of DP-SGD steps (Poisson sampling at rate q = B/N) states N: DP-SGD's accounting takes it as public
_SIZE_PUBLIC = (
    "the private set's size N is public, as in every DP-SGD run: the sidecar's ledger states the sampling rate "
    "q = B/N, from which N follows"
)


def card_path(out: Path) -> Path:
    """``FILE.card.md``, the data card of the output ``FILE.jsonl``."""
    return Path(out).with_suffix(CARD_SUFFIX)


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)) and len(value) > 6:
        return f"{len(value)} values"
    return str(value)


def spends_privacy(privacy: Mapping[str, Any]) -> bool:
    """Whether the statement ``privacy`` (a sidecar) is a DP release of private data: ``dp`` and not a
    ``noise_only`` control, which is a release of pure noise that read no data (it spends ε = 0)."""
    return bool(privacy.get("dp")) and not privacy.get("noise_only")


def _source_note(privacy: Mapping[str, Any]) -> str:
    """What the card may say of the private rows: a DP or public set holds none of them; any other may."""
    if privacy.get("dp") or privacy.get("public"):
        return "never copied here: the rows are synthetic"
    return "read without a guarantee: the rows may be its own examples, or text derived from them"


def data_card(
    *,
    out: Path,
    method: str,
    model: str,
    data: str,
    rows: Sequence[Mapping[str, Any]],
    privacy: Mapping[str, Any],
    public: Mapping[str, Any],
    private_release: bool = True,
    command: str | None = None,
    version: str = "",
    note: str | None = None,
    sidecar: bool = True,
) -> str:
    """The card (Markdown) of the set ``rows`` written to ``out`` by ``method`` with the public ``model``
    from the private ``data`` (its name or path), with the run's ``privacy`` statement (the sidecar) and
    its ``public`` inputs (class names, template, description, instructions: name → value).
    ``private_release``: the ledger's flag; False (seeded noise, e.g. ``--seed`` of a DP-SGD run or a test)
    puts a warning first: a seed reproduces the noise, so the stated ε is not a guarantee. ``privacy`` with
    ``public: True`` (and no ``dp``) states a set made from public inputs only, as does ``noise_only: True`` (a
    control's release of pure noise: no warning of seeded noise, no guarantee section); ``note``: a paragraph
    of its own after the privacy statement (e.g. what publishing it beside other sets costs); ``sidecar``:
    whether ``FILE.privacy.json`` lies beside the set (listed under the files)."""
    counts = Counter(str(row.get("label_name", row.get("label"))) for row in rows)
    lines = [f"# Synthetic data set `{Path(out).name}`", ""]
    lines += [
        f"- **Rows:** {len(rows)} ({', '.join(f'{name}: {n}' for name, n in counts.items())})",
        f"- **Method:** `{method}`; public model `{model}`",
        f"- **Private source:** `{data}` ({_source_note(privacy)})",
    ]
    if spends_privacy(privacy) and not private_release:
        lines += [
            "- **WARNING: seeded noise.** Whoever knows the seed regenerates the noise: the ε below is what the run"
            " spent, not a guarantee. Do not share this file where the private data may not go."
        ]
    if privacy.get("noise_only"):  # its noise may be seeded: it hides nothing, so that is no warning
        lines += [
            "- **Privacy: no private data was read** (ε = 0): a control, selected with a release of pure noise"
            " (no gradient of any example) from the public model and the public inputs below only.",
        ]
    elif privacy.get("dp"):
        epsilon = privacy["epsilon"]
        accounted = privacy.get("epsilon_accounted")
        lines += [
            f"- **Privacy: (ε = {epsilon:.4g}, δ = {privacy['delta']:.3g})-DP** for the whole file"
            + (
                f" (ε accounted {accounted:.4g} by PLD over the run's ledger, target {privacy.get('epsilon_target'):.4g};"
                " the card states the larger)"
                if isinstance(accounted, float) and math.isfinite(accounted)
                else ""
            ),
            "",
            "## The guarantee",
            "",
            _GUARANTEE,
            "",
            "It rests on these assumptions:",
            "",
            *[f"- {a}" for a in _ASSUMPTIONS],
            *([f"- {_SIZE_PUBLIC}"] if _states_size(privacy) else []),
        ]
    elif privacy.get("public"):
        lines += [
            "- **Privacy: no private data was read** (ε = 0): the rows come from the public model and the public"
            " inputs below only.",
        ]
    else:
        lines += [
            f"- **NOT differentially private:** {privacy.get('warning', 'no noise was added')}",
            "",
            "Do not share this file where the private data may not go.",
        ]
    if note:
        lines += ["", "## Publishing it with other sets", "", note]
    details = {k: v for k, v in privacy.items() if k not in _STATED}
    if details:
        lines += ["", "## How the privacy was spent (from the sidecar)", ""]
        lines += [f"- `{k}`: {_value(v)}" for k, v in details.items()]
    lines += ["", "## Public inputs", ""]
    lines += [f"- {name}: {_value(value)}" for name, value in public.items() if value is not None] or ["- none"]
    lines += ["", "## Files", ""]
    lines += [
        f"- `{Path(out).name}`: the rows (text, label, label_name, method fields)",
        *(
            [f"- `{Path(out).with_suffix('.privacy.json').name}`: the privacy statement and the ledger of every draw"]
            if sidecar
            else []
        ),
        f"- `{card_path(out).name}`: this card",
    ]
    if command or version:
        lines += ["", "## Made by", ""]
        lines += [f"- privlm {version}".rstrip()] if version else []
        lines += [f"- `{command}`"] if command else []
    return "\n".join(lines) + "\n"


def _states_size(privacy: Mapping[str, Any]) -> bool:
    """Whether the statement's ledger holds a Poisson-sampled event (a DP-SGD step), whose rate q = B/N states N."""
    return any("sample_rate" in entry.get("event", {}) for entry in privacy.get("ledger", []))


def write_data_card(out: Path, **fields: Any) -> Path:
    """Write :func:`data_card` to ``FILE.card.md`` atomically; returns its path."""
    path = card_path(out)
    write_text_atomic(path, data_card(out=out, **fields))
    return path
