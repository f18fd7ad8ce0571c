"""Batched sampling (``privlm.lm.generation.sample_many``) in three variants, side by side:

- ``every_copy``: every sample's copy of its prompt run through the model (what ``generate`` with
  ``num_return_sequences`` does), nucleus filtering by privlm's ``NucleusFilter``;
- ``full_sort``: each prompt run once and its keys and values repeated for its samples (``_prompt_cache``), nucleus
  filtering by transformers' ``TemperatureLogitsWarper`` + ``TopPLogitsWarper`` (a sort of the whole vocabulary
  at every step);
- ``topk_nucleus``: what privlm does, each prompt once and ``NucleusFilter`` (the top candidates, no full sort).

    python benchmarks/sampling.py --out benchmarks/results/sampling.json

Two public workloads with SmolLM2-135M (or ``--model``), 40 new tokens each, one torch thread: PE's rewrites
(``--prompts`` variation prompts around public sentences, 3 samples each, as PE asks) and zero-shot (one class
instruction, ``--samples`` samples, as zero-shot generation and the DP generator's sampling ask). The variants
alternate after a warm-up, so machine load affects them alike; the time is the median of process CPU seconds
per call. Also reported: whether all three give the same texts, and an untimed call whose every filtered row
is checked against the warpers (``filter_check``: rows, rows handed to the warper, rows that differ, and the
warper's largest float32 rounding of the cumulative mass between 0.2 and 2 times 1 − top-p). Writes JSON and a
PNG.
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
from transformers import LogitsProcessor, LogitsProcessorList  # noqa: E402
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper  # noqa: E402

import privlm.lm.generation as generation  # noqa: E402
from privlm.lm.generation import DEFAULT_INSTRUCTION, chat_prompt, sample_many  # noqa: E402
from privlm.lm.nucleus import NucleusFilter  # noqa: E402
from privlm.resources.models import load_model  # noqa: E402
from privlm.synthesis.pe.config import PEConfig  # noqa: E402


@contextlib.contextmanager
def replaced(name: str, value: object) -> Iterator[None]:
    """``privlm.lm.generation.<name>`` replaced by ``value`` for the duration."""
    kept = getattr(generation, name)
    setattr(generation, name, value)
    try:
        yield
    finally:
        setattr(generation, name, kept)


class SortingWarpers(LogitsProcessor):
    """transformers' own temperature and top-p warpers, in ``NucleusFilter``'s place."""

    def __init__(self, top_p: float, temperature: float) -> None:
        self.warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature), TopPLogitsWarper(top_p)])

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        return self.warpers(input_ids, scores)


class CheckedFilter(NucleusFilter):
    """``NucleusFilter`` that also runs the warpers on every row it filters, and records the rows where the two
    differ and how far the warper's float32 cumulative mass near the boundary is from the float64 one."""

    def __init__(self, top_p: float, temperature: float) -> None:
        super().__init__(top_p, temperature)
        self.warpers = SortingWarpers(top_p, temperature)
        self.rows_differing, self.mass_error = 0, 0.0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        ours = super().__call__(input_ids, scores)
        self.rows_differing += int((ours != self.warpers(input_ids, scores)).any(-1).sum())
        ascending = torch.sort(scores / self.temperature).values
        float32, float64 = ascending.softmax(-1).cumsum(-1).double(), ascending.double().softmax(-1).cumsum(-1)
        near = (float64 > 0.2 * (1 - self.top_p)) & (float64 < 2 * (1 - self.top_p))  # masses around the boundary
        if near.any():
            self.mass_error = max(self.mass_error, (float32 - float64).abs()[near].max().item())
        return ours


def check_filter(model, tokenizer, prompts: list[str], per_prompt: int, sampling) -> dict:
    """One untimed call of ``sample_many`` with every row of ``NucleusFilter`` checked against the warpers."""
    made: list[CheckedFilter] = []  # one filter per generate call

    def checked(top_p: float, temperature: float) -> CheckedFilter:
        made.append(CheckedFilter(top_p, temperature))
        return made[-1]

    with replaced("NucleusFilter", checked):
        sample_many(model, tokenizer, prompts, per_prompt, 0, sampling, batch_size=48)
    return {
        "rows": sum(f.rows for f in made),
        "rows_to_warper": sum(f.rows_to_warper for f in made),
        "rows_differing": sum(f.rows_differing for f in made),
        "max_mass_error_near_boundary": max(f.mass_error for f in made),
    }


VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "every_copy": lambda: replaced("_prompt_cache", lambda *args: None),
    "full_sort": lambda: replaced("NucleusFilter", SortingWarpers),
    "topk_nucleus": contextlib.nullcontext,
}


def workloads(tokenizer, prompts: int, samples: int) -> dict[str, tuple[list[str], int]]:
    """The prompts and samples per prompt of each workload (public text only)."""
    config, texts = PEConfig(), public_texts(prompts)
    rewrites = [
        chat_prompt(tokenizer, config.variation_instruction.format(label_name="positive", text=t)) for t in texts
    ]
    zero_shot = [chat_prompt(tokenizer, DEFAULT_INSTRUCTION.format(label_name="positive"))]
    return {"pe_rewrites": (rewrites, config.variations), "zero_shot": (zero_shot, samples)}


def measure(model, tokenizer, prompts: list[str], per_prompt: int, sampling, repeats: int) -> dict:
    """The variants on one workload, alternated: median CPU seconds per call, the ratios and whether they agree."""
    texts: dict[str, list[list[str]]] = {}

    def timed(variant: str, context: Callable[[], contextlib.AbstractContextManager]) -> Callable[[], float]:
        def run() -> float:
            start = time.process_time()
            with context():
                texts[variant] = sample_many(model, tokenizer, prompts, per_prompt, 0, sampling, batch_size=48)
            return time.process_time() - start

        return run

    times, median = alternate({name: timed(name, context) for name, context in VARIANTS.items()}, repeats)
    special = not tokenizer.chat_template
    return {
        "prompts": len(prompts),
        "samples_per_prompt": per_prompt,
        "prompt_tokens": max(len(tokenizer(p, add_special_tokens=special)["input_ids"]) for p in prompts),
        "call_s": median,
        "call_s_all": times,
        "topk_over_every_copy": median["topk_nucleus"] / median["every_copy"],
        "topk_over_full_sort": median["topk_nucleus"] / median["full_sort"],
        "same_texts": texts["topk_nucleus"] == texts["every_copy"] == texts["full_sort"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a registered model (tiny-llama for a smoke run)")
    parser.add_argument("--prompts", type=int, default=16, help="PE rewrite prompts (3 samples each)")
    parser.add_argument("--samples", type=int, default=48, help="zero-shot samples of one instruction")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sampling.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, tokenizer = load_model(args.model)
    model.eval()
    sampling = PEConfig(max_new_tokens=args.max_new_tokens).sampling
    result: dict = {
        "benchmark": "sampling",
        "model": args.model,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "workloads": {},
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": 1},
    }
    for name, (prompts, per_prompt) in workloads(tokenizer, args.prompts, args.samples).items():
        result["workloads"][name] = measure(model, tokenizer, prompts, per_prompt, sampling, args.repeats)
        result["workloads"][name]["filter_check"] = check_filter(model, tokenizer, prompts, per_prompt, sampling)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = list(result["workloads"])
    for offset, variant in zip((-0.27, 0.0, 0.27), VARIANTS, strict=True):
        ax.bar(
            [i + offset for i in range(len(names))],
            [result["workloads"][n]["call_s"][variant] for n in names],
            0.27,
            label=variant,
        )
    ticks = [
        f"{n}\n{w['topk_over_every_copy']:.2f}x / {w['topk_over_full_sort']:.2f}x"
        for n, w in result["workloads"].items()
    ]
    ax.set_xticks(range(len(names)), ticks)
    ax.set_ylabel("CPU s per call")
    ax.set_title(f"sample_many, {args.model}, {args.max_new_tokens} new tokens (topk_nucleus over each)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)
    print(
        json.dumps(
            {
                n: {
                    k: w[k]
                    for k in ("call_s", "topk_over_every_copy", "topk_over_full_sort", "same_texts", "filter_check")
                }
                for n, w in result["workloads"].items()
            }
        )
    )
    return result


if __name__ == "__main__":
    main()
