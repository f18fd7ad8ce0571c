"""``privlm train``: bad input exits 2 with the reason; SIGKILL + ``--resume`` ends with the same
weights and the same ledger as an uninterrupted run; the lm task reports perplexity; ``metrics.jsonl``
holds only the released DP loss (or no loss at all with ``--loss-noise-fraction 0``); a classify run writes
``predictions.jsonl``; the default classify recipe trains the label-word head on cached features and
leaves neither the cache nor checkpoints behind."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import exit_code
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from safetensors.torch import load_file

from privlm.privacy import Ledger, LedgerEntry, PoissonGaussianStep

WORDS = ["great", "bad", "warm", "dull", "funny", "slow", "sharp", "wooden", "moving", "boring"]
TEXTS = [f"review {i}: the film was " + " ".join(WORDS[(i * 7 + j) % 10] for j in range(3 + i % 5)) for i in range(60)]
LABELLED = [(text, "pos" if i % 2 else "neg") for i, text in enumerate(TEXTS)]
# 48 training examples (--max-train 48 of the per-row split's 50), B = 8: q = 1/6, 6 steps per epoch, 36 in all
RUN = [
    "--model",
    "tiny-llama",
    "--labels",
    "neg,pos",
    "--max-train",
    "48",
    "--epsilon",
    "8",
    "--delta",
    "1e-5",
    "--norm-mode",
    "mixed",
    "--max-length",
    "48",
    "--batch-size",
    "8",
    "--epochs",
    "6",
    "--lr",
    "5e-3",
    "--seed",
    "3",
    "--checkpoint-every",
    "3",
    "--max-test",
    "6",
    "--lora",
    "0",
]  # full fine-tuning on the label-word objective (classify's default is head-only)


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return f"jsonl:{path}"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    return _write(tmp_path_factory.mktemp("data") / "reviews.jsonl", [{"text": t, "label": y} for t, y in LABELLED])


def _train(args: list[str]) -> int:
    return exit_code(["train", *args])


def _cli(args: list[str]) -> list[str]:
    return [sys.executable, "-c", "from privlm.cli import main; main()", "train", *args]


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny models: one thread is faster on a shared CPU


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--epsilon", "0"], "epsilon"),
        (["--epsilon", "-1"], "-1"),
        (["--max-length", "4096"], "context of 128"),
        (["--norm-mode", "sketchy"], "sketchy"),
        (["--batch-size", "0"], "--batch-size"),
        (["--loss-noise-fraction", "-1"], "--loss-noise-fraction"),
        (["--loss-bound", "0"], "loss bound"),
        (["--lora", "4", "--lora-layers", "99"], "--lora-layers must be in 1.."),
        (["--lora-layers", "1"], "--lora-layers needs --lora R > 0"),
        (["--noise-multiplier", "0"], "0 clips without noise, which is NOT private: it meets no --epsilon"),
        (["--noise-multiplier", "-1"], "--noise-multiplier must be >= 0"),
        (["--precision", "bf16", "--second-backward"], "--precision bf16 needs book-keeping"),
    ],
)
def test_bad_input_exits_2_with_the_reason(data, tmp_path, capsys, flags, fragment):
    code = _train([*RUN, "--data", data, "--out", str(tmp_path / "run"), *flags])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and fragment in err
    assert not (tmp_path / "run" / "privacy.json").exists()


def test_a_given_noise_multiplier_is_drawn_and_its_epsilon_accounted(data, tmp_path, capsys):
    at = RUN.index("--epsilon")
    without_budget = RUN[:at] + RUN[at + 2 :]
    out = tmp_path / "sigma"
    args = [*without_budget, "--data", data, "--epochs", "1", "--noise-multiplier", "2", "--out", str(out), "--json"]
    assert _train(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["noise_multiplier"] == 2.0 and summary["steps"] == 6
    event = PoissonGaussianStep(summary["sample_rate"], summary["accounted_noise_multiplier"], snapped=1)
    expected = Ledger([LedgerEntry(event, summary["steps"])]).epsilon(1e-5)
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-6) and 0 < summary["epsilon"] < 8
    # independent reference (Google's dp-accounting, the accounted σ, no snapping slack): never under-reported
    reference = pld_privacy_accountant.PLDAccountant()
    gaussian = dp_event.GaussianDpEvent(summary["accounted_noise_multiplier"])
    reference.compose(dp_event.PoissonSampledDpEvent(summary["sample_rate"], gaussian), summary["steps"])
    assert summary["accounted_noise_multiplier"] < 2.0  # the DP loss shares the noise: accounted below drawn
    assert reference.get_epsilon(1e-5) <= summary["epsilon"] <= 1.05 * reference.get_epsilon(1e-5)
    no_dp = [*without_budget, "--data", data, "--no-dp", "--noise-multiplier", "2", "--out", str(tmp_path / "x")]
    assert _train(no_dp) == 2 and "cannot be combined" in capsys.readouterr().err


def test_no_noise_clips_and_says_it_is_not_private(data, tmp_path, capsys):
    """--noise-multiplier 0 without --epsilon: the clipping-only ablation; every output says NOT private, ε is ∞,
    no ledger is written (nothing is accounted). That its update is the clipped mean: tests/dpsgd/test_engine.py."""
    at = RUN.index("--epsilon")
    without_budget = [*RUN[:at], *RUN[at + 2 :], "--data", data, "--epochs", "1"]
    out = tmp_path / "clip"
    assert _train([*without_budget, "--noise-multiplier", "0", "--clip", "0.01", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["private"] is False and summary["private_release"] is False
    assert summary["epsilon"] == math.inf and summary["noise_multiplier"] == 0.0 and summary["steps"] == 6
    assert not (out / "privacy.json").exists()
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("loss" in r for r in logged) and not any("dp_loss" in r for r in logged)  # no loss called DP
    assert _train([*without_budget, "--noise-multiplier", "0", "--clip", "0.01", "--out", str(tmp_path / "p")]) == 0
    shown = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "NOT private: clipping without noise (--noise-multiplier 0, an ablation)" in shown
    assert "DP loss" not in shown


def test_classify_on_a_dataset_without_labels_exits_2(tmp_path, capsys):
    unlabelled = _write(tmp_path / "texts.jsonl", [{"text": t} for t in TEXTS])
    assert _train([*RUN, "--data", unlabelled, "--task", "classify", "--out", str(tmp_path / "run")]) == 2
    assert ":1: missing 'label'" in capsys.readouterr().err


def test_lm_task_with_lora_on_unlabelled_texts_reports_perplexity(tmp_path, capsys):
    unlabelled = _write(tmp_path / "texts.jsonl", [{"text": t} for t in TEXTS])
    seed_at = RUN.index("--seed")
    unseeded = RUN[:seed_at] + RUN[seed_at + 2 :]  # OS keys: a private release
    args = [
        *unseeded,
        "--data",
        unlabelled,
        "--task",
        "lm",
        "--epochs",
        "1",
        "--lora",
        "4",
        "--out",
        str(tmp_path / "run"),
        "--loss-noise-fraction",
        "0",
        "--json",
    ]
    assert _train(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 6 and summary["stopped"] == "done"
    assert 1 < summary["test"]["perplexity"] < 600  # a 512-token vocabulary: uniform guessing is 512
    assert 0 < summary["epsilon"] <= 8
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").exists()
    assert not (tmp_path / "run" / "model").exists()
    assert summary["accounted_noise_multiplier"] == summary["noise_multiplier"]  # no loss release: plain DP-SGD
    assert summary["private_release"] is True and Ledger.load(tmp_path / "run" / "privacy.json").private_release
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 6 and not any("loss" in key for record in records for key in record)


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("full") / "run"
    subprocess.run(
        _cli([*RUN, "--data", data, "--out", str(out), "--json"]), check=True, capture_output=True, timeout=300, env=ENV
    )
    return out


def _ledger_steps(ledger: Ledger) -> list[int]:
    """The step numbers the ledger's labels cover, in order (``steps a-b``)."""
    steps = []
    for entry in ledger:
        first, last = map(int, entry.label.removeprefix("steps ").split("-"))
        assert last - first + 1 == entry.count
        steps.extend(range(first, last + 1))
    return steps


def test_resume_after_kill_equals_the_uninterrupted_run(data, uninterrupted, tmp_path, capsys):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _cli([*RUN, "--data", data, "--out", str(out), "--json"]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    deadline = time.monotonic() + 240
    while not list(out.glob("checkpoint-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    (checkpoint,) = out.glob("checkpoint-*")
    killed_at = int(checkpoint.name.removeprefix("checkpoint-"))
    assert killed_at < 36 and not (out / "model").exists()
    assert sum(e.count for e in Ledger.load(checkpoint / "privacy.json")) == killed_at
    identity = Ledger.load(out / "privacy.json").run

    assert _train([*RUN, "--data", data, "--out", str(out), "--resume", "--lr", "1e-2"]) == 2  # other settings
    assert "(lr: 0.005 then, 0.01 now)" in capsys.readouterr().err
    result = subprocess.run(
        _cli([*RUN, "--data", data, "--out", str(out), "--resume", "--json"]),
        check=True,
        capture_output=True,
        timeout=300,
        text=True,
        env=ENV,
    )
    summary = json.loads(result.stdout)
    assert summary["resumed_from"] == killed_at and summary["steps"] == 36

    resumed = load_file(out / "model" / "model.safetensors")
    reference = load_file(uninterrupted / "model" / "model.safetensors")
    assert resumed.keys() == reference.keys()
    for name, value in reference.items():
        assert torch.equal(resumed[name], value), name
    ledger, full = Ledger.load(out / "privacy.json"), Ledger.load(uninterrupted / "privacy.json")
    assert _ledger_steps(ledger) == list(range(1, 37))  # every step once, none lost, none twice
    assert ledger.entries == full.entries and ledger.private_release == full.private_release
    assert ledger.run == identity and full.run not in (None, identity)  # the resumed run kept its identity
    steps = [
        json.loads(line)["step"]
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if "epsilon" in json.loads(line)
    ]
    assert steps == sorted(set(steps))


def test_metrics_hold_only_the_released_dp_loss(uninterrupted):
    records = [json.loads(line) for line in (uninterrupted / "metrics.jsonl").read_text().splitlines()]
    training, (final,) = records[:-1], records[-1:]
    assert [r["step"] for r in training] == [10, 20, 30, 36]  # --log-every 10 and the last step
    for record in training:
        assert set(record) == {"step", "epsilon", "dp_loss"}  # no timings: they follow which rows were sampled
        assert math.isfinite(record["dp_loss"])
    assert set(final) == {"step", "test"}  # the held-out evaluation


def test_an_existing_run_is_never_overwritten_or_resumed_with_other_settings(data, uninterrupted, capsys):
    before = (uninterrupted / "privacy.json").read_text()
    assert _train([*RUN, "--data", data, "--out", str(uninterrupted)]) == 2
    assert "--resume" in capsys.readouterr().err
    other = [*RUN, "--data", data, "--out", str(uninterrupted), "--resume", "--lr", "1e-2"]
    assert _train(other) == 2
    assert "finished run" in capsys.readouterr().err
    assert (uninterrupted / "privacy.json").read_text() == before


def test_a_finished_run_folder_holds_no_rng_state(uninterrupted):
    """Checkpoints hold the noise/sampling generator states (the seed is in them): once the release is
    saved they are deleted, so sharing the run folder never lets anyone subtract the noise."""
    assert (uninterrupted / "model" / "model.safetensors").exists()
    assert not list(uninterrupted.glob("checkpoint-*")) and (uninterrupted / "FINISHED").exists()
    assert not [p for p in uninterrupted.rglob("*") if p.suffix == ".pt"]


def test_a_seeded_run_is_not_a_private_release(uninterrupted):
    """--seed derives the noise keys from the seed: the ledger says so."""
    assert json.loads((uninterrupted / "privacy.json").read_text())["private_release"] is False


def test_labelled_user_data_needs_public_labels_and_a_new_label_is_not_shown(data, tmp_path, capsys):
    without = [arg for arg in RUN if arg not in ("--labels", "neg,pos")]
    assert _train([*without, "--data", data, "--out", str(tmp_path / "run")]) == 2
    assert "--labels NAME,NAME,..." in capsys.readouterr().err
    leaky = _write(
        tmp_path / "leaky.jsonl",
        [*({"text": t, "label": y} for t, y in LABELLED), {"text": "patient 61", "label": "hiv_positive"}],
    )
    assert _train([*RUN, "--data", leaky, "--out", str(tmp_path / "run")]) == 2
    captured = capsys.readouterr()
    assert f"leaky.jsonl:{len(LABELLED) + 1}: label is not one of the 2 class names" in captured.err
    assert "hiv_positive" not in captured.err + captured.out
    assert not (tmp_path / "run" / "privacy.json").exists()


def test_predictions_hold_one_line_per_test_example_and_give_the_accuracy(uninterrupted):
    records = [json.loads(line) for line in (uninterrupted / "predictions.jsonl").read_text().splitlines()]
    final = json.loads((uninterrupted / "metrics.jsonl").read_text().splitlines()[-1])
    n = final["test"]["n_test"]
    assert n >= 3 and [r["index"] for r in records] == list(range(n))
    for record in records:
        assert set(record) == {"index", "gold", "predicted", "scores"} and len(record["scores"]) == 2
        assert record["predicted"] == max(range(2), key=lambda c: record["scores"][c])
    assert final["test"]["accuracy"] == sum(r["gold"] == r["predicted"] for r in records) / n


def test_the_default_classify_recipe_trains_the_label_word_head_on_cached_features(data, tmp_path, capsys):
    recipe = [a for a in RUN if a not in ("--lora", "0")]
    out = tmp_path / "run"
    assert _train([*recipe, "--data", data, "--epochs", "2", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (
        summary["saved"] == str(out / "head") and summary["steps"] == 12 and summary["cache_build_s"] is not None
    )  # built by this run
    rows = load_file(out / "head" / "label_rows.safetensors")["rows"]
    assert rows.shape == (2, 32)  # K label words × d
    assert json.loads((out / "head" / "head.json").read_text())["label_words"] == ["neg", "pos"]
    assert sorted(p.name for p in out.iterdir()) == [
        "FINISHED",
        "head",
        "metrics.jsonl",
        "predictions.jsonl",
        "privacy.json",
    ]
    assert _train([*recipe, "--data", data, "--lora", "4", "--head-only", "--out", str(tmp_path / "bad")]) == 2
    assert "--head-only" in capsys.readouterr().err


def test_an_uncached_head_only_run_reads_the_features_through_the_model_and_writes_no_cache(data, tmp_path, capsys):
    recipe = [a for a in RUN if a not in ("--lora", "0")]
    out = tmp_path / "run"
    assert _train([*recipe, "--data", data, "--epochs", "1", "--no-cache", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 6 and "cache_build_s" not in summary
    assert len((out / "predictions.jsonl").read_text().splitlines()) == summary["test"]["n_test"]
    assert not [p for p in tmp_path.rglob("*") if "cache" in p.name]


def _without(args: list[str], *options: str) -> list[str]:
    """``args`` less each of ``options`` and its value."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        else:
            out.append(arg)
    return out


@pytest.fixture(scope="module")
def completions(tmp_path_factory) -> str:
    rows = [{"prompt": text, "completion": " ".join(text.split()[-2:])} for text in TEXTS]
    return _write(tmp_path_factory.mktemp("completions") / "rows.jsonl", rows)


GENERATE = [*_without(RUN, "--labels", "--lora"), "--task", "generate", "--max-new-tokens", "6"]


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--labels", "neg,pos"], "--task generate learns the completion"),
        (["--max-new-tokens", "48"], "--max-new-tokens must be in 1..47"),
        (["--train-layers", "3"], "--train-layers must be in 1..2"),
        (["--train-layers", "1", "--lora", "4", "--lora-layers", "2"], "drop --lora-layers 2"),
        (["--template", "{text} {text}"], "at most once"),
        (["--cache-dtype", "int8"], "--cache-dtype"),
    ],
)
def test_bad_generate_input_exits_2_with_the_reason(completions, tmp_path, capsys, flags, fragment):
    code = _train([*GENERATE, "--data", completions, "--out", str(tmp_path / "run"), *flags])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and fragment in err
    assert not (tmp_path / "run" / "privacy.json").exists()


def test_train_layers_beyond_the_model_exits_2_for_classify(data, tmp_path, capsys):
    assert _train([*RUN, "--data", data, "--train-layers", "99", "--out", str(tmp_path / "run")]) == 2
    assert "--train-layers must be in 1..2 (the model's decoder blocks), got 99" in capsys.readouterr().err


def _released_adapter_writes_the_predictions(out: Path, data: str, records: list[dict]) -> None:
    """What a user does with the release: the base model plus ``adapter/`` loaded by peft (no privlm class)
    completes the test prompts exactly as the run's ``predictions.jsonl`` says."""
    from peft import PeftModel

    from privlm.lm.completion import greedy_complete
    from privlm.resources.models import load_model
    from privlm.training.data import GENERATE_TEMPLATE, load_task_data
    from privlm.training.run import SPLIT_SEED

    base, tokenizer = load_model("tiny-llama", seed=3)  # --model tiny-llama --seed 3: the base privlm trained
    model = PeftModel.from_pretrained(base, str(out / "adapter"))
    test = load_task_data(data, "generate", SPLIT_SEED).test[: len(records)]
    assert [r.completion for r in test] == [r["reference"] for r in records]

    def complete(lm) -> list[str]:
        prompts = [r.prompt for r in test]
        return greedy_complete(lm, tokenizer, prompts, max_new_tokens=6, max_length=48, template=GENERATE_TEMPLATE)

    assert complete(model) == [r["generated"] for r in records]
    ids = tokenizer(test[0].prompt, return_tensors="pt")
    with torch.no_grad():
        trained = model(**ids).logits
        with model.disable_adapter():  # the loaded adapters are the trained ones: they move the base's logits
            assert not torch.allclose(model(**ids).logits, trained)


def test_generate_on_cached_top_blocks_scores_rouge_and_writes_predictions(completions, tmp_path, capsys):
    out = tmp_path / "run"
    args = [*GENERATE, "--data", completions, "--out", str(out), "--train-layers", "1", "--lora", "4"]
    assert _train([*args, "--norm-mode", "hutchinson", "--probes", "8", "--epochs", "1", "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    test = summary["test"]
    assert summary["task"] == "generate" and summary["steps"] == 6 and summary["cache_build_s"] is not None
    assert set(test) == {"rouge1", "rouge2", "rougeL", "exact_match", "n", "prompts_cut"} and 3 <= test["n"] <= 6
    assert all(0 <= test[k] <= 1 for k in ("rouge1", "rouge2", "rougeL", "exact_match"))
    assert summary["rows_cut"] is None and "not released for private data" in summary["rows_cut_note"]
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(test["n"]))  # --max-test 6, or the whole test split
    assert all(set(r) == {"index", "reference", "generated"} for r in records)
    assert summary["saved"] == str(out / "adapter") and (out / "adapter" / "adapter_model.safetensors").exists()
    assert sorted(p.name for p in out.iterdir()) == [  # the cache of hidden states left with the checkpoints
        "FINISHED",
        "adapter",
        "metrics.jsonl",
        "predictions.jsonl",
        "privacy.json",
    ]
    assert not [p for p in tmp_path.rglob("*") if "cache" in p.name]
    _released_adapter_writes_the_predictions(out, completions, records)
    lines = captured.err.splitlines()
    build = [line for line in lines if "building the private prefix cache" in line]
    shown = [re.sub(r"^\[\d\d:\d\d:\d\d\]|\(\d+ s\)", "", line) for line in build]  # not the clock's digits
    assert build and not any(str(summary["n_train"]) in line for line in shown)  # a private count: never shown
    assert any("decoding the test prompts" in line for line in lines)
