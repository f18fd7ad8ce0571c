"""GRADMM's public label filter: each candidate run behind the whole few-shot prompt vs on the shared
prefix's cached keys and values (``privlm.lm.shared_prefix.SharedPrefix``, what the filter uses).

    python benchmarks/label_filter.py --out benchmarks/results/label_filter.json

Both variants score the same ``--texts`` public candidates (sentences cut from privlm's tiny-tokenizer passage,
written for privlm) with SmolLM2-135M (or ``--model``), the Rotten Tomatoes verbalizer and privlm's own
demonstrations, in batches of 16, one torch thread; they alternate after a warm-up, so machine load affects
them alike; the time is the median of process CPU seconds per pass. Also reported: the largest difference of
their calibrated scores and whether the predicted labels agree. Writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from alternating import alternate  # noqa: E402  (benchmarks/alternating.py)

from privlm.resources.models import load_model  # noqa: E402
from privlm.resources.tiny import PUBLIC_TEXT  # noqa: E402
from privlm.synthesis.gradmm.filtering import CONTENT_FREE, few_shot_context, few_shot_scores  # noqa: E402
from privlm.synthesis.gradmm.prompt import Prompt, build_prompt, head_logits, last_hidden_from_ids  # noqa: E402


def public_texts(n: int) -> list[str]:
    """``n`` public candidate-like texts: windows of 12–28 words over privlm's public passage (about as long as
    instructed candidates, 27 tokens)."""
    words = PUBLIC_TEXT.split()
    return [" ".join(words[(7 * i) % len(words) :][: 12 + i % 17]) for i in range(n)]


@torch.no_grad()
def whole_prompt_scores(model, tokenizer, prompt: Prompt, texts: Sequence[str], batch_size: int = 16) -> torch.Tensor:
    """The filter's scores computed the way it did before the shared prefix: every text behind the whole prompt."""
    context = prompt.with_context(tokenizer.encode(few_shot_context(prompt), add_special_tokens=False))
    labels = torch.tensor(prompt.label_token_ids)

    def logprobs(batch: Sequence[str]) -> torch.Tensor:
        seqs = [[*context, *prompt.text_ids(tokenizer, t), *prompt.suffix_ids] for t in batch]
        return torch.log_softmax(head_logits(model, last_hidden_from_ids(model, seqs))[:, labels].float(), dim=1)

    free = logprobs([CONTENT_FREE])[0]
    return torch.cat([logprobs(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)]) - free


def timed(fn: Callable[[], torch.Tensor], keep: dict[str, torch.Tensor], name: str) -> Callable[[], float]:
    def run() -> float:
        start = time.process_time()
        keep[name] = fn()
        return time.process_time() - start

    return run


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a registered model (tiny-llama for a smoke run)")
    parser.add_argument("--texts", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/label_filter.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, tokenizer = load_model(args.model)
    model.eval()
    prompt = build_prompt(tokenizer, "{text} It was ", ["bad", "great"], ["negative", "positive"])
    texts = public_texts(args.texts)
    scores: dict[str, torch.Tensor] = {}
    variants = {
        "whole_prompt": timed(lambda: whole_prompt_scores(model, tokenizer, prompt, texts), scores, "whole_prompt"),
        "shared_prefix": timed(lambda: few_shot_scores(model, tokenizer, prompt, texts), scores, "shared_prefix"),
    }
    times, median = alternate(variants, args.repeats)
    context = prompt.with_context(tokenizer.encode(few_shot_context(prompt), add_special_tokens=False))
    result = {
        "benchmark": "label_filter",
        "model": args.model,
        "texts": len(texts),
        "prefix_tokens": len(context),
        "mean_text_tokens": sum(len(prompt.text_ids(tokenizer, t)) + len(prompt.suffix_ids) for t in texts)
        / len(texts),
        "repeats": args.repeats,
        "pass_s": median,
        "pass_s_all": times,
        "shared_over_whole": median["shared_prefix"] / median["whole_prompt"],
        "max_score_difference": float((scores["shared_prefix"] - scores["whole_prompt"]).abs().max()),
        "labels_agree": bool(torch.equal(scores["shared_prefix"].argmax(1), scores["whole_prompt"].argmax(1))),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": 1},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar(list(median), list(median.values()))
    ax.set_ylabel(f"CPU s per pass over {len(texts)} texts")
    ax.set_title(
        f"label filter, prefix {len(context)} tokens: shared / whole {result['shared_over_whole']:.2f}x", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)
    print(json.dumps({k: result[k] for k in ("pass_s", "shared_over_whole", "max_score_difference", "labels_agree")}))
    return result


if __name__ == "__main__":
    main()
