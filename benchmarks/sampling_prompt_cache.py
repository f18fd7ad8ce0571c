"""Batched sampling (``privlm.lm.generation.sample_many``): every sample's copy of its prompt run through the
model (what ``generate`` with ``num_return_sequences`` does) vs each prompt run once and its keys and values
repeated for its samples (``_prompt_cache``, what privlm does).

    python benchmarks/sampling_prompt_cache.py --out benchmarks/results/sampling_prompt_cache.json

Two public workloads with SmolLM2-135M (or ``--model``), 40 new tokens each, one torch thread: PE's rewrites
(``--prompts`` variation prompts around public sentences, 3 samples each, as PE asks) and zero-shot (one class
instruction, ``--samples`` samples, as zero-shot generation and the DP generator's sampling ask). The variants
alternate after a warm-up, so machine load affects them alike; the time is the median of process CPU seconds
per call. Also reported: whether both give the same texts. Writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from alternating import alternate  # noqa: E402  (benchmarks/alternating.py)
from label_filter import public_texts  # noqa: E402  (benchmarks/label_filter.py: candidate-length public texts)

import privlm.lm.generation as generation  # noqa: E402
from privlm.lm.generation import DEFAULT_INSTRUCTION, chat_prompt, sample_many  # noqa: E402
from privlm.resources.models import load_model  # noqa: E402
from privlm.synthesis.pe.config import PEConfig  # noqa: E402


@contextlib.contextmanager
def every_copy() -> Iterator[None]:
    """``sample_many`` without its prompt cache: ``generate`` runs each sample's copy of the prompt."""
    cached = generation._prompt_cache
    generation._prompt_cache = lambda *args: None
    try:
        yield
    finally:
        generation._prompt_cache = cached


def workloads(tokenizer, prompts: int, samples: int) -> dict[str, tuple[list[str], int]]:
    """The prompts and samples per prompt of each workload (public text only)."""
    config, texts = PEConfig(), public_texts(prompts)
    rewrites = [
        chat_prompt(tokenizer, config.variation_instruction.format(label_name="positive", text=t)) for t in texts
    ]
    zero_shot = [chat_prompt(tokenizer, DEFAULT_INSTRUCTION.format(label_name="positive"))]
    return {"pe_rewrites": (rewrites, config.variations), "zero_shot": (zero_shot, samples)}


def measure(model, tokenizer, prompts: list[str], per_prompt: int, sampling, repeats: int) -> dict:
    """Both variants on one workload, alternated: median CPU seconds per call, their ratio, and whether they agree."""
    texts: dict[str, list[list[str]]] = {}

    def timed(variant: str, context: Callable[[], contextlib.AbstractContextManager]) -> Callable[[], float]:
        def run() -> float:
            start = time.process_time()
            with context():
                texts[variant] = sample_many(model, tokenizer, prompts, per_prompt, 0, sampling, batch_size=48)
            return time.process_time() - start

        return run

    times, median = alternate(
        {"every_copy": timed("every_copy", every_copy), "prompt_once": timed("prompt_once", contextlib.nullcontext)},
        repeats,
    )
    special = not tokenizer.chat_template
    return {
        "prompts": len(prompts),
        "samples_per_prompt": per_prompt,
        "prompt_tokens": max(len(tokenizer(p, add_special_tokens=special)["input_ids"]) for p in prompts),
        "call_s": median,
        "call_s_all": times,
        "once_over_every": median["prompt_once"] / median["every_copy"],
        "same_texts": texts["prompt_once"] == texts["every_copy"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a registered model (tiny-llama for a smoke run)")
    parser.add_argument("--prompts", type=int, default=16, help="PE rewrite prompts (3 samples each)")
    parser.add_argument("--samples", type=int, default=48, help="zero-shot samples of one instruction")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sampling_prompt_cache.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, tokenizer = load_model(args.model)
    model.eval()
    sampling = PEConfig(max_new_tokens=args.max_new_tokens).sampling
    result: dict = {
        "benchmark": "sampling_prompt_cache",
        "model": args.model,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "workloads": {},
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": 1},
    }
    for name, (prompts, per_prompt) in workloads(tokenizer, args.prompts, args.samples).items():
        result["workloads"][name] = measure(model, tokenizer, prompts, per_prompt, sampling, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    names = list(result["workloads"])
    for offset, variant in ((-0.2, "every_copy"), (0.2, "prompt_once")):
        ax.bar(
            [i + offset for i in range(len(names))],
            [result["workloads"][n]["call_s"][variant] for n in names],
            0.4,
            label=variant,
        )
    ax.set_xticks(range(len(names)), [f"{n}\n{result['workloads'][n]['once_over_every']:.2f}x" for n in names])
    ax.set_ylabel("CPU s per call")
    ax.set_title(f"sample_many, {args.model}, {args.max_new_tokens} new tokens", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)
    print(
        json.dumps(
            {n: {k: w[k] for k in ("call_s", "once_over_every", "same_texts")} for n, w in result["workloads"].items()}
        )
    )
    return result


if __name__ == "__main__":
    main()
