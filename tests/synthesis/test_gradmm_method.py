"""The ``gradmm`` method inside an experiment (tiny model, tiny ADMM): DP rows, release reused on redo."""

from __future__ import annotations

import json
from pathlib import Path

from privlm.experiments.config import ExperimentConfig, parse_config
from privlm.experiments.grid_privacy import grid_privacy
from privlm.experiments.runner import run_experiment


def test_gradmm_cells_spend_their_epsilon_once_and_are_labelled(tmp_path: Path) -> None:
    config = _grid(
        tmp_path,
        {
            "gradmm": {
                "epsilons": ["none", 2.0],
                "preset": "demo",
                "length": 3,
                "batch": 2,
                "outer_steps": 2,
                "inner_steps": 2,
                "top_k": 20,
                "oversample": 1.0,
            }
        },
    )
    out = tmp_path / "out"
    rows = run_experiment(config, out)
    assert [(r["epsilon"], r["delta"]) for r in rows] == [(None, None), (2.0, 1e-5)]
    assert all("NOT private when ε is 'none'" in r["privacy"] for r in rows)
    # GRADMM's few-shot filter may keep nothing with a random tiny model; then the base model is scored.
    dp_set = [json.loads(line) for line in (out / "sets" / f"{rows[1]['cell']}.jsonl").read_text().splitlines()]
    assert rows[1]["n_train"] == len(dp_set) <= 4
    assert all(r["dp"] is True and r["epsilon_spent"] >= 2.0 for r in dp_set)
    assert rows[1]["epsilon_spent"] == (max(r["epsilon_spent"] for r in dp_set) if dp_set else None)  # the ledger's ε
    assert rows[0]["epsilon_spent"] is None
    work = out / "work" / rows[1]["cell"]
    sidecar = json.loads((work / "synthetic.privacy.json").read_text())
    assert (
        sidecar["epsilon"] >= 2.0
        and (work / sidecar["ledger_file"]).resolve() == (work / "synthetic.jsonl.gradmm" / "privacy.json").resolve()
    )
    spent = grid_privacy(out, rows, 1e-5)
    assert (spent.dp_cells, spent.ledgers, spent.unaccounted, spent.epsilon) == (1, 1, (), sidecar["epsilon_accounted"])
    assert "Published together they cost at most" in (out / "report.md").read_text()
    release = work / "synthetic.jsonl.gradmm" / "release.pt"
    drawn = release.read_bytes()
    # Redo the DP cell as after a crash between synthesis and scoring: the release is reused, not redrawn.
    (out / "sets" / f"{rows[1]['cell']}.jsonl").unlink()
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text(lines[0] + "\n")
    again = run_experiment(config, out, resume=True)
    assert release.read_bytes() == drawn
    assert again[1]["accuracy"] == rows[1]["accuracy"]


def _grid(tmp_path: Path, methods: dict, **top: object) -> ExperimentConfig:
    """A tiny grid over the user data of :func:`_write_data` (tiny model, 2 per class, one fine-tuning epoch,
    no MIA); ``top`` overrides its top-level keys."""
    base = {
        "model": "tiny-llama",
        "dataset": f"jsonl:{_write_data(tmp_path)}",
        "labels": ["bad", "great"],
        "pool_per_class": 4,
        "n_per_class": [2],
        "seeds": [0],
        "test_size": 6,
        "mia": False,
        "finetune": {"preset": "tiny", "epochs": 1},
    }
    return parse_config({**base, **top, "methods": methods}, "test")


def _write_data(tmp_path: Path) -> Path:
    data = tmp_path / "data.jsonl"
    words = {0: ["dull", "slow", "bad"], 1: ["warm", "funny", "great"]}
    data.write_text(
        "".join(
            json.dumps({"text": f"the film is {words[y][i % 3]} number {i}", "label": ["bad", "great"][y]}) + "\n"
            for i in range(30)
            for y in (0, 1)
        )
    )
    return data


def test_the_whole_split_is_read_once_and_the_noise_control_reads_nothing(tmp_path: Path, monkeypatch) -> None:
    import privlm.synthesis.gradmm.pipeline as pipeline

    passes = []
    real = pipeline.private_factors
    monkeypatch.setattr(pipeline, "private_factors", lambda *a, **k: passes.append(len(a[2])) or real(*a, **k))
    tiny = {"preset": "demo", "length": 3, "batch": 2, "top_k": 20, "label_filter": False, "optimizer": "select"}
    config = _grid(
        tmp_path,
        {
            "gradmm": {"epsilons": ["none", 2.0], **tiny},
            "gradmm@noise": {"epsilons": [2.0], "noise_only": True, **tiny},
        },
        pool_per_class="all",
        seeds=[0, 1],
    )
    rows = run_experiment(config, tmp_path / "out")
    assert len(rows) == 6
    assert len(passes) == 1 and passes[0] > 30  # one pass over the whole train split, shared by 4 cells
    caches = list((tmp_path / "out" / "work" / "private-cache").rglob("*.pt"))
    assert len(caches) == 1
    noise = [r for r in rows if r["method"] == "gradmm@noise"]
    for row in noise:
        synthetic = (tmp_path / "out" / "sets" / f"{row['cell']}.jsonl").read_text().splitlines()
        assert all(json.loads(line)["epsilon_spent"] == 0.0 and json.loads(line)["noise_only"] for line in synthetic)


def test_whole_split_pool_needs_mia_off(tmp_path: Path) -> None:
    import pytest

    from privlm.errors import UserError

    data = {
        "model": "tiny-llama",
        "dataset": "rotten-tomatoes",
        "pool_per_class": "all",
        "n_per_class": [2],
        "seeds": [0],
        "methods": {"full-pool": {}},
    }
    with pytest.raises(UserError, match="mia = false"):
        parse_config(data, "test")
    config = parse_config({**data, "mia": False}, "test")
    assert [c.key for c in config.cells()] == ["full-pool_nall_seed0_epsnone"]


def test_instructed_cells_of_user_data_answer_the_verbalizers_instruction(tmp_path: Path, monkeypatch) -> None:
    """``source = "instruct"`` without an instruction: the runner gives GRADMM the verbalizer's instructions, as
    it gives zero-shot generation (the generic one for user data, not the movie-review default)."""
    from privlm.synthesis.gradmm import generate

    prompts: list[str] = []
    monkeypatch.setattr(
        generate,
        "sample_texts",
        lambda model, tok, prompt, n, seed, sampling: prompts.append(prompt) or [f"text {i}" for i in range(n)],
    )
    config = _grid(
        tmp_path,
        {
            "gradmm": {
                "epsilons": ["none"],
                "preset": "demo",
                "batch": 2,
                "label_filter": False,
                "optimizer": "select",
                "source": "instruct",
            }
        },
    )
    rows = run_experiment(config, tmp_path / "out")
    expected = ['Write one short text for "... Label: bad".', 'Write one short text for "... Label: great".']
    sidecar = tmp_path / "out" / "work" / rows[0]["cell"] / "synthetic.privacy.json"
    assert json.loads(sidecar.read_text())["instructions"] == expected
    assert sorted(set(prompts)) == [text + "\n" for text in expected]


def test_instructed_cells_share_one_public_candidates_dir_that_public_candidates_dir_names(
    tmp_path: Path, monkeypatch
) -> None:
    """Cells that differ only in seed, ε or the noise-only switch (one ``pool_seed``) read one public pool,
    in the folder :func:`~privlm.synthesis.gradmm.method.public_candidates_dir` names (what a study's helper
    fills ahead of the cells); another batch size is another pool."""
    from privlm.resources.datasets import load_dataset
    from privlm.resources.models import load_model
    from privlm.synthesis.gradmm import generate
    from privlm.synthesis.gradmm.config import make_config
    from privlm.synthesis.gradmm.pool import public_candidates_dir
    from privlm.synthesis.gradmm.prompt import build_prompt

    monkeypatch.setattr(
        generate, "sample_texts", lambda model, tok, prompt, n, seed, sampling: [f"text {seed} {i}" for i in range(n)]
    )
    tiny = {"preset": "demo", "batch": 2, "label_filter": False, "optimizer": "select", "source": "instruct"}
    config = _grid(
        tmp_path,
        {
            "gradmm": {"epsilons": ["none", 2.0], "pool_seed": 0, **tiny},
            "gradmm@noise": {"epsilons": [2.0], "pool_seed": 0, "noise_only": True, **tiny},
            "gradmm@wide": {"epsilons": ["none"], "pool_seed": 0, **tiny, "batch": 3},
        },
        seeds=[0, 1],
    )
    rows = run_experiment(config, tmp_path / "out", cells_matching=["gradmm_*", "gradmm@noise_*", "gradmm@wide_*0_*"])
    assert len(rows) == 7
    pools = sorted((tmp_path / "out" / "work" / "public-candidates").iterdir())
    assert len(pools) == 2  # batch 2 (six cells) and batch 3
    train = load_dataset(config.data_spec(), split="train", seed=config.data_seed, labels=config.labels)
    model, tokenizer = load_model("tiny-llama", seed=config.data_seed)
    prompt = build_prompt(tokenizer, train.verbalizer.template, train.verbalizer.label_words, train.label_names)
    instructions = train.verbalizer.instructions(train.label_names)
    options = {k: v for k, v in tiny.items() if k != "preset"}
    named = {
        public_candidates_dir(
            tmp_path / "out" / "work",
            model,
            make_config("demo", **{**options, "batch": batch}, instructions=instructions, pool_seed=0, seed=5),
            prompt,
        ): batch
        for batch in (2, 3)
    }
    assert set(named) == set(pools)
    for pool, batch in named.items():
        assert {len(json.loads(f.read_text())) for f in pool.glob("class*_seed*.json")} == {batch}
