"""The grid's public candidate pool, made ahead of its cells, in parallel, and kept in git.

GRADMM's instructed candidates and their label-filter verdicts are a function of the public model, the public
instruction and public seeds only (``privlm.synthesis.gradmm.generate``: no release is read), so unlike
everything else under ``work/`` they may be committed. The n = 1,000 pool (20,000 answers and their
verdicts) takes longer than a session on two cores and a session's machine keeps nothing, so this script
fills ``work/public-candidates/<key>/`` exactly as the cells would (the same files, the same names: a cell
then finds them there and skips the work), one process per class, and keeps the finished files in
``public-pool/<key>.jsonl`` in this folder (committed), from which a new machine restores them.

    python research/synthetic_at_scale/public_pool.py restore            # public-pool/ -> work/ (what is missing)
    python research/synthetic_at_scale/public_pool.py answers --label 0  # the class's answer batches (resumable)
    python research/synthetic_at_scale/public_pool.py labels --part 0/2  # verdicts of half the pool's pieces
    python research/synthetic_at_scale/public_pool.py hidden --label 0   # the selection's hidden states (local)
    python research/synthetic_at_scale/public_pool.py save               # work/ -> public-pool/ (what is new)

Only answer batches (``class*_seed*.json``) and verdicts (``labels-*.json``) travel; hidden states stay in
``work/`` (recomputed per machine). Nothing here reads the private split's rows: the train split is loaded for
its verbalizer (template, label words, class names) only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.atomic import json_once
from privlm.experiments.config import load_config
from privlm.progress import Task
from privlm.resources.datasets import load_dataset
from privlm.resources.models import load_model
from privlm.synthesis.gradmm.config import GradmmConfig, make_config
from privlm.synthesis.gradmm.filtering import CHUNK, Candidate
from privlm.synthesis.gradmm.generate import (
    batch_seed,
    batches_per_class,
    instructed_ids,
    instructions_for,
    public_labels,
)
from privlm.synthesis.gradmm.pool import public_candidates_dir
from privlm.synthesis.gradmm.prompt import Prompt, build_prompt
from privlm.synthesis.gradmm.select import HIDDEN, candidate_hidden

HERE = Path(__file__).resolve().parent
METHOD = "gradmm@instruct"
KEPT = ("class*_seed*.json", "labels-*.json")


def setting() -> tuple[PreTrainedModel, PreTrainedTokenizerBase, Prompt, GradmmConfig, Path, int]:
    """The model, tokenizer, prompt, GRADMM settings, public folder and largest n of the grid's instructed cells."""
    config = load_config(HERE / "config.toml")
    spec = next(m for m in config.methods if m.name == METHOD)
    params = dict(spec.params)
    gradmm = make_config(params.pop("preset"), **params, seed=0)
    train = load_dataset(config.data_spec(), split="train", seed=config.data_seed, labels=config.labels)
    if train.verbalizer.instructions(train.label_names) is not None:
        raise SystemExit("this script assumes the data's default instructions (rotten-tomatoes)")
    model, tokenizer = load_model(config.model, seed=config.data_seed)
    model.requires_grad_(False)
    verbalizer = train.verbalizer
    prompt = build_prompt(tokenizer, verbalizer.template, verbalizer.label_words, train.label_names)
    return (
        model,
        tokenizer,
        prompt,
        gradmm,
        public_candidates_dir(HERE / "work", model, gradmm, prompt),
        max(config.n_per_class),
    )


def answers(label: int) -> None:
    """Every answer batch of class ``label`` the largest cell selects from, each kept as it finishes."""
    model, tokenizer, prompt, gradmm, public, n = setting()
    public.mkdir(parents=True, exist_ok=True)
    instruction = instructions_for(prompt, gradmm)[label]
    for index in tqdm(range(batches_per_class(n, gradmm)), desc=f"class {label} answers"):
        seed = batch_seed(gradmm.candidate_seed, label, index)
        json_once(
            public / f"class{label}_seed{seed}.json",
            lambda s=seed: instructed_ids(model, tokenizer, instruction, gradmm, s),
        )


def in_cell_order(
    tokenizer: PreTrainedTokenizerBase, prompt: Prompt, gradmm: GradmmConfig, public: Path, n: int
) -> list[Candidate]:
    """The pool's candidates as a cell of ``n`` per class lists them (``synthesize``: batch index outer, class
    inner), from the answer batches in ``public``; the matching loss is not needed here (0)."""
    order = [(k, j) for j in range(batches_per_class(n, gradmm)) for k in range(len(prompt.label_token_ids))]
    candidates = []
    for k, j in order:
        path = public / f"class{k}_seed{batch_seed(gradmm.candidate_seed, k, j)}.json"
        if not path.exists():
            raise SystemExit(f"{path.name} is missing: run `answers --label {k}` first")
        for ids in json.loads(path.read_text()):
            candidates.append(Candidate(ids=tuple(ids), text=tokenizer.decode(ids).strip(), label=k, match_loss=0.0))
    return candidates


def labels(part: int, parts: int) -> None:
    """The label filter's verdicts on the pieces ``part, part + parts, …`` of the pool in the cells' order,
    kept as ``public_labels`` keeps them (its pieces start at multiples of ``CHUNK``, so the keys agree)."""
    model, tokenizer, prompt, gradmm, public, n = setting()
    candidates = in_cell_order(tokenizer, prompt, gradmm, public, n)
    for start in tqdm(range(part * CHUNK, len(candidates), parts * CHUNK), desc=f"label filter, part {part}/{parts}"):
        public_labels(model, tokenizer, prompt, candidates[start : start + CHUNK], public)


def hidden(label: int) -> None:
    """The final hidden states of class ``label``'s eligible candidates (generated for it and labelled it by
    the filter), kept as ``select_matching`` keeps them: the selection's one forward pass, done ahead and in
    parallel with the other class's (machine-local: tensors are not committed)."""
    model, tokenizer, prompt, gradmm, public, n = setting()
    candidates = in_cell_order(tokenizer, prompt, gradmm, public, n)
    predicted = public_labels(model, tokenizer, prompt, candidates, public)
    eligible = [c for c, p in zip(candidates, predicted, strict=True) if c.label == label == p]
    print(f"class {label}: {len(eligible)} of {sum(c.label == label for c in candidates)} candidates eligible")
    with tqdm(total=len(eligible), desc=f"{HIDDEN}, class {label}") as bar:
        candidate_hidden(model, prompt, eligible, public_dir=public, task=_Bar(bar))


class _Bar(Task):
    """A :class:`~privlm.progress.Task` that advances a tqdm bar (the other stages' bars here are tqdm's)."""

    def __init__(self, bar: tqdm) -> None:
        self.bar = bar

    def advance(self, amount: float = 1) -> None:
        self.bar.update(amount)


def save(public: Path, kept: Path) -> int:
    """Append to ``kept`` (JSONL, one ``{"file", "value"}`` per line) the answer batches and verdicts in
    ``public`` that it lacks; how many."""
    have = {json.loads(line)["file"] for line in kept.read_text().splitlines()} if kept.exists() else set()
    new = sorted(f for pattern in KEPT for f in public.glob(pattern) if f.name not in have)
    kept.parent.mkdir(parents=True, exist_ok=True)
    with kept.open("a") as out:
        for f in new:
            out.write(json.dumps({"file": f.name, "value": json.loads(f.read_text())}, sort_keys=True) + "\n")
    return len(new)


def restore(kept: Path, public: Path) -> int:
    """Write each file of ``kept`` into ``public`` as ``json_once`` would have, unless it is there; how many."""
    if not kept.exists():
        return 0
    public.mkdir(parents=True, exist_ok=True)
    written = 0
    for line in kept.read_text().splitlines():
        entry = json.loads(line)
        if not (public / entry["file"]).exists():
            json_once(public / entry["file"], lambda entry=entry: entry["value"])
            written += 1
    return written


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("restore")
    sub.add_parser("save")
    sub.add_parser("answers").add_argument("--label", type=int, required=True)
    sub.add_parser("labels").add_argument("--part", default="0/1", help="I/N: every N-th piece from the I-th")
    sub.add_parser("hidden").add_argument("--label", type=int, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.command == "answers":
        answers(args.label)
    elif args.command == "hidden":
        hidden(args.label)
    elif args.command == "labels":
        part, parts = map(int, args.part.split("/"))
        labels(part, parts)
    else:
        *_, public, _ = setting()
        kept = HERE / "public-pool" / f"{public.name}.jsonl"
        moved = restore(kept, public) if args.command == "restore" else save(public, kept)
        print(f"{args.command}: {moved} files")


if __name__ == "__main__":
    main(sys.argv[1:])
