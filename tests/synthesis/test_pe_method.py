"""The ``pe`` method inside an experiment (tiny model): DP rows, one private pass shared by the cells."""

from __future__ import annotations

import json
from pathlib import Path

import privlm.synthesis.pe.mechanism as pe
from privlm.experiments.config import parse_config
from privlm.experiments.grid_privacy import grid_privacy
from privlm.experiments.runner import run_experiment


def _write_data(tmp_path: Path) -> Path:
    texts = {"bad": "a dull, slow film", "great": "a warm, funny film"}
    lines = [json.dumps({"text": f"{texts[name]} {i}", "label": name}) for i in range(20) for name in texts]
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path / "data.jsonl"


def test_pe_cells_spend_their_epsilon_and_share_one_private_pass(tmp_path: Path, monkeypatch) -> None:
    passes = []
    real = pe.PrivateVoter.__init__

    def counting(self, embed, load_private, *args) -> None:
        real(self, embed, lambda: passes.append(1) or load_private(), *args)

    monkeypatch.setattr(pe.PrivateVoter, "__init__", counting)
    config = parse_config(
        {
            "model": "tiny-llama",
            "dataset": f"jsonl:{_write_data(tmp_path)}",
            "labels": ["bad", "great"],
            "pool_per_class": "all",
            "n_per_class": [2],
            "seeds": [0],
            "test_size": 6,
            "mia": False,
            "finetune": {"preset": "tiny", "epochs": 1},
            "methods": {
                "pe": {
                    "epsilons": ["none", 2.0],
                    "iterations": 2,
                    "variations": 1,
                    "max_new_tokens": 6,
                    "max_tokens": 16,
                }
            },
        },
        "test",
    )
    out = tmp_path / "out"
    rows = run_experiment(config, out)
    assert [(r["epsilon"], r["delta"]) for r in rows] == [(None, None), (2.0, 1e-5)]
    dp_set = [json.loads(line) for line in (out / "sets" / f"{rows[1]['cell']}.jsonl").read_text().splitlines()]
    assert len(dp_set) == 4 and all(r["dp"] is True and 2.0 <= r["epsilon_spent"] < 2.01 for r in dp_set)
    assert len(list((out / "work" / "private-cache").rglob("pe-embeddings-*.npz"))) == 1
    assert passes == [1]  # the pool is read once, by the first cell; the second reads the private cache
    spent = grid_privacy(out, rows, 1e-5)  # the DP cell's sidecar names its run's ledger
    sidecar = json.loads((out / "work" / rows[1]["cell"] / "synthetic.privacy.json").read_text())
    assert (spent.dp_cells, spent.ledgers, spent.unaccounted) == (1, 1, ())
    assert spent.epsilon == sidecar["epsilon_accounted"]
