"""Ablation: what GRADMM's release and its candidate pool can reach for the head-only classifier, apart from the
greedy selection.

The head-only target (within 2 points of DP training directly, 82.3 %) is missed by 9.2 at ε = 1, and
``head_sizes.py`` shows the miss is neither the set's size nor the noise. That leaves four suspects, and this
script reads each without a new draw:

1. **The release.** GRADMM's release is the DP sum, per class, of the clipped label-row gradients at the
   zero-shot head: one DP gradient of the very classifier the head-only evaluation fits. ``release step``
   takes one step of it from the zero-shot rows, ``R = R0 − t·‖R0‖·D/‖D‖`` with ``D`` the classes' targets
   summed, ``t`` picked on the 100 validation sentences (post-processing of the release: no privacy spent).
   The noise-only control's release (pure noise) is its control.
2. **The pool.** The 20,000 public candidates, label-filtered as the grid's cells filter them:
   ``pool random`` draws 1,000 eligible candidates per class uniformly (public: no private data, three seeds;
   exactly the ``instruct-pool`` method's draw, checked against its committed grid sets);
   ``pool oracle`` (NOT private, an upper reference like random real) keeps, per class, the eligible candidates
   that are the nearest neighbours (cosine, final hidden states in the matching layout) of the most real train
   sentences of the class: the best stand-in for the real rows this pool holds, by one natural rule.
3. **The selection rule.** ``per-item`` ranks the eligible candidates of each class by the score GRADMM's greedy
   gives a one-item set (own-class cosine minus other-class cosine, each times its target's norm) and keeps the
   top 1,000: the same release and objective, item by item instead of for the sum (post-processing of the
   release: a DP set at the release's ε). Run on every release still on this machine.

4. **The labels.** Which candidates really say what their class's instruction asked for. ``pool agreed by a real
   head`` (NOT private, an oracle) draws uniformly among the eligible candidates that the converged head of the
   random real n = 1,000 set (seed 0) gives their class, and ``pool typical`` keeps those it is surest of;
   ``pool agreed by the release's one-step head`` (DP at the release's ε: post-processing) draws among those the
   release step of 1. gives their class.

Every set is fitted with the grid's recipe (40 epochs) and converged (``head_steps.converged``, pull strength
picked on validation), on the grid's features of the whole test split.

    python research/synthetic_at_scale/pool_reach.py   # writes pool_reach.json, pool_reach.md

Reads the cells' candidate batches, releases and caches under ``work/`` (git-ignored). Computes the head features
of every eligible candidate once (about 35 min on one core; kept as ``work/head-steps/pool-eligible.pt``:
public). ``pool oracle`` reads the private train split's cached hidden states (``work/private-cache``): its set
and score are a NOT private reference, never a release.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from head_sizes import _means
from head_steps import HERE, Study, accuracy, converged, fit_converged, load_study, validation_chosen
from report import _mean_sd, direct

from privlm.synthesis.gradmm.filtering import Candidate, eligible_by_class, uniform_draw
from privlm.synthesis.gradmm.generate import load_batch, public_labels
from privlm.synthesis.gradmm.release import PrivateFactors, Release
from privlm.synthesis.gradmm.release_filter import label_rows_and_direction, stepped_rows
from privlm.synthesis.gradmm.select import candidate_factors, candidate_hidden
from privlm.training.head_probe import fit_rows

WORK = HERE / "work"
PER_CLASS = 1000
SEEDS = (0, 1, 2)
STEPS = tuple(float(t) for t in torch.logspace(-3, 1, 25))  # release step lengths, relative to ‖R0‖


def releases() -> dict[str, Release]:
    """The n = 1,000 GRADMM releases still on this machine (DP, no-DP and noise-only), by cell."""
    found = {}
    for path in sorted(WORK.glob("gradmm@instruct*_n1000_*/synthetic.jsonl.gradmm/release.pt")):
        found[path.parents[1].name] = Release.load(path)
    return found


def candidates(cell: str) -> list[Candidate]:
    """A cell's candidates in the order its selection read them (batch by batch, class within batch)."""
    batches = WORK / cell / "synthetic.jsonl.gradmm" / "batches"
    order = sorted(batches.glob("class*_batch*.json"), key=lambda f: tuple(map(int, re.findall(r"\d+", f.stem)))[::-1])
    return [c for f in order for c in load_batch(f)]


def eligible(study: Study, release: Release, cands: list[Candidate], shared: Path) -> list[list[Candidate]]:
    """Per class, the candidates generated for it that the public label filter also gives it (the grid's rule)."""
    predicted = public_labels(study.model, study.tokenizer, release.prompt, cands, shared)
    return eligible_by_class(cands, predicted, 2)


def per_item(study: Study, release: Release, pool: list[list[Candidate]], shared: Path) -> list[list[int]]:
    """Per class, the indices of its eligible candidates by decreasing one-item greedy score (ties: lower index)."""
    order = []
    for k, cands in enumerate(pool):
        labels = [k, 1 - k]
        resids, hidden = candidate_factors(study.model, release.prompt, cands, labels, release.rows, public_dir=shared)
        cos = [
            (r * (hidden @ release.targets[label].double().T)).sum(1) / (r.norm(dim=1) * hidden.norm(dim=1))
            for r, label in zip(resids, labels)
        ]
        score = cos[0] - cos[1]
        order.append(sorted(range(len(cands)), key=lambda j: (-float(score[j]), j)))
    return order


def oracle(study: Study, release: Release, pool: list[list[Candidate]], shared: Path) -> list[list[int]]:
    """NOT private. Per class, eligible candidates by how many real train sentences of the class have them as
    nearest neighbour (cosine of matching-layout hidden states), then by their best similarity to one."""
    factors = PrivateFactors.load(next(WORK.glob("private-cache/*/gradmm-factors-*.pt")))
    order = []
    for k, cands in enumerate(pool):
        hidden = candidate_hidden(study.model, release.prompt, cands, public_dir=shared).double()
        cand = hidden / hidden.norm(dim=1, keepdim=True)
        real = factors.hidden[factors.labels == k].double()
        sims = (real / real.norm(dim=1, keepdim=True)) @ cand.T
        votes = torch.bincount(sims.argmax(dim=1), minlength=len(cands))
        best = sims.amax(dim=0)
        order.append(sorted(range(len(cands)), key=lambda j: (-int(votes[j]), -float(best[j]), j)))
    return order


def drawn_order(pool: list[list[Candidate]], predicted: list[int], seed: int) -> list[list[int]]:
    """Per class, the indices in ``pool`` of the instruct-pool method's draw (:func:`draw`) among the candidates
    that ``predicted`` (one class per candidate, in the pool's flat order) gives their class."""
    everyone = [c for p in pool for c in p]
    chosen = {id(c) for c in uniform_draw(everyone, predicted, PER_CLASS, len(pool), seed)}
    return [[j for j, c in enumerate(p) if id(c) in chosen] for p in pool]


def real_head_sets(
    study: Study, pool: list[list[Candidate]], features: torch.Tensor
) -> list[tuple[str, str, float | None, int, list[list[int]]]]:
    """NOT private. Two more oracles from a head that knows the real data: the converged head-only classifier of
    the random real n = 1,000 set of seed 0 (pull strength picked on validation) labels every eligible candidate
    (``features``, in the pool's flat order); ``agreed``: uniform draws (three seeds) among the candidates it gives
    their own class (a label filter that knows the real data); ``typical``: per class the candidates it gives
    their class with the largest margin."""
    row = next(r for r in study.rows if r["cell"] == f"random_n{PER_CLASS}_seed0_epsnone")
    real = study.set_features(row)
    rows = fit_converged(study.initial, real, validation_chosen(converged(study.initial, real, study.scored)))
    logits = features @ rows.T
    predicted = logits.argmax(dim=1).tolist()
    sets = []
    for seed in SEEDS:
        order = drawn_order(pool, predicted, seed)
        sets.append(("pool agreed by a real head (NOT private)", f"pool-agreed_seed{seed}", None, seed, order))
    margin = (logits[:, 1] - logits[:, 0]).tolist()
    typical, offset = [], 0
    for k, members in enumerate(pool):
        sign = 1 if k == 1 else -1
        typical.append(sorted(range(len(members)), key=lambda j: (-sign * margin[offset + j], j)))
        offset += len(members)
    sets.append(("pool typical for a real head (NOT private)", "pool-typical", None, 0, typical))
    return sets


def score(study: Study, features: torch.Tensor, classes: torch.Tensor, seed: int) -> dict:
    """The grid's 40-epoch fit and the converged fit (validation-chosen pull) of one set: test accuracies."""
    grid = accuracy(fit_rows(study.initial, features, classes, study.probe, seed), study.scored)
    logistic = converged(study.initial, (features, classes), study.scored)
    strength = validation_chosen(logistic)
    return {"grid": grid["test"], "converged": logistic[strength]["test"], "converged_c": strength}


def stepped(study: Study, release: Release, t: float) -> torch.Tensor:
    """The label-word rows one step of length ``t·‖R0‖`` along the release's summed targets from the zero-shot rows
    (the ``filter`` selection's own step, :mod:`privlm.synthesis.gradmm.release_filter`)."""
    tokens = tuple(int(t) for t in release.rows or ())
    assert tokens == tuple(release.prompt.label_token_ids), "the release's rows are not the label rows"
    return stepped_rows(*label_rows_and_direction(study.model, release), t)


def release_step(study: Study, release: Release) -> dict:
    """One step of the release's summed targets from the zero-shot rows, its length picked on validation."""
    start = study.initial.detach().double()
    curve = {t: accuracy(stepped(study, release, t), study.scored) for t in STEPS}
    chosen = max(STEPS, key=lambda t: (curve[t]["validation"], -t))  # the shortest step on ties
    return {
        "zero_shot_rows": accuracy(start, study.scored)["test"],
        "chosen_t": chosen,
        "test": curve[chosen]["test"],
        "best_test_any_t": max(v["test"] for v in curve.values()),
    }


def main() -> None:
    study = load_study()
    found = releases()
    first = next(c for c in found if not found[c].noise_only and found[c].dp)
    cands = candidates(first)
    shared = next(p for p in (WORK / "public-candidates").iterdir() if p.is_dir())
    pool = eligible(study, found[first], cands, shared)
    texts = [{c.text for c in p} for p in pool]
    for cell in found:  # every cell selected from this one pool, and its committed set from its eligible part
        assert [c.ids for c in candidates(cell)] == [c.ids for c in cands], f"{cell}: another candidate pool"
        committed = HERE / "sets" / f"{cell}.jsonl"
        if committed.exists():
            chosen = [json.loads(line) for line in committed.read_text().splitlines() if line.strip()]
            assert all(r["text"] in texts[r["label"]] for r in chosen), cell
    out: dict = {"eligible_per_class": [len(p) for p in pool], "sets": [], "release_steps": []}
    for cell, release in found.items():
        step = release_step(study, release)
        kind = "noise-only" if release.noise_only else ("DP" if release.dp else "no DP (NOT private)")
        out["release_steps"].append(
            {"cell": cell, "release": kind, "epsilon": release.epsilon if release.dp else None} | step
        )
        print(cell, kind, {k: round(100 * v, 1) if k != "chosen_t" else v for k, v in step.items()}, flush=True)
    sets: list[tuple[str, str, float | None, int, list[list[int]]]] = []
    everyone = [c for p in pool for c in p]
    for seed in SEEDS:  # the instruct-pool method's own draw: its grid cell of this seed must hold the same set
        order = drawn_order(pool, [c.label for c in everyone], seed)
        committed = HERE / "sets" / f"instruct-pool_n{PER_CLASS}_seed{seed}_epsnone.jsonl"
        if committed.exists():
            cell = [json.loads(line) for line in committed.read_text().splitlines() if line.strip()]
            drawn = uniform_draw(everyone, [c.label for c in everyone], PER_CLASS, len(pool), seed)
            assert [(r["text"], r["label"]) for r in cell] == [(c.text, c.label) for c in drawn], committed.name
        sets.append(("pool random (public)", f"pool-random_seed{seed}", None, seed, order))
    sets.append(("pool oracle (NOT private)", "pool-oracle", None, 0, oracle(study, found[first], pool, shared)))
    for cell, release in found.items():
        if release.noise_only:
            continue
        seed = int(re.search(r"seed(\d+)", cell).group(1))
        sets.append(
            (
                "per-item" if release.dp else "per-item (NOT private: the no-DP release)",
                f"per-item_{cell}",
                release.epsilon if release.dp else None,
                seed,
                per_item(study, release, pool, shared),
            )
        )
    flat = [(k, j) for k, cs in enumerate(pool) for j in range(len(cs))]
    where = {kj: i for i, kj in enumerate(flat)}
    # public: the candidates of the public pool, with the class they were generated (and filtered) for
    features, classes = study.features("pool-eligible", [(pool[k][j].text, k) for k, j in flat])
    sets += real_head_sets(study, pool, features)
    for step in out["release_steps"]:  # DP: the release's own one-step head as the label filter (post-processing)
        release = found[step["cell"]]
        if release.dp and not release.noise_only:
            predicted = (features @ stepped(study, release, step["chosen_t"]).T).argmax(dim=1).tolist()
            seed = int(re.search(r"seed(\d+)", step["cell"]).group(1))
            order = drawn_order(pool, predicted, seed)
            sets.append(
                (
                    "pool agreed by the release's one-step head (DP)",
                    f"release-agreed_{step['cell']}",
                    release.epsilon,
                    seed,
                    order,
                )
            )
    for method, name, epsilon, seed, order in sets:
        keep = torch.tensor(sorted(where[k, j] for k, o in enumerate(order) for j in o[:PER_CLASS]))
        result = score(study, features[keep], classes[keep], seed)
        out["sets"].append({"method": method, "set": name, "epsilon": epsilon, "seed": seed} | result)
        print(name, {k: round(100 * v, 1) if k != "converged_c" else v for k, v in result.items()}, flush=True)
    (HERE / "pool_reach.json").write_text(json.dumps(out, indent=1) + "\n")
    write_table(out)


def write_table(out: dict) -> None:
    sizes = json.loads((HERE / "head_sizes.json").read_text())
    grid_rows = {key: v[PER_CLASS] for key, v in _means(sizes).items()}
    lines = [
        "# What the release and the candidate pool can reach (head-only)",
        "",
        "Test accuracy in % (whole test split, 1,058), mean ± sd (sets), of the head-only classifier fitted on "
        "1,000 rows per class: `grid` the grid's recipe (40 epochs), `converged` L-BFGS with the pull strength picked "
        "on the 100 validation sentences. Written by `pool_reach.py`; eligible candidates per class: "
        f"{', '.join(f'{n:,}' for n in out['eligible_per_class'])}.",
        "",
        "| set | ε | grid | converged |",
        "|---|---|---|---|",
    ]
    groups: dict = {}
    for s in out["sets"]:
        groups.setdefault((s["method"], s["epsilon"]), []).append(s)
    for (method, epsilon), members in groups.items():
        grid = _mean_sd([100 * s["grid"] for s in members])
        conv = _mean_sd([100 * s["converged"] for s in members])
        lines.append(f"| {method} | {'none' if epsilon is None else f'{epsilon:g}'} | {grid} | {conv} |")
    for (method, epsilon), fits in sorted(grid_rows.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        eps = "none" if epsilon is None else f"{epsilon:g}"
        private = method in ("random", "full-pool") or (
            epsilon is None and method in ("gradmm@instruct", "dp-finetune-gen")
        )
        name = f"{method} (NOT private)" if private else method
        lines.append(f"| grid row: {name} | {eps} | {_mean_sd(fits['grid'])} | {_mean_sd(fits['converged'])} |")
    lines += [
        "",
        f"DP training directly on the real split (head-only, ε = 1): {_mean_sd(direct()[1.0])}.",
        "",
        "## One step of the release from the zero-shot rows",
        "",
        "`R = R0 − t·‖R0‖·D/‖D‖`, D the release's targets summed over classes, t picked on validation (shortest on "
        "ties); `best t` is the best test accuracy over the 25 step lengths (read on the test split: a ceiling, not a "
        "result).",
        "",
        "| release | ε | zero-shot rows | one step, val-chosen t | t | best t (test) |",
        "|---|---|---|---|---|---|",
    ]
    for r in out["release_steps"]:
        eps = "none" if r["epsilon"] is None else f"{r['epsilon']:g}"
        lines.append(
            f"| {r['cell']} ({r['release']}) | {eps} | {100 * r['zero_shot_rows']:.1f} | {100 * r['test']:.1f} "
            f"| {r['chosen_t']:.3g} | {100 * r['best_test_any_t']:.1f} |"
        )
    (HERE / "pool_reach.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
