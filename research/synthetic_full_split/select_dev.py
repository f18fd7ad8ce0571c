"""Development screen for generate-select on instructed candidates: which selection rule turns
the DP release into a better training set? Validation split only — never the test split.

    OMP_NUM_THREADS=1 python research/synthetic_full_split/select_dev.py --cell gradmm@instruct_n20_seed0_eps1 \
        --noise-cell gradmm@instruct-noise_n20_seed0_eps1 --out research/synthetic_full_split/select_dev.json

For one seed's public candidate pool (``work/public-candidates``) and the cells' saved releases, each rule
picks n per class; the proxy score is a logistic regression on the frozen model's last-token features
(``prefix + text + suffix``), fit on the picked set and scored on the validation split (~1,000 texts).
A proxy only: rules worth it are then run as real grid cells (full fine-tuning, test split).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from privlm.resources.datasets import load_dataset
from privlm.resources.models import load_model
from privlm.synthesis.gradmm.filtering import Candidate, few_shot_labels
from privlm.synthesis.gradmm.prompt import build_prompt, last_hidden_from_ids
from privlm.synthesis.gradmm.release import Release
from privlm.synthesis.gradmm.select import greedy_match, match_terms

ROOT = Path("research/synthetic_full_split/work")


def features(model, prompt, seqs: list[list[int]]) -> np.ndarray:
    out = []
    for s in range(0, len(seqs), 32):
        chunk = [[*prompt.prefix_ids, *q, *prompt.suffix_ids] for q in seqs[s : s + 32]]
        with torch.no_grad():
            out.append(last_hidden_from_ids(model, chunk).double().numpy())
    return np.concatenate(out)


def proxy(train_x: np.ndarray, train_y: np.ndarray, val_x: np.ndarray, val_y: np.ndarray) -> float:
    mean, std = train_x.mean(0), train_x.std(0) + 1e-6
    clf = LogisticRegression(C=0.1, max_iter=2000).fit((train_x - mean) / std, train_y)
    return float((clf.predict((val_x - mean) / std) == val_y).mean())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cell", required=True)
    parser.add_argument("--noise-cell", required=True)
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    model, tokenizer = load_model("smollm2-135m")
    model.requires_grad_(False)
    val = load_dataset("rotten-tomatoes", "validation", seed=0)
    prompt = build_prompt(tokenizer, val.verbalizer.suffix, val.verbalizer.label_words, val.label_names)
    releases = {
        name: Release.load(ROOT / name / "synthetic.jsonl.gradmm" / "release.pt")
        for name in (args.cell, args.noise_cell)
    }
    (pool_dir,) = list((ROOT / "public-candidates").iterdir())
    cands = []
    for f in sorted(pool_dir.iterdir()):
        label = int(f.name.split("_")[0].removeprefix("class"))
        cands += [Candidate(tuple(i), tokenizer.decode(i).strip(), label, 0.0) for i in json.loads(f.read_text())]
    labels = np.array([c.label for c in cands])
    feats = features(model, prompt, [list(c.ids) for c in cands])
    val_feats = features(model, prompt, [tokenizer.encode(t, add_special_tokens=False) for t in val.texts])
    val_y = np.array(val.labels)
    predicted = np.array(few_shot_labels(model, tokenizer, prompt, [c.text for c in cands]))
    rng = np.random.default_rng(0)
    results: dict[str, list[float]] = {}

    def score(name: str, picks: list[int]) -> None:
        results.setdefault(name, []).append(proxy(feats[picks], labels[picks], val_feats, val_y))

    for filtered in (False, True):
        tag = "+filter" if filtered else ""
        eligible = [np.flatnonzero((labels == k) & ((predicted == k) | (not filtered))) for k in (0, 1)]
        for _ in range(20):
            score("random" + tag, [int(i) for e in eligible for i in rng.choice(e, args.n, replace=False)])
        for rel_name, release in releases.items():
            kind = "dp" if rel_name == args.cell else "noise"
            picks_set, picks_set_own, picks_rank, picks_margin = [], [], [], []
            m = [-release.targets[k][k].double() for k in (0, 1)]  # own-row: -(weighted class sum)
            w = (m[1] / m[1].norm() - m[0] / m[0].norm()).numpy()
            proj = feats @ w
            mid = np.median(proj)
            for k, idx in enumerate(eligible):
                sub = [cands[i] for i in idx]
                labs = [k, 1 - k]
                gram, inner = match_terms(model, release, sub, labs)
                picks_set += [int(idx[j]) for j in greedy_match(gram, inner, args.n)]
                picks_set_own += [int(idx[j]) for j in greedy_match(gram[:1], inner[:1], args.n)]
                cos = (
                    inner
                    / gram.diagonal(dim1=1, dim2=2).sqrt()
                    / torch.stack([release.targets[lab].double().norm() for lab in labs])[:, None]
                )
                contrast = (cos[0] - cos[1]).numpy()
                picks_rank += [int(idx[j]) for j in np.argsort(-contrast, kind="stable")[: args.n]]
                margin = (proj[idx] - mid) * (1 if k == 1 else -1)
                picks_margin += [int(idx[j]) for j in np.argsort(-margin, kind="stable")[: args.n]]
            score(f"{kind}:set-contrastive{tag}", picks_set)
            score(f"{kind}:set-own{tag}", picks_set_own)
            score(f"{kind}:rank-contrastive{tag}", picks_rank)
            score(f"{kind}:rank-margin{tag}", picks_margin)
    summary = {k: {"mean": float(np.mean(v)), "sd": float(np.std(v)), "runs": len(v)} for k, v in results.items()}
    summary["_meta"] = {
        "pool": len(cands),
        "per_class_after_filter": [int(((labels == k) & (predicted == k)).sum()) for k in (0, 1)],
        "validation": len(val_y),
        "n": args.n,
        "cell": args.cell,
        "noise_cell": args.noise_cell,
    }
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    for k, v in summary.items():
        print(k, v)


if __name__ == "__main__":
    main()
