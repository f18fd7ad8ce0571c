"""``privlm demo``: DP synthesis end to end on a tiny model; a second run reuses the release."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_helpers import exit_code

from privlm.cli import demo as demo_module
from privlm.cli import main
from privlm.randomness import SecureRandom
from privlm.resources.cache import CACHE_ENV
from privlm.synthesis.gradmm import generate
from privlm.synthesis.gradmm.filtering import select


@pytest.fixture
def label_filter_agrees(monkeypatch) -> None:
    """An untrained tiny model's few-shot labels reject most candidates, so the demo would keep none and
    these tests would compare empty outputs: make the label filter agree, keep the loss ranking."""
    monkeypatch.setattr(
        generate, "select", lambda cands, _pred, per_class, n: select(cands, [c.label for c in cands], per_class, n)
    )
    matching = generate.select_matching  # the demo's generate-select: same filter, same agreement
    monkeypatch.setattr(
        generate,
        "select_matching",
        lambda model, release, cands, _pred, *rest: matching(model, release, cands, [c.label for c in cands], *rest),
    )


def _demo(args: list[str], capsys) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", *args])
        raise SystemExit(0)
    assert exit_info.value.code == 0
    return json.loads(capsys.readouterr().out)


def test_demo_runs_dp_synthesis_and_reuses_its_release(
    tmp_path: Path, monkeypatch, capsys, label_filter_agrees
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    args = ["--model", "tiny-llama", "--data", "tweets", "--per-class", "2", "--eval-test", "0", "--json"]
    first = _demo(args, capsys)
    assert first["privacy"]["dp"] and first["privacy"]["epsilon_target"] == 4.0
    assert first["privacy"]["delta"] == 1e-5 and not first["reused_release"]
    assert Path(first["out"]).is_relative_to(tmp_path) and Path(first["out"]).is_file()
    assert first["data"]["verbalizer"]["label_words"] == ["sadness", "joy"]
    assert len(first["rows"]) == 4 and {row["label"] for row in first["rows"]} == {0, 1}
    settings = json.loads((Path(first["out"]).parent / "synthetic.jsonl.gradmm" / "run.json").read_text())["config"]
    assert (settings["optimizer"], settings["source"], settings["contrastive"]) == ("select", "instruct", True)
    second = _demo(args, capsys)
    assert second["reused_release"] and second["rows"] == first["rows"]
    assert second["privacy"]["release_sha256"] == first["privacy"]["release_sha256"]


def test_demo_prints_no_size_of_a_user_file_and_names_what_is_not_dp(
    tmp_path: Path, monkeypatch, capsys, label_filter_agrees
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    notes = tmp_path / "notes.jsonl"
    notes.write_text(
        "".join(
            json.dumps(
                {"text": f"note {i} about the {'bad' if i % 2 else 'good'} day", "label": "bad" if i % 2 else "good"}
            )
            + "\n"
            for i in range(37)
        )
    )
    args = [
        "--model",
        "tiny-llama",
        "--data",
        f"jsonl:{notes}",
        "--labels",
        "good,bad",
        "--per-class",
        "2",
        "--eval-test",
        "0",
        "--json",
    ]
    facts = _demo(args, capsys)
    assert "num_examples" not in facts["data"] and "split_sizes" not in facts["data"]
    assert "37" not in json.dumps(facts["data"]) and "not released" in facts["data"]["sizes_note"]
    assert any("random real" in line for line in facts["not_differentially_private"])
    builtin = _demo(
        ["--model", "tiny-llama", "--data", "tweets", "--per-class", "2", "--eval-test", "0", "--json"], capsys
    )
    assert builtin["data"]["num_examples"] > 0 and builtin["data"]["sizes_note"].startswith("public")


def test_demo_ends_with_synthetic_vs_random_real_accuracies(
    tmp_path: Path, monkeypatch, capsys, label_filter_agrees
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    args = ["--model", "tiny-llama", "--data", "tweets", "--per-class", "2", "--eval-test", "6", "--json"]
    facts = _demo(args, capsys)
    comparison = facts["comparison"]
    n_synthetic = len(facts["rows"])
    assert n_synthetic == 4
    for name in ("synthetic", "random_real"):
        scores = comparison[name]
        assert scores["n_test"] == 6 and scores["n_train"] == n_synthetic
        assert 0.0 <= scores["ci_low"] <= scores["accuracy"] <= scores["ci_high"] <= 1.0


def test_demo_rejects_negative_eval_test(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--model", "tiny-llama", "--eval-test", "-1"])
    assert exit_info.value.code == 2
    assert "--eval-test must be >= 0 (got -1)" in capsys.readouterr().err


FAST_METHODS = {
    "gradmm": {"preset": "instruct"},
    "pe": {"iterations": 1, "variations": 1, "max_new_tokens": 6},
    "dp-finetune": {"lora_layers": 1},
}
TINY = ["--model", "tiny-llama", "--data", "tweets", "--per-class", "2"]


def test_demo_runs_two_methods_on_half_the_budget_each_and_names_the_best(
    tmp_path: Path, monkeypatch, capsys, label_filter_agrees
) -> None:
    monkeypatch.setattr(demo_module, "DEMO_OPTIONS", FAST_METHODS)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    args = [*TINY, "--methods", "gradmm,pe", "--eval-test", "4"]
    facts = _demo([*args, "--json"], capsys)
    assert [run["method"] for run in facts["methods"]] == ["gradmm", "pe"]
    out = Path(facts["out"])
    files = {run["method"]: Path(run["out"]) for run in facts["methods"]}
    assert files == {"gradmm": out, "pe": out.with_name("synthetic-pe.jsonl")}
    for method, path in files.items():
        sidecar = json.loads(path.with_suffix(".privacy.json").read_text())
        assert sidecar["epsilon_target"] == 2.0 == sidecar["epsilon"] and sidecar["delta"] == 5e-6, method
        assert len(path.read_text().splitlines()) == 4
    assert all(run["budget"] == {"epsilon": 2.0, "delta": 5e-6} for run in facts["methods"])
    accuracies = [run["scores"]["accuracy"] for run in facts["methods"]]
    assert facts["best_method"] == facts["methods"][accuracies.index(max(accuracies))]["method"]
    assert facts["comparison"]["synthetic"] == facts["methods"][0]["scores"]
    ledgers = {
        m: p.with_name(p.name + (".gradmm" if m == "gradmm" else ".pe")) / "privacy.json" for m, p in files.items()
    }
    before = {m: path.read_text() for m, path in ledgers.items()}

    def no_new_noise(cls):
        raise AssertionError("a resumed demo drew fresh noise")

    monkeypatch.setattr(SecureRandom, "from_os", classmethod(no_new_noise))
    assert exit_code(["demo", *args]) == 0  # reuses the release and the histogram: no new privacy spent
    printed = capsys.readouterr().out
    assert "each (ε=2, δ=5e-06)" in printed and "(reused, no new privacy spent)" in printed
    rows = re.findall(r"DP synthetic: (\S+)\s*│\s*([\d.]+)\s*│\s*\d+\s*│\s*([\d.]+) \(", printed)
    assert [(m, float(e)) for m, e, _ in rows] == [("gradmm", 2.0), ("pe", 2.0)]
    shown = [float(acc) for _, _, acc in rows]
    best = rows[shown.index(max(shown))][0]
    assert f"best DP synthetic set: {best} (accuracy" in printed and best == facts["best_method"]
    assert {m: path.read_text() for m, path in ledgers.items()} == before
    assert exit_code(["demo", *TINY, "--methods", "gradmm,pe", "--epsilon", "8"]) == 2  # sets made at ε = 2, not 4
    assert "cannot reuse it: give another --out" in capsys.readouterr().err.replace("\n", " ")
    # pe alone would reuse its ε = 2 set but leave the gradmm set beside it uncounted: refused up front
    assert exit_code(["demo", *TINY, "--methods", "pe", "--epsilon", "2", "--delta", "5e-6"]) == 2
    assert "holds a gradmm set made at (ε=2.0, δ=5e-06) from an earlier demo" in capsys.readouterr().err.replace(
        "\n", " "
    )


def test_demo_without_comparison_names_no_best(tmp_path: Path, monkeypatch, capsys, label_filter_agrees) -> None:
    monkeypatch.setattr(demo_module, "DEMO_OPTIONS", FAST_METHODS)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert exit_code(["demo", *TINY, "--methods", "pe,gradmm", "--eval-test", "0"]) == 0
    printed = capsys.readouterr().out
    assert "no accuracy comparison was run (--eval-test 0); no best method is named" in printed
    assert "best DP synthetic set" not in printed


@pytest.mark.parametrize(
    "methods, fragments",
    [
        ("gradmm,magic", ("'magic' is not one", "dp-finetune, gradmm, pe")),
        ("pe,pe", ("names a method twice",)),
        (",", ("dp-finetune, gradmm, pe",)),
    ],
)
def test_demo_rejects_a_bad_method_list_before_writing(tmp_path: Path, monkeypatch, capsys, methods, fragments) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert exit_code(["demo", *TINY, "--methods", methods]) == 2
    err = capsys.readouterr().err
    assert all(fragment in err for fragment in fragments), err
    assert list(tmp_path.iterdir()) == []


def test_best_method_is_the_top_accuracy_ties_to_the_first_and_unscored_sets_never_win() -> None:
    runs = [
        {"method": "gradmm", "scores": {"accuracy": 0.5}},
        {"method": "pe", "scores": {"accuracy": 0.7}},
        {"method": "dp-finetune", "scores": {"accuracy": 0.7}},
    ]
    assert demo_module.best_method(runs) == "pe"
    assert demo_module.best_method([{"method": "pe", "scores": None}, *runs[:1]]) == "gradmm"
    assert demo_module.best_method([{"method": "pe", "scores": None}]) is None
