"""The data card (:mod:`privlm.synthesis.card`): it states the sidecar's ε and δ (never a smaller ε), warns
first when the noise was seeded or there was none, and is written from public inputs and released rows only."""

from __future__ import annotations

import math
from pathlib import Path

from privlm.synthesis.card import card_path, data_card, write_data_card

ROWS = [{"text": "a fine film", "label": 1, "label_name": "positive"}] * 3 + [
    {"text": "a dull film", "label": 0, "label_name": "negative"}
]
DP = {"dp": True, "epsilon": 3.0, "epsilon_target": 3.0, "epsilon_accounted": 2.9994, "delta": 1e-5, "clip": 1.0}


def _card(privacy: dict, **kw) -> str:
    return data_card(
        out=Path("syn.jsonl"),
        method="gradmm",
        model="smollm2-135m",
        data="rotten-tomatoes",
        rows=ROWS,
        privacy=privacy,
        public={"class names": "negative, positive", "description": None},
        **kw,
    )


def test_a_dp_card_states_epsilon_delta_the_guarantee_and_the_released_counts() -> None:
    card = _card(DP, command="privlm synth --per-class 3", version="0.1.0")
    assert "**Privacy: (ε = 3, δ = 1e-05)-DP** for the whole file" in card
    assert "ε accounted 2.999 by PLD" in card and "add/remove-one adjacency" in card
    assert "**Rows:** 4 (positive: 3, negative: 1)" in card and "`clip`: 1" in card
    assert "class names: negative, positive" in card and "description" not in card  # None: not listed
    assert "`privlm synth --per-class 3`" in card and "WARNING" not in card and "NOT differentially" not in card


def test_seeded_noise_and_no_dp_are_said_first() -> None:
    seeded = _card(DP, private_release=False)
    assert seeded.index("WARNING: seeded noise") < seeded.index("(ε = 3")
    plain = _card({"dp": False, "warning": "NOT differentially private (--no-dp): no noise"})
    assert "**NOT differentially private:** NOT differentially private (--no-dp)" in plain and "(ε =" not in plain
    assert "rows may be its own examples" in plain and "the rows are synthetic" not in plain  # e.g. a random coreset
    assert "the rows are synthetic" in seeded and "the rows are synthetic" in _card({"public": True})


def test_an_unbounded_accounted_epsilon_is_not_hidden_behind_the_target() -> None:
    card = _card({**DP, "epsilon": math.inf, "epsilon_accounted": math.inf})
    assert "(ε = inf, δ = 1e-05)" in card and "accounted" not in card


def test_the_card_is_written_beside_the_output(tmp_path: Path) -> None:
    out = tmp_path / "syn.jsonl"
    path = write_data_card(
        out, method="pe", model="m", data="d", rows=ROWS, privacy=DP, public={}, command=None, version=""
    )
    assert path == card_path(out) == tmp_path / "syn.card.md"
    assert path.read_text().startswith("# Synthetic data set `syn.jsonl`") and "- none" in path.read_text()


def test_a_noise_only_control_is_stated_as_reading_no_private_data_even_with_seeded_noise() -> None:
    control = {"dp": True, "noise_only": True, "epsilon": 0.0, "delta": 0.0, "clip": 1.0, "mechanism": "pure noise"}
    card = _card(control, private_release=False)
    assert "**Privacy: no private data was read** (ε = 0): a control" in card and "`mechanism`: pure noise" in card
    assert "WARNING" not in card and "## The guarantee" not in card and "-DP**" not in card
    assert "`noise_only`" not in card and "the rows are synthetic" in card


def test_a_dp_sgd_ledger_adds_that_the_private_sets_size_is_public() -> None:
    """DP-SGD's ledger states q = B/N (so N): the card says N is taken as public; a release without sampling
    (GRADMM's, PE's histograms) needs no N and the card does not claim it."""
    step = {"kind": "poisson_gaussian_step", "noise_multiplier": 1.2, "sample_rate": 0.06, "clipping": "exact"}
    release = {"kind": "gaussian_release", "noise_multiplier": 3.0}
    assert "size N is public" in _card({**DP, "ledger": [{"event": step, "count": 680, "label": "steps"}]})
    assert "size N is public" not in _card({**DP, "ledger": [{"event": release, "count": 1, "label": "release"}]})
    assert "size N is public" not in _card(DP)
