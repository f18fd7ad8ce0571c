"""The untrained label-word head (the zero-shot classifier every head-only cell starts from) on the test split.

    .venv/bin/python research/dp_finetune_bbc/zero_shot.py    # after run.py has built the feature caches

Reads the private feature caches of ``run.py`` (checked against the data and model fingerprints) and
writes ``cells/zero-shot-<setting>.json`` and ``predictions/zero-shot-<setting>.jsonl`` beside the cells
it is compared with. No training, no private data released beyond the test predictions.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from privlm.training.loop import TrainConfig
from privlm.training.run import evaluate_session, set_up

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = (
    ("bbc-news", 256, ROOT / "research" / "dp_finetune_bbc", "bbc-T256"),
    ("bbc-news", 1024, ROOT / "research" / "dp_finetune_bbc", "bbc-T1024"),
    ("rotten-tomatoes", 256, ROOT / "research" / "dp_finetune_rotten_tomatoes", "rt"),
)

for data, max_length, results, setting in SETTINGS:
    cache = ROOT / "runs" / "bbc_news_v2" / f"cache-{data}-T{max_length}"
    if not (cache / "meta.json").exists():
        print(f"{setting}: no cache yet ({cache}); skipped")
        continue
    config = TrainConfig(private=False, head_only=True, max_length=max_length)
    session = set_up("smollm2-135m", data, config, cache_dir=cache)
    scratch = Path(tempfile.mkdtemp())
    metrics = evaluate_session(session, scratch, None)
    name = f"zero-shot-{setting}"
    (results / "predictions").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(scratch / "predictions.jsonl", results / "predictions" / f"{name}.jsonl")
    shutil.rmtree(scratch)
    summary = {
        "cell": name,
        "data": data,
        "max_length": max_length,
        "test": metrics,
        "note": "untrained label-word head on the cached (bfloat16) features: the zero-shot classifier",
    }
    (results / "cells" / f"{name}.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print(name, metrics)
