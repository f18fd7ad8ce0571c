"""The study's table and its targets, from ``results.jsonl`` (this folder) and the DP-direct cells of
``research/dp_finetune_rotten_tomatoes`` (DP fine-tuning on all 8,453 private sentences with the head-only
recipe, scored on the same 1,058 test sentences: the whole test split of data seed 0, as here).

Per (method, ε) and n: the fine-tune's and the head-only classifier's test accuracy, mean ± sd over the
finished seeds, and the mean seconds to make a set. Then the targets at ε = 1, n = 1,000: the best DP
synthetic set within 2 points of DP training directly on the real data, and at least its noise-only
control + 3, each beside what random real sentences of the same size score (NOT private: how far the
evaluation lets a set of that size go), with the gap's 95 % Welch interval over seeds where both sides have two
or more (do the seeds resolve the verdict? The fixed test split's own sampling error is not in it). Then every DP row against its control and against the same method at ε
none (what the noise costs it), PE against its noise-only control, GRADMM against a uniform draw of its own public candidate pool, the release as a
label filter against the greedy match, and how many texts the sets of two seeds (two DP draws) share, and each set
with its control's. Reads committed files only.

    python research/synthetic_at_scale/report.py      # writes research/synthetic_at_scale/summary.md
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from scipy import stats

HERE = Path(__file__).resolve().parent
DIRECT = HERE.parent / "dp_finetune_rotten_tomatoes"
SIZES = (1000, 100)
# the DP synthetic-text methods (gradmm@filter: the same release as a label filter, selection "filter")
# (dp-head-pool: the same candidates drawn among those a DP-SGD-trained head-only classifier gives their class)
DP_METHODS = ("gradmm@instruct", "gradmm@filter", "dp-head-pool", "dp-finetune-gen", "pe")
# Each DP method's control: the same pipeline without the private signal (GRADMM: the same candidates and a
# release of pure noise; dp-finetune-gen and PE: the public model's answers to the same prompts, untrained).
CONTROL = {
    "gradmm@instruct": "gradmm@instruct-noise",
    "gradmm@filter": "gradmm@filter-noise",
    "dp-head-pool": "instruct-pool",  # the same pool without a labeller
    "dp-finetune-gen": "zero-shot",
    "pe": "zero-shot",
}
METRICS = (("head_accuracy", "head-only"), ("accuracy", "fine-tune"))
# PE against its noise-only control (the same run with seeded pure-noise histograms): what the votes add beyond
# PE's rewrites. The control runs at ε = 1 only: pure noise ranks the candidates uniformly whatever its σ, so it
# stands for every ε
VOTES = {"pe": ("pe@noise", 1.0)}
# GRADMM's selection against a uniform draw of the same label-filtered candidates (public; pool_reach.py)
POOL_DRAW = {"gradmm@instruct": "instruct-pool", "gradmm@filter": "instruct-pool"}
# selection rules against each other at the same ε (each cell draws its own release): the release as a label
# filter against the greedy match, and a labeller DP-SGD trained for many steps against the release's one step
RULES = {"gradmm@filter": "gradmm@instruct", "dp-head-pool": "gradmm@filter"}
ORDER = (
    *DP_METHODS,
    "gradmm@instruct-noise",
    "gradmm@filter-noise",
    "pe@noise",
    "instruct-pool",
    "zero-shot",
    "random",
    "full-pool",
)
TARGET_EPS, TARGET_N = 1.0, 1000


def _rows() -> list[dict]:
    path = HERE / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _mean_sd(values: list[float]) -> str:
    """Mean ± sd over seeds and their count; one seed has no spread to show: "value (1)", never "± 0.0"."""
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.1f} (1)"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f} ({len(values)})"


def direct() -> dict[float | None, list[float]]:
    """Test accuracy (%) per seed of DP fine-tuning directly, per ε (None: the same recipe without noise)."""
    found: dict[float | None, list[float]] = defaultdict(list)
    for cell in sorted((DIRECT / "cells").glob("rt-*.json")):
        summary = json.loads(cell.read_text())
        if summary.get("norm_mode") not in ("hutchinson", None):
            continue
        preds = [json.loads(line) for line in (DIRECT / "predictions" / f"{cell.stem}.jsonl").read_text().splitlines()]
        eps = float(round(summary["epsilon"])) if summary.get("private") else None
        found[eps].append(100 * sum(p["gold"] == p["predicted"] for p in preds) / len(preds))
    return found


def grouped(rows: list[dict]) -> dict[tuple[str, float | None, int], list[dict]]:
    """The finished cells per (method, ε, n)."""
    groups: dict[tuple[str, float | None, int], list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["method"], row["epsilon"], row["n_per_class"])].append(row)
    return groups


def _set_seconds(rows: list[dict], sets: Path = HERE / "sets") -> str:
    """Mean seconds to make the set over the rows that know it (the set's ``sets/<cell>.time.json``, else the
    row's ``set_s``): a reused set's time is unknown (None; 0 in rows written before the runner kept it), and the
    count says how many rows the mean is over; "≥" when a set's time misses processes that kept no clock (its
    time file names ``unrecorded_segments``)."""
    times = [(sets / f"{r['cell']}.time.json", r.get("set_s")) for r in rows]
    saved = [json.loads(p.read_text()) if p.is_file() else {"set_s": s} for p, s in times]
    known = [t for t in saved if t.get("set_s")]
    if not known:
        return "–"
    bound = "≥ " if any(t.get("unrecorded_segments") for t in known) else ""
    return f"{bound}{statistics.mean(t['set_s'] for t in known):.0f} ({len(known)})"


def table(groups: dict[tuple[str, float | None, int], list[dict]], references: dict) -> list[str]:
    """Markdown lines: one per (method, ε); per n the fine-tune's and head-only accuracy and set seconds."""
    head = "| method | ε | " + " | ".join(f"n = {n:,}: fine-tune | head-only | set s" for n in SIZES) + " |"
    lines = [head, "|---|---|" + "---|---|---|" * len(SIZES)]
    keys = sorted({(m, e) for m, e, _ in groups}, key=lambda k: (ORDER.index(k[0]) if k[0] in ORDER else 99, str(k[1])))
    for method, eps in keys:
        parts = []
        for n in SIZES:
            found = groups.get((method, eps, n), []) or groups.get((method, eps, 0), [])
            parts += [
                _mean_sd([100 * r["accuracy"] for r in found]),
                _mean_sd([100 * r["head_accuracy"] for r in found if "head_accuracy" in r]),
                _set_seconds(found),
            ]
        lines.append(f"| {method} | {'none' if eps is None else f'{eps:g}'} | " + " | ".join(parts) + " |")
    for eps, accs in sorted(references.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        label = "none" if eps is None else f"{eps:g}"  # one set for every n: the whole private split
        parts = ["–", _mean_sd(accs), "–"] * len(SIZES)
        lines.append(f"| DP training directly (all 8,453, head-only) | {label} | " + " | ".join(parts) + " |")
    return lines


def _mean(rows: list[dict], metric: str) -> float | None:
    """Mean accuracy (%) of ``rows`` on ``metric``; None unless every row has it."""
    return statistics.mean(100 * r[metric] for r in rows) if rows and all(metric in r for r in rows) else None


def _values(rows: list[dict], metric: str) -> list[float]:
    return [100 * r[metric] for r in rows if metric in r]


def verdict_of(value: float, threshold: float) -> str:
    """ "met", or by how much the target is missed: one decimal, two where one would round a miss to 0.0."""
    if value >= threshold:
        return "met"
    miss = threshold - value
    return f"missed by {miss:.1f}" if miss >= 0.05 else f"missed by {miss:.2f}"


def welch_interval(values: list[float], reference: list[float]) -> tuple[float, float] | None:
    """The 95 % Welch interval of mean(values) − mean(reference) over seeds; ``None`` with fewer than two seeds on
    either side or no spread between seeds on both (nothing to read an interval from)."""
    if len(values) < 2 or len(reference) < 2 or statistics.variance(values) + statistics.variance(reference) == 0:
        return None
    low, high = stats.ttest_ind(values, reference, equal_var=False).confidence_interval(0.95)
    return None if math.isnan(low) or math.isnan(high) else (float(low), float(high))


def resolution(values: list[float], reference: list[float], threshold: float) -> str:
    """Whether the seeds resolve the gap mean(values) − mean(reference) against ``threshold``: its 95 % Welch
    interval over seeds (each seed its own DP draw, set and downstream fit; the fixed test split's own sampling
    error is not in it), and whether the interval lies on one side of the threshold (outside a two-sided 95 %
    interval: a one-sided test at 2.5 %, so "resolved" is conservative). Empty with fewer than two seeds on either
    side, or no spread between seeds on both (nothing to read an interval from)."""
    if (interval := welch_interval(values, reference)) is None:
        return ""
    low, high = interval
    side = (
        "above it: resolved"
        if low >= threshold
        else "below it: resolved"
        if high < threshold
        else "across it: the seeds cannot tell met from missed"
    )
    seeds = f"{len(values)} and {len(reference)} seeds, on the fixed test split"
    return f" (95 % interval of the gap over {seeds} [{low:+.1f}, {high:+.1f}], {side})"


def targets(groups: dict[tuple[str, float | None, int], list[dict]], references: dict) -> list[str]:
    """The two targets at ε = 1, n = 1,000, read on each evaluation."""
    lines = []
    reference = references.get(TARGET_EPS)
    for metric, label in METRICS:
        found = {m: _mean(groups.get((m, TARGET_EPS, TARGET_N), []), metric) for m in DP_METHODS}
        scored = {m: value for m, value in found.items() if value is not None}
        if not scored:
            lines.append(f"- {label}: no DP synthetic cell at ε = 1, n = 1,000 has finished")
            continue
        best = max(scored, key=scored.__getitem__)
        seeds = len(groups[(best, TARGET_EPS, TARGET_N)])
        if reference:
            gap = scored[best] - statistics.mean(reference)
            verdict = verdict_of(gap, -2)
            if metric == "head_accuracy":  # like for like: the same head fit on the set and on the real split
                verdict += resolution(_values(groups[(best, TARGET_EPS, TARGET_N)], metric), reference, -2)
            lines.append(
                f"- {label}: best DP set {best} {scored[best]:.1f} ({seeds} seed(s)) − DP training directly "
                f"{statistics.mean(reference):.1f} = {gap:+.1f} points (target ≥ −2): {verdict}"
                + ("" if metric == "head_accuracy" else " (across recipes: the DP-direct reference is head-only)")
            )
            pool = _mean(groups.get(("instruct-pool", None, TARGET_N), []), metric)
            if pool is not None:
                seeds_pool = len(groups[("instruct-pool", None, TARGET_N)])
                lines.append(
                    f"  - beside it, a uniform draw of the same public candidates (instruct-pool, reads nothing private, "
                    f"{seeds_pool} seed(s)) scores {pool:.1f}: {pool - statistics.mean(reference):+.1f} against DP training "
                    "directly"
                )
            real = _mean(groups.get(("random", None, TARGET_N), []), metric)
            if real is not None:
                within = real - statistics.mean(reference) >= -2
                lines.append(
                    f"  - beside it, random real sentences of the same size (NOT private) score {real:.1f}: "
                    + (
                        "the target is within reach of real data"
                        if within
                        else "real data misses it too with this head fit (head_steps.md: it moves with the fit length)"
                    )
                )
        control = _control_rows(groups, best, TARGET_EPS, TARGET_N)
        margin = _margin(scored[best], control, metric)
        if margin is not None:
            verdict = verdict_of(margin, 3)
            verdict += resolution(_values(groups[(best, TARGET_EPS, TARGET_N)], metric), _values(control, metric), 3)
            lines.append(
                f"- {label}: {best} − its control {CONTROL[best]} = {margin:+.1f} points (target ≥ +3): {verdict}"
            )
    return lines


def _control_rows(groups: dict, method: str, eps: float, n: int) -> list[dict]:
    """The finished cells of ``method``'s control at the same n (a noise-only control: also the same ε)."""
    control = CONTROL[method]
    return groups.get((control, eps if control.endswith("-noise") else None, n), [])


def _margin(value: float, control: list[dict], metric: str) -> float | None:
    reference = _mean(control, metric)
    return None if reference is None else value - reference


def _margins(rows: list[dict], reference: list[dict]) -> str:
    """``rows``' mean minus ``reference``'s, per evaluation both have, with its 95 % Welch interval over seeds
    where both sides have two or more ("head-only +5.8 [+1.2, +10.4], fine-tune +4.1")."""
    parts = []
    for metric, label in METRICS:
        if (value := _mean(rows, metric)) is None or (margin := _margin(value, reference, metric)) is None:
            continue
        interval = welch_interval(_values(rows, metric), _values(reference, metric))
        parts.append(f"{label} {margin:+.1f}" + ("" if interval is None else " [{:+.1f}, {:+.1f}]".format(*interval)))
    return ", ".join(parts)


def controls(groups: dict[tuple[str, float | None, int], list[dict]]) -> list[str]:
    """Every finished DP row against its control at the same n (and, for the noise-only control, the same ε)."""
    lines = []
    for method, eps, n in sorted(k for k in groups if k[0] in CONTROL and k[1] is not None):
        if margins := _margins(groups[(method, eps, n)], _control_rows(groups, method, eps, n)):
            lines.append(f"- {method}, ε = {eps:g}, n = {n:,} − {CONTROL[method]}: {margins} points")
    return lines


def votes(groups: dict[tuple[str, float | None, int], list[dict]]) -> list[str]:
    """Every finished PE row against its noise-only control at the same n (:data:`VOTES`)."""
    lines = []
    for method, eps, n in sorted(k for k in groups if k[0] in VOTES and k[1] is not None):
        control, control_eps = VOTES[method]
        if margins := _margins(groups[(method, eps, n)], groups.get((control, control_eps, n), [])):
            lines.append(f"- {method}, ε = {eps:g}, n = {n:,} − {control}: {margins} points")
    return lines or ["- no PE row has its noise-only control's row at the same n yet"]


def pool_draws(groups: dict[tuple[str, float | None, int], list[dict]]) -> list[str]:
    """Every finished GRADMM row (any ε) against the uniform draw of its own candidate pool at the same n."""
    lines = []
    for method, eps, n in sorted(
        (k for k in groups if k[0] in POOL_DRAW), key=lambda k: (k[2], k[1] is None, k[1] or 0)
    ):
        if margins := _margins(groups[(method, eps, n)], groups.get((POOL_DRAW[method], None, n), [])):
            name = "ε none (NOT private)" if eps is None else f"ε = {eps:g}"
            lines.append(f"- {method}, {name}, n = {n:,} − {POOL_DRAW[method]}: {margins} points")
    return lines or ["- no GRADMM row has its pool draw's row at the same n yet"]


def rules(groups: dict[tuple[str, float | None, int], list[dict]]) -> list[str]:
    """Every finished row of a selection rule against the other rule at the same ε and n (seed means)."""
    lines = []
    for method, eps, n in sorted(k for k in groups if k[0] in RULES and k[1] is not None):
        if margins := _margins(groups[(method, eps, n)], groups.get((RULES[method], eps, n), [])):
            lines.append(f"- {method}, ε = {eps:g}, n = {n:,} − {RULES[method]}: {margins} points")
    return lines or ["- no selection rule has its comparison's row at the same ε and n yet"]


def noise_costs(groups: dict[tuple[str, float | None, int], list[dict]]) -> list[str]:
    """Every finished DP row against the same method at ε none at the same n (GRADMM: no clipping, no noise;
    dp-finetune-gen: the same DP-SGD run with σ = 0): what the noise costs the method."""
    lines = []
    for method, eps, n in sorted(k for k in groups if k[0] in DP_METHODS and k[1] is not None):
        if margins := _margins(groups[(method, eps, n)], groups.get((method, None, n), [])):
            lines.append(f"- {method}, ε = {eps:g} − ε none, n = {n:,}: {margins} points")
    return lines or ["- no method has both a DP row and its ε-none row yet"]


@functools.cache
def _texts(cell: str) -> frozenset[tuple[str, int]] | None:
    """The (text, label) pairs of a finished cell's committed set (read once); None when it is not committed."""
    path = HERE / "sets" / f"{cell}.jsonl"
    if not path.exists():
        return None
    return frozenset((row["text"], row["label"]) for row in map(json.loads, path.read_text().splitlines()))


def _shared(a: frozenset, b: frozenset) -> float:
    """The share (%) of the smaller set's distinct (text, label) pairs that the other set holds too."""
    return 100 * len(a & b) / min(len(a), len(b))


def overlaps(groups: dict[tuple[str, float | None, int], list[dict]]) -> list[str]:
    """Per DP (method, ε, n): how much of its set two seeds (two DP draws) share, how much it shares with its
    control's set of the same seed (when the draws' sets agree and differ from the control's, the private
    signal, not the noise, chose them), and with the same method's set of the same seed at each smaller ε and at
    ε none (how much the budget moves the set)."""
    lines = []
    for method, eps, n in sorted(k for k in groups if k[0] in CONTROL and k[1] is not None):
        rows = sorted(groups[(method, eps, n)], key=lambda r: r["seed"])
        sets = {r["seed"]: found for r in rows if (found := _texts(r["cell"])) is not None}
        control = {r["seed"]: _texts(r["cell"]) for r in _control_rows(groups, method, eps, n)}
        pairs = [_shared(sets[a], sets[b]) for i, a in enumerate(sets) for b in list(sets)[i + 1 :]]
        against = [_shared(sets[s], control[s]) for s in sets if control.get(s)]
        parts = [f"seed against seed {statistics.mean(pairs):.0f} % ({len(pairs)} pair(s))"] if pairs else []
        parts += [f"against {CONTROL[method]} of the same seed {statistics.mean(against):.0f} %"] if against else []
        smaller = {e for m, e, size in groups if (m, size) == (method, n) and (e is None or e < eps)}
        for other in sorted(smaller, key=lambda e: (e is None, e or 0.0)):
            theirs = {r["seed"]: _texts(r["cell"]) for r in groups[(method, other, n)]}
            if shared := [_shared(sets[s], theirs[s]) for s in sets if theirs.get(s)]:
                name = "ε none" if other is None else f"ε = {other:g}"
                parts.append(f"against {name} of the same seed {statistics.mean(shared):.0f} % ({len(shared)})")
        if not parts:
            continue
        lines.append(f"- {method}, ε = {eps:g}, n = {n:,}: " + ", ".join(parts))
    return lines


def main() -> None:
    groups, references = grouped(_rows()), direct()
    text = [
        "# synthetic_at_scale: finished cells",
        "",
        "Test accuracy in % on the whole test split (1,058 sentences), mean ± sd (seeds); written by `report.py`.",
        "",
        *table(groups, references),
        "",
        "set s: mean seconds to make a set (rows that know it); ≥: a lower bound, a set made partly by processes "
        "that kept no clock (`sets/<cell>.time.json`, `unrecorded_segments`).",
        "",
        "Targets at ε = 1, n = 1,000:",
        "",
        *targets(groups, references),
        "",
        "Every DP row against its control (seed means; the control without the private signal):",
        "",
        *controls(groups),
        "",
        "PE against its noise-only control (the same iterations, every histogram seeded pure noise: what the private "
        "votes add beyond PE's rewrites; the control at ε = 1 stands for every ε, pure noise ranking uniformly):",
        "",
        *votes(groups),
        "",
        "GRADMM's selection against a uniform draw of the same label-filtered public candidates (instruct-pool, "
        "reads nothing private; the stronger public baseline, pool_reach.md):",
        "",
        *pool_draws(groups),
        "",
        "Selection rules against each other, same ε and n (the release as a label filter against the greedy match; "
        "the DP-SGD-trained labeller against the release's one-step head):",
        "",
        *rules(groups),
        "",
        "What the noise costs (each DP row against the same method at ε none, NOT private):",
        "",
        *noise_costs(groups),
        "",
        "Texts shared between sets (distinct (text, label) pairs, % of the smaller set):",
        "",
        *overlaps(groups),
        "",
    ]
    (HERE / "summary.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
