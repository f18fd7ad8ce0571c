"""DP fine-tune-then-generate on a tiny model: the run's ε, prompts + targets, the wall (poison test), resume."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from privlm.errors import UserError
from privlm.progress import shown_steps
from privlm.resources.tiny import build_tiny_model
from privlm.runfolder import LOCK, claim
from privlm.synthesis.dp_finetune.config import DPFinetuneConfig
from privlm.synthesis.dp_finetune.mechanism import PREFIX_CACHE, run_dp_finetune, training_rows
from privlm.training.checkpoint import FINISHED
from privlm.training.run import CACHE_BUILD

NAMES = ["negative", "positive"]
PRIVATE = [(f"{word} film number {i}", y) for i in range(12) for y, word in ((0, "a dull"), (1, "a lovely"))]
POISONED = [("POISON " + text[::-1], 1 - y) for text, y in PRIVATE]
CONFIG = DPFinetuneConfig(
    lora=2,
    lora_layers=1,
    batch_size=8,
    physical_batch_size=8,
    epochs=2.0,
    max_text_tokens=8,
    max_new_tokens=6,
    instructions=("Write bad.", "Write good."),
    seed=1,
)


@pytest.fixture(scope="module")
def lm():
    return build_tiny_model("tiny-llama", seed=2)


def _run(lm, out: Path, load_private, **kwargs):
    model, tokenizer = lm
    return run_dp_finetune(
        model,
        tokenizer,
        NAMES,
        load_private,
        out=out,
        per_class=3,
        config=kwargs.pop("config", CONFIG),
        epsilon=kwargs.pop("epsilon", 4.0),
        delta=1e-5,
        **kwargs,
    )


@pytest.fixture(scope="module")
def reference(lm, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "dpft.jsonl"
    _run(lm, out, lambda: list(PRIVATE))
    return out


def test_prompt_is_context_and_the_text_and_end_token_are_targets(lm) -> None:
    _, tokenizer = lm
    prompt = tokenizer("B:", add_special_tokens=True)["input_ids"]
    (row,) = training_rows(tokenizer, [("a lovely film indeed and more", 1)], [[7], prompt], max_text_tokens=3)
    assert row.input_ids[: len(prompt)] == prompt and row.n_option_tokens == 4 == len(row.input_ids) - len(prompt)
    assert row.input_ids[-1] == tokenizer.eos_token_id


def test_rows_carry_the_runs_epsilon_and_the_ledger_covers_every_step(reference) -> None:
    rows = [json.loads(line) for line in reference.read_text().splitlines()]
    assert [r["label"] for r in rows] == [0, 0, 0, 1, 1, 1] and all(r["dp"] and r["text"] for r in rows)
    privacy = json.loads(reference.with_suffix(".privacy.json").read_text())
    assert privacy["epsilon_accounted"] <= 4.0 == privacy["epsilon"] and privacy["private_release"] is True
    steps = sum(entry["count"] for entry in privacy["ledger"])
    assert steps == 6  # ⌈2 epochs · ⌈1/q⌉⌉, q = 8/24
    run_dir = reference.with_name(reference.name + ".dpft")
    assert (run_dir / FINISHED).exists() and not list(
        run_dir.glob("checkpoint-*")
    )  # no noise keys left beside the release
    assert not (run_dir / PREFIX_CACHE).exists()  # nor the private rows' hidden states


def test_the_prefix_cache_build_is_shown_as_a_private_task_the_sampling_as_a_public_one(
    lm, tmp_path, recorded_progress
) -> None:
    recorder = recorded_progress
    _run(lm, tmp_path / "x.jsonl", lambda: list(PRIVATE), progress=recorder)
    sampling = ("sampling 3 texts per class", 3 * len(NAMES), False)  # n and the classes are public
    assert recorder.opened == [(CACHE_BUILD, len(PRIVATE), True), sampling]
    assert recorder.advanced == len(PRIVATE) + 3 * len(NAMES)


def test_the_cached_top_blocks_train_the_adapters_of_the_whole_model(lm, tmp_path, monkeypatch) -> None:
    """Seeded noise (the mechanism's keys come from the OS; seeded here to compare): the cached run (the default)
    ends at the adapters of a run through every block, up to the rounding of the cache's bfloat16 states."""
    plain = DPFinetuneConfig.train_config
    monkeypatch.setattr(DPFinetuneConfig, "train_config", lambda self, *a: replace(plain(self, *a), seed=0))
    adapters = []
    for cache in (True, False):
        out = tmp_path / f"cache-{cache}.jsonl"
        _run(lm, out, lambda: list(PRIVATE), config=replace(CONFIG, cache=cache))
        adapters.append(load_file(out.with_name(out.name + ".dpft") / "adapter" / "adapter_model.safetensors"))
    assert adapters[0].keys() == adapters[1].keys() and len(adapters[0]) > 0
    moved = 0
    for name, value in adapters[0].items():
        torch.testing.assert_close(value, adapters[1][name], rtol=1e-2, atol=1e-5)  # bfloat16: 8 bits of mantissa
        moved += "lora_B" in name and bool(value.abs().max() > 0)  # B starts at 0: training moved it
    assert moved > 0


def test_a_finished_run_is_reused_without_reading_the_data(lm, reference, tmp_path) -> None:
    calls = []
    out = tmp_path / "again.jsonl"
    _run(lm, out, lambda: calls.append(1) or POISONED, run_dir=reference.with_name(reference.name + ".dpft"))
    assert calls == []
    assert out.read_bytes() == reference.read_bytes()


@pytest.mark.parametrize(
    "change, key",
    [
        ({"epsilon": 0.5}, "epsilon"),
        ({"config": replace(CONFIG, lora=4, lora_layers=2, epochs=1.0, max_grad_norm=0.5)}, "training"),
        ({"settings": {"data": "jsonl:other.jsonl"}}, "data"),
    ],
)
def test_a_finished_run_is_reused_only_with_the_same_training_settings(lm, reference, tmp_path, change, key) -> None:
    run_dir = reference.with_name(reference.name + ".dpft")
    with pytest.raises(UserError, match=f"--resume: {key} was"):
        _run(
            lm, tmp_path / "x.jsonl", lambda: pytest.fail("refused before the data is read"), run_dir=run_dir, **change
        )
    other = build_tiny_model("tiny-llama", seed=5)
    with pytest.raises(UserError, match="model_fingerprint"):
        _run(other, tmp_path / "x.jsonl", lambda: pytest.fail("refused before the data is read"), run_dir=run_dir)
    assert not (tmp_path / "x.jsonl").exists()
    sampling = _run(
        lm,
        tmp_path / "y.jsonl",
        lambda: pytest.fail("reused"),
        run_dir=run_dir,
        config=replace(CONFIG, max_new_tokens=4, temperature=0.7),
    )  # sampling settings may change
    assert sampling.privacy["epsilon"] == 4.0


def test_a_run_folder_in_use_is_refused(lm, tmp_path) -> None:
    out = tmp_path / "dpft.jsonl"
    run_dir = out.with_name(out.name + ".dpft")
    with claim(run_dir / LOCK) as mine:  # another open file description: as another process would
        assert mine
        with pytest.raises(UserError, match="in use by another process"):
            _run(lm, out, lambda: pytest.fail("refused before the data is read"))
    assert not (run_dir / "run.json").exists() and not out.exists()


def test_an_interrupted_run_resumes_from_its_checkpoint_and_counts_each_step_once(lm, tmp_path, monkeypatch) -> None:
    out, seen = tmp_path / "dpft.jsonl", []

    def crash(step: int, total: int, loss, epsilon) -> None:
        seen.append(step)
        if step == 5 and len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(lm, out, lambda: list(PRIVATE), on_progress=crash)
    run_dir = out.with_name(out.name + ".dpft")
    assert list(run_dir.glob("checkpoint-*")) and not (run_dir / FINISHED).exists()
    _run(lm, out, lambda: list(PRIVATE), on_progress=crash)
    assert seen == [1, 2, 3, 4, 5, 6]
    privacy = json.loads(out.with_suffix(".privacy.json").read_text())
    assert sum(entry["count"] for entry in privacy["ledger"]) == 6


def test_the_model_passed_in_is_left_untouched(lm, tmp_path) -> None:
    model, _ = lm
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _run(lm, tmp_path / "x.jsonl", lambda: list(PRIVATE))
    assert all((before[k] == v).all() for k, v in model.state_dict().items()) and not hasattr(model, "peft_config")


def test_epsilon_none_runs_the_same_recipe_without_noise_and_says_it_is_not_private(lm, tmp_path) -> None:
    """ε None: the DP run's steps, clipping and norm mode with σ = 0 — no ledger, rows and sidecar NOT private."""
    dp, clip_only = CONFIG.train_config(4.0, 1e-5, 32), CONFIG.train_config(None, 1e-5, 32)
    assert clip_only.clip_only and not clip_only.differentially_private and dp.differentially_private
    assert replace(clip_only, noise_multiplier=None, epsilon=4.0) == dp
    out, steps = tmp_path / "clip-only.jsonl", []
    result = _run(lm, out, lambda: list(PRIVATE), epsilon=None, on_progress=lambda s, *_: steps.append(s))
    assert steps == [1, 2, 3, 4, 5, 6]  # the DP run's 6 steps
    run_dir = out.with_name(out.name + ".dpft")
    assert (run_dir / FINISHED).exists() and not (run_dir / "privacy.json").exists()
    sidecar = json.loads(out.with_suffix(".privacy.json").read_text())
    assert sidecar["dp"] is False and sidecar["epsilon"] is None and "without noise (σ = 0)" in sidecar["warning"]
    assert "no noise: σ = 0" in sidecar["mechanism"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and not any(r["dp"] for r in rows) and result.privacy == {**sidecar}
    again = _run(lm, tmp_path / "again.jsonl", lambda: pytest.fail("reused"), epsilon=None, run_dir=run_dir)
    assert again.rows == result.rows


@pytest.mark.parametrize(
    ("epsilon", "label"), [(1.0, "DP-SGD steps"), (None, "clipped SGD steps (σ = 0, NOT private)")]
)
def test_the_steps_bar_names_the_run_without_noise_not_private(epsilon, label, recorded_progress) -> None:
    recorder = recorded_progress
    shown_steps(recorder, epsilon)
    assert recorder.opened == [(label, None, False)]  # the step count is public: not a private task


def test_runs_on_the_same_rows_share_one_prefix_cache_and_train_as_with_their_own(
    lm, tmp_path, monkeypatch, recorded_progress
) -> None:
    """With ``shared_prefix`` the private rows' hidden states are built once for every ε, σ and seed, kept in
    the shared folder, and a run reading them ends at the adapters it reaches with its own (seeded noise)."""
    plain = DPFinetuneConfig.train_config
    monkeypatch.setattr(DPFinetuneConfig, "train_config", lambda self, *a: replace(plain(self, *a), seed=0))
    shared, recorder = tmp_path / "private-cache", recorded_progress
    _run(lm, tmp_path / "none.jsonl", lambda: list(PRIVATE), epsilon=None, shared_prefix=shared, progress=recorder)
    seed3 = replace(CONFIG, seed=3)
    _run(lm, tmp_path / "seed3.jsonl", lambda: list(PRIVATE), config=seed3, shared_prefix=shared, progress=recorder)
    _run(lm, tmp_path / "shared.jsonl", lambda: list(PRIVATE), shared_prefix=shared, progress=recorder)
    _run(lm, tmp_path / "own.jsonl", lambda: list(PRIVATE))
    assert [opened for opened in recorder.opened if opened[0] == CACHE_BUILD] == [(CACHE_BUILD, len(PRIVATE), True)]
    (cache,) = shared.glob("dpft-prefix-*")
    assert (cache / "features.safetensors").exists()  # kept for later runs
    assert not list(tmp_path.glob("*.dpft/" + PREFIX_CACHE))  # a run's own cache is still deleted
    adapters = [
        load_file(tmp_path / f"{name}.jsonl.dpft" / "adapter" / "adapter_model.safetensors")
        for name in ("shared", "own")
    ]
    assert adapters[0].keys() == adapters[1].keys()
    assert all(torch.equal(value, adapters[1][name]) for name, value in adapters[0].items())
    longer = replace(CONFIG, max_text_tokens=4)  # other prompts or lengths: another cache, not a refusal
    _run(lm, tmp_path / "longer.jsonl", lambda: list(PRIVATE), config=longer, shared_prefix=shared)
    assert len(list(shared.glob("dpft-prefix-*"))) == 2
