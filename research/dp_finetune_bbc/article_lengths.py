"""Prompt lengths of BBC News (SmolLM2 tokens: article + suffix + the label token) and the share cut at each T.

.venv/bin/python research/dp_finetune_bbc/article_lengths.py   # writes article_lengths.json beside it
"""

import json
from pathlib import Path

import numpy as np

from privlm.lm.prompts import split_prompt
from privlm.resources.models import load_model
from privlm.training.data import load_task_data
from privlm.training.run import SPLIT_SEED

_, tokenizer = load_model("smollm2-135m")
data = load_task_data("bbc-news", "classify", SPLIT_SEED)
out = {}
for split in ("train", "test"):
    lengths = np.array(
        [
            len(tokenizer(split_prompt(text, data.verbalizer.template, "x")[0])["input_ids"]) + 1
            for text, _ in getattr(data, split)
        ]
    )
    out[split] = {
        "n": len(lengths),
        "median_tokens": float(np.median(lengths)),
        "p90": float(np.percentile(lengths, 90)),
        "max": int(lengths.max()),
        **{f"share_over_{t}": float((lengths > t).mean()) for t in (256, 1024, 2048)},
    }
Path(__file__).with_name("article_lengths.json").write_text(json.dumps(out, indent=2) + "\n")
print(json.dumps(out, indent=1))
