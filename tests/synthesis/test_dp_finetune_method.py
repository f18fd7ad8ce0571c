"""The ``dp-finetune-gen`` method in an experiment (tiny model): the cells differing in n share one DP run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import privlm.synthesis.dp_finetune.mechanism as dp_finetune
from privlm.experiments.config import ExperimentConfig, parse_config
from privlm.experiments.grid_privacy import grid_privacy
from privlm.experiments.runner import run_experiment
from privlm.privacy.ledger import Ledger


def _config(tmp_path: Path, epsilons: list, sizes: list[int]) -> ExperimentConfig:
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"text": f"{w} movie {i}", "label": y}) + "\n"
            for i in range(12)
            for w, y in (("a dreary", "bad"), ("a charming", "great"))
        )
    )
    return parse_config(
        {
            "model": "tiny-llama",
            "dataset": f"jsonl:{data}",
            "labels": ["bad", "great"],
            "pool_per_class": "all",
            "n_per_class": sizes,
            "seeds": [0],
            "test_size": 4,
            "mia": False,
            "finetune": {"preset": "tiny", "epochs": 1},
            "methods": {
                "dp-finetune-gen": {
                    "epsilons": epsilons,
                    "lora": 2,
                    "lora_layers": 1,
                    "batch_size": 8,
                    "epochs": 1.0,
                    "max_text_tokens": 6,
                    "max_new_tokens": 6,
                }
            },
        },
        "test",
    )


def test_cells_of_one_epsilon_and_seed_share_one_training_run(tmp_path: Path, monkeypatch) -> None:
    runs = []
    real = dp_finetune.train_loop
    monkeypatch.setattr(dp_finetune, "train_loop", lambda *a, **k: runs.append(1) or real(*a, **k))
    rows = run_experiment(_config(tmp_path, [3.0], [1, 2]), tmp_path / "out")
    assert [r["n_train"] for r in rows] == [2, 4] and runs == [1]
    # the texts were sampled piece by piece into the shared run's folder: one piece per class and n
    (run_dir,) = {p.parent.parent for p in tmp_path.rglob("samples/sample-*.json")}
    assert run_dir.name.startswith("dpft-") and len(list((run_dir / "samples").iterdir())) == 4
    for row in rows:
        synthetic = (tmp_path / "out" / "sets" / f"{row['cell']}.jsonl").read_text().splitlines()
        assert all(json.loads(line)["epsilon_spent"] == 3.0 for line in synthetic)
    # both cells' sidecars name the one shared run: its ledger and its identity, so the grid counts it once
    sidecars = [
        json.loads((tmp_path / "out" / "work" / r["cell"] / "synthetic.privacy.json").read_text()) for r in rows
    ]
    ledger = Ledger.load(run_dir / "privacy.json")
    assert ledger.run is not None and [s["ledger_run"] for s in sidecars] == [ledger.run] * 2
    spent = grid_privacy(tmp_path / "out", rows, 1e-5)
    assert (spent.dp_cells, spent.ledgers, spent.releases, spent.unaccounted) == (2, 1, ledger.count, ())
    assert spent.epsilon == pytest.approx(sidecars[0]["epsilon_accounted"])
    # the runner kept a public copy of the accounting: the statement survives the loss of the private work folder
    shutil.rmtree(tmp_path / "out" / "work")
    kept = grid_privacy(tmp_path / "out", rows, 1e-5)
    assert (kept.epsilon, kept.ledgers, kept.kept, kept.unaccounted) == (spent.epsilon, 1, 1, ())


def test_a_cell_at_epsilon_none_trains_without_noise_and_is_not_private(tmp_path: Path) -> None:
    """ε 'none': the same run with σ = 0; its row, set and card say NOT private and the grid spends nothing."""
    (row,) = run_experiment(_config(tmp_path, ["none"], [2]), tmp_path / "out")
    assert row["epsilon"] is None and row["n_train"] == 4
    synthetic = (tmp_path / "out" / "sets" / f"{row['cell']}.jsonl").read_text().splitlines()
    assert all(not json.loads(line)["dp"] and "epsilon_spent" not in json.loads(line) for line in synthetic)
    sidecar = json.loads((tmp_path / "out" / "work" / row["cell"] / "synthetic.privacy.json").read_text())
    assert sidecar["dp"] is False and "σ = 0" in sidecar["mechanism"]
    card = (tmp_path / "out" / "sets" / f"{row['cell']}.card.md").read_text()
    assert "**NOT differentially private:** DP-SGD's clipping without noise (σ = 0)" in card
    spent = grid_privacy(tmp_path / "out", [row], 1e-5)
    assert (spent.dp_cells, spent.ledgers, spent.unaccounted) == (0, 0, ())
