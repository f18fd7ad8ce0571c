"""Zero-shot reference for research/dp_finetune_bbc_lora: the untrained SmolLM2 scored like the trained cells
(same prompts, T = 256, all test articles). Run: .venv/bin/python research/dp_finetune_bbc_lora/zero_shot.py"""

import json
import time
from pathlib import Path

from privlm.resources.models import load_model
from privlm.training.data import load_task_data
from privlm.training.evaluate import test_metrics
from privlm.training.run import SPLIT_SEED

start = time.perf_counter()
model, tokenizer = load_model("smollm2-135m")
metrics = test_metrics(model, tokenizer, load_task_data("bbc-news", "classify", SPLIT_SEED), 256)
summary = {"cell": "zero-shot", "test": metrics, "wall_s": round(time.perf_counter() - start, 1)}
Path(__file__).with_name("zero-shot.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
print(summary)
