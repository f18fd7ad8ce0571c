"""Report summary, verdicts against the best baseline, and the written files (no model needed)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from privlm.experiments.config import parse_config
from privlm.experiments.report import summarize, verdicts, write_report


def row(
    method: str, n: int, seed: int, accuracy: float, epsilon: float | None = None, n_train: int | None = None
) -> dict:
    return {
        "method": method,
        "epsilon": epsilon,
        "n_per_class": n,
        "seed": seed,
        "accuracy": accuracy,
        "ci_low": accuracy - 0.05,
        "ci_high": accuracy + 0.05,
        "n_train": 2 * n if n_train is None else n_train,
        "n_test": 300,
        "privacy": "test",
        "wall_time_s": 10.0,
        "mia_advantage": 0.1,
        "mia_auc": 0.55,
    }


def test_summary_is_mean_and_sample_sd_over_seeds() -> None:
    (entry,) = summarize([row("random", 5, s, a) for s, a in enumerate((0.6, 0.7, 0.8))])
    assert entry["accuracy_mean"] == pytest.approx(0.7)
    assert entry["accuracy_std"] == pytest.approx(0.1)  # ddof = 1
    assert (entry["seeds"], entry["wall_time_s"]) == (3, 30.0)


def test_rows_with_older_privacy_wording_are_summarised_with_the_methods_text_now() -> None:
    from privlm.synthesis.registry import get_method

    (same,) = summarize([row("random", 5, s, 0.7) for s in range(2)])
    assert same["privacy"] == "test"
    older = [row("random", 5, 0, 0.7), {**row("random", 5, 1, 0.7), "privacy": "test; a clause added later"}]
    (entry,) = summarize(older)
    assert entry["privacy"] == get_method("random").privacy != "test"


def test_verdicts_ignore_full_pool_and_say_when_intervals_overlap() -> None:
    rows = [
        row("gradmm", 5, 0, 0.81, epsilon=1.0),
        row("random", 5, 0, 0.70),
        row("full-pool", 50, 0, 0.95),
        row("gradmm", 10, 0, 0.72, epsilon=1.0),
        row("herding", 10, 0, 0.75),
        row("full-pool", 10, 0, 0.99),
    ]
    assert verdicts(summarize(rows)) == [
        "n=5: gradmm (ε=1) 81.0% beats the best baseline, random 70.0%.",
        "n=10: gradmm (ε=1) 72.0% does NOT beat the best baseline, herding 75.0% (within noise: the mean 95% intervals overlap).",
    ]


def test_report_files_name_the_unfinished_grid_and_embed_the_plots(tmp_path: Path) -> None:
    config = parse_config(
        {
            "model": "tiny-llama",
            "dataset": "rotten-tomatoes",
            "pool_per_class": 10,
            "n_per_class": [5],
            "seeds": [0, 1, 2],
            "methods": {"gradmm": {}, "random": {}},
        },
        "test",
    )
    rows = [row("gradmm", 5, s, 0.6, n_train=n) for s, n in enumerate((9, 10, 9))] + [row("random", 5, 0, 0.7)]
    write_report(tmp_path, rows, config, total_cells=6, command="privlm experiment x.toml --out y")
    md = (tmp_path / "report.md").read_text()
    assert "4 cells of 6 (UNFINISHED" in md and "(PROVISIONAL: the grid is unfinished)" in md
    assert "| gradmm (no DP) | 5 | 9.3 | 3 | 60.0% ± 0.0% |" in md
    assert "command: `privlm experiment x.toml --out y`" in md
    html = (tmp_path / "report.html").read_text()
    embedded = html.split('src="data:image/png;base64,')[1].split('"')[0]
    assert base64.b64decode(embedded) == (tmp_path / "plots" / "accuracy_vs_n.png").read_bytes()


def test_plots_are_written_through_temporary_files_of_their_own(tmp_path: Path) -> None:
    """The grid's processes write the same report at once; a fixed temporary name let one writer's rename pull
    the other's file away (FileNotFoundError). Another writer's file under the old fixed name must not matter."""
    config = parse_config(
        {
            "model": "tiny-llama",
            "dataset": "rotten-tomatoes",
            "pool_per_class": 10,
            "n_per_class": [5],
            "seeds": [0],
            "methods": {"random": {}},
        },
        "test",
    )
    (tmp_path / "plots" / ".accuracy_vs_n.png.tmp").mkdir(parents=True)  # in the way of a fixed name
    write_report(tmp_path, [row("random", 5, 0, 0.7)], config)
    assert (tmp_path / "plots" / "accuracy_vs_n.png").read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [".accuracy_vs_n.png.tmp", "accuracy_vs_n.png"]


def test_dp_entries_are_read_against_their_noise_only_control() -> None:
    from privlm.experiments.report import against_noise

    config = parse_config(
        {
            "model": "tiny-llama",
            "dataset": "rotten-tomatoes",
            "pool_per_class": "all",
            "mia": False,
            "n_per_class": [20],
            "seeds": [0, 1],
            "methods": {
                "gradmm": {"epsilons": [1.0, "none"]},
                "gradmm@noise": {"epsilons": [1.0], "noise_only": True},
                "gradmm@k": {"epsilons": [1.0], "top_k": 3},
                "zero-shot": {},
            },
        },
        "test",
    )
    rows = [row("gradmm", 20, s, a, epsilon=1.0) for s, a in enumerate((0.74, 0.76))]
    rows += [row("gradmm", 20, 0, 0.77), row("gradmm@noise", 20, 0, 0.70, epsilon=1.0), row("zero-shot", 20, 0, 0.72)]
    rows += [row("gradmm@k", 20, 0, 0.9, epsilon=1.0)]  # other parameters: gradmm@noise is not its control
    assert against_noise(summarize(rows), config) == [
        "n=20: gradmm (ε=1) 75.0% vs noise-only gradmm@noise (ε=1) 70.0%: +5.0 points from the private data "
        "(2 and 1 seeds); -2.0 points vs no DP."
    ]
