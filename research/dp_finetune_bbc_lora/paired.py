"""Paired comparison of the BBC cells on the same test articles: per-article predictions of the untrained
model and of each finished cell's adapter, confusion matrices, the private cells' agreement, and a paired
bootstrap 95% interval of the accuracy difference randomized (hutchinson) − exact (mixed). Run after run.sh:
    .venv/bin/python research/dp_finetune_bbc_lora/paired.py        # writes research/dp_finetune_bbc_lora/paired.json
"""

import json
import time
from pathlib import Path

import numpy as np
from peft import PeftModel

from privlm.lm.scoring import option_scores
from privlm.resources.models import load_model
from privlm.training.data import load_task_data
from privlm.training.run import SPLIT_SEED

HERE = Path(__file__).parent
T = 256
start = time.perf_counter()
data = load_task_data("bbc-news", "classify", SPLIT_SEED)
texts, labels = [t for t, _ in data.test], np.array([y for _, y in data.test])
verbalizer = data.verbalizer
correct, summary = {}, {"classes": list(data.verbalizer.label_words)}
for cell in ("zero-shot", "exact-mixed", "hutchinson-k32", "non-private"):
    model, tokenizer = load_model("smollm2-135m")
    if cell != "zero-shot":
        if not (HERE / "runs" / cell / "adapter").exists():
            continue
        model = PeftModel.from_pretrained(model, HERE / "runs" / cell / "adapter")
    scores = option_scores(model, tokenizer, texts, verbalizer.template, verbalizer.label_words, max_length=T)
    predicted = scores.argmax(axis=1)
    correct[cell] = predicted == labels
    confusion = np.zeros((len(summary["classes"]),) * 2, dtype=int)
    np.add.at(confusion, (labels, predicted), 1)
    summary[cell] = {
        "accuracy": float(correct[cell].mean()),
        "n_test": int(labels.size),
        "confusion_true_by_predicted": confusion.tolist(),
    }
a, b = correct["hutchinson-k32"], correct["exact-mixed"]
rng = np.random.default_rng(0)
idx = rng.integers(0, a.size, size=(10_000, a.size))
diffs = a[idx].mean(1) - b[idx].mean(1)
summary["hutchinson_minus_exact"] = {
    "difference": float(a.mean() - b.mean()),
    "paired_bootstrap_95": [float(np.quantile(diffs, 0.025)), float(np.quantile(diffs, 0.975))],
    "both_right": int((a & b).sum()),
    "only_hutchinson": int((a & ~b).sum()),
    "only_exact": int((~a & b).sum()),
    "both_wrong": int((~a & ~b).sum()),
}
summary["wall_s"] = round(time.perf_counter() - start, 1)
summary["private_release"] = False  # the cells were trained with --seed 0: whoever knows it can regenerate the noise
summary["private_release_note"] = (
    "predictions of the adapters trained with --seed 0 (and --no-dp): not a private release"
)
(HERE / "paired.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
