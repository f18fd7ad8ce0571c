"""Experiment grid on a tiny model: an interrupted-then-resumed run reproduces the uninterrupted one."""

from __future__ import annotations

import fcntl
import json
import random
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from privlm.errors import UserError
from privlm.experiments import runner as experiment
from privlm.experiments.config import ExperimentConfig, load_config, parse_config
from privlm.experiments.finished import pending_cells
from privlm.experiments.runner import run_experiment
from privlm.privacy.events import GaussianRelease
from privlm.privacy.ledger import Ledger, LedgerEntry
from privlm.synthesis.registry import METHODS, Method, register_method

GOOD = ["warm", "funny", "moving", "smart", "honest", "wonderful", "delight", "loved"]
BAD = ["slow", "dull", "wooden", "worst", "terrible", "sad", "tired", "long"]
TIMING = {"wall_time_s", "set_s"}
CALLS: list[str] = []


def _first_of_each_class(ctx) -> list[dict]:
    """A stand-in ε-method (the registry's plug-in point, as GRADMM uses it): records its calls."""
    CALLS.append(f"{ctx.n_per_class}/{ctx.seed}/{ctx.epsilon}")
    rows = []
    for label in range(len(ctx.label_names)):
        rows += [{"text": t, "label": y} for t, y in ctx.pool if y == label][: ctx.n_per_class]
    return rows


@pytest.fixture(autouse=True)
def eps_method():
    register_method("first-eps", Method(_first_of_each_class, "test method", takes_epsilon=True))
    CALLS.clear()
    yield
    del METHODS["first-eps"]


def write_dataset(path: Path) -> None:
    rng = random.Random(0)
    with path.open("w") as handle:
        for i in range(160):
            label = i % 2
            words = rng.sample(GOOD if label else BAD, 2)
            handle.write(json.dumps({"text": f"the film is {words[0]} and {words[1]}", "label": label}) + "\n")


def config_text(data: Path) -> str:
    return f"""
model = "tiny-llama"
dataset = "jsonl:{data}"
labels = ["bad", "good"]
pool_per_class = 6
n_per_class = [2, 4]
seeds = [0, 1]
test_size = 12
validation_size = 8

[finetune]
preset = "tiny"
epochs = 3

[methods.first-eps]
epsilons = ["none", 1.0]
[methods.zero-shot]
max_new_tokens = 6
[methods.few-shot]
k = 2
max_new_tokens = 6
[methods.random]
[methods.herding]
[methods.k-center]
[methods.full-pool]
"""


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_resumed_experiment_reproduces_the_uninterrupted_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
    write_dataset(data)
    toml.write_text(config_text(data))
    config = load_config(toml)
    cells = config.cells()
    assert len(cells) == 2 * 2 * 2 + 5 * 2 * 2 + 2  # first-eps: two ε values; full-pool ignores n

    full = run_experiment(config, tmp_path / "full")
    assert [r["cell"] for r in full] == [c.key for c in cells]
    calls_uninterrupted = list(CALLS)

    real = experiment.fit_and_score
    count = {"n": 0}

    def crash_on_sixth(*args, **kwargs):
        count["n"] += 1
        if count["n"] == 6:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "fit_and_score", crash_on_sixth)
    CALLS.clear()
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "resumed")
    assert len((tmp_path / "resumed" / "results.jsonl").read_text().splitlines()) == 5
    with pytest.raises(UserError, match="pass --resume"):
        run_experiment(config, tmp_path / "resumed")

    count["n"] = -1000  # no more crashes; count the cells that are redone
    first_five = {
        json.loads(line)["cell"] for line in (tmp_path / "resumed" / "results.jsonl").read_text().splitlines()
    }
    partial = run_experiment(config, tmp_path / "resumed", resume=True, only=["random"])
    assert [r["cell"] for r in partial] == [c.key for c in cells if c.key in first_five or c.method == "random"]
    assert f"{len(partial)} cells of {len(cells)} (UNFINISHED" in (tmp_path / "resumed" / "report.md").read_text()
    with pytest.raises(UserError, match="--only: \\['randm'\\] not among"):
        run_experiment(config, tmp_path / "resumed", resume=True, only=["randm"])
    resumed = run_experiment(config, tmp_path / "resumed", resume=True, command="privlm experiment exp.toml")
    assert count["n"] == -1000 + len(cells) - 5
    # The sixth cell's training set was cached before the crash and is not made again.
    assert CALLS == calls_uninterrupted
    assert without_timing(resumed) == without_timing(full)
    sets = sorted((tmp_path / "full" / "sets").iterdir())
    assert {p.name for p in sets if p.suffix == ".md"} == {f"{c.key}.card.md" for c in cells}  # one card per set
    assert {p.name for p in sets if p.suffix == ".json"} == {f"{c.key}.time.json" for c in cells}  # one time each
    for name in (p for p in sets if p.suffix != ".json"):  # the sets and their cards (times differ from run to run)
        assert name.read_text() == (tmp_path / "resumed" / "sets" / name.name).read_text()
    few_card = (
        tmp_path / "full" / "sets" / f"{next(c.key for c in cells if c.method == 'few-shot')}.card.md"
    ).read_text()
    assert "NOT differentially private:** NON-PRIVATE" in few_card

    report = (tmp_path / "resumed" / "report.md").read_text()
    assert "first-eps (ε=1)" in report and "best baseline" in report and "UNFINISHED" not in report
    assert "command: `privlm experiment exp.toml`" in report
    page = (tmp_path / "resumed" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and 'src="http' not in page
    assert {p.name for p in (tmp_path / "resumed" / "plots").iterdir()} == {
        "accuracy_vs_n.png",
        "accuracy_vs_epsilon.png",
    }

    few = [r for r in full if r["method"] == "few-shot"]
    assert all(r["privacy"].startswith("NON-PRIVATE") for r in few)
    assert all(0 <= r["mia_advantage"] <= 1 and 0 <= r["mia_auc"] <= 1 for r in full)

    # Rows are matched per method: fewer seeds keeps every remaining cell (no fine-tuning at all) ...
    count["n"] = 0
    fewer = parse_config({**_toml_dict(toml), "seeds": [0]}, "fewer")
    assert without_timing(run_experiment(fewer, tmp_path / "resumed", resume=True)) == without_timing(
        [r for r in full if r["seed"] == 0]
    )
    assert count["n"] == 0
    # ... rows written before the per-method hashes existed are matched through the saved config.json ...
    log = tmp_path / "resumed" / "results.jsonl"
    log.write_text(
        "".join(
            json.dumps({k: v for k, v in json.loads(line).items() if not k.endswith("_hash") or k == "config_hash"})
            + "\n"
            for line in log.read_text().splitlines()
        )
    )
    assert len(run_experiment(fewer, tmp_path / "resumed", resume=True)) == len(fewer.cells()) and count["n"] == 0
    # ... a method whose parameters changed is rerun, alone, its old set kept aside ...
    document = _toml_dict(toml)
    document["methods"]["zero-shot"]["max_new_tokens"] = 5
    retuned = parse_config({**document, "seeds": [0]}, "retuned")
    stale = [c for c in retuned.cells() if c.method == "zero-shot"]
    assert len(stale) == 2 and pending_cells(retuned, tmp_path / "resumed") == stale  # listed as still to run
    rows = run_experiment(retuned, tmp_path / "resumed", resume=True)
    assert count["n"] == 2  # zero-shot at n = 2 and 4, seed 0
    assert pending_cells(retuned, tmp_path / "resumed") == []
    assert [r["method_hash"] for r in rows if r["method"] == "zero-shot"] == [retuned.method_hash("zero-shot")] * 2
    for kept in ("jsonl", "card.md", "time.json"):  # the old set, its card and its time, never read again
        assert (
            len(list((tmp_path / "resumed" / "stale").glob(f"zero-shot_n*_seed0_epsnone.*/zero-shot_n*.{kept}"))) == 2
        )
    # ... and other shared settings are refused.
    with pytest.raises(UserError, match="other shared settings"):
        run_experiment(parse_config({**document, "test_size": 10}, "shared"), tmp_path / "resumed", resume=True)


def test_shards_split_the_grid_and_each_reports_every_finished_cell(tmp_path: Path) -> None:
    data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
    write_dataset(data)
    head = config_text(data).split("[methods.")[0]
    toml.write_text(head.replace("n_per_class = [2, 4]", "n_per_class = [2]") + "[methods.random]\n[methods.herding]\n")
    config = load_config(toml)
    keys = [c.key for c in config.cells()]
    full = run_experiment(config, tmp_path / "full")
    out = tmp_path / "sharded"
    inner: list[list[dict]] = []

    def run_other_shard_meanwhile(text: str) -> None:  # shard 1/2 runs to the end while shard 0/2 is busy
        if not inner:
            inner.append(run_experiment(config, out, resume=True, shard=(1, 2)))

    rows = run_experiment(
        config, out, resume=True, shard=(0, 2), hooks=experiment.Hooks(phase=run_other_shard_meanwhile)
    )
    assert [r["cell"] for r in inner[0]] == keys[1::2]
    assert without_timing(rows) == without_timing(full)  # shard 0/2 also reports the cells shard 1/2 finished
    assert (
        f"{len(keys)} cells" in (out / "report.md").read_text() and "UNFINISHED" not in (out / "report.md").read_text()
    )
    assert sorted(json.loads(line)["cell"] for line in (out / "results.jsonl").read_text().splitlines()) == sorted(keys)
    with pytest.raises(UserError, match="--shard must be K/N with 0 <= K < N \\(got 2/2\\)"):
        run_experiment(config, out, resume=True, shard=(2, 2))


def _one_seed_grid(tmp_path: Path, methods: str) -> Path:
    """The test grid's TOML at n = 2, seed 0 only, with ``methods`` (TOML tables) as its methods."""
    data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
    write_dataset(data)
    head = config_text(data).split("[methods.")[0]
    toml.write_text(
        head.replace("n_per_class = [2, 4]", "n_per_class = [2]").replace("seeds = [0, 1]", "seeds = [0]") + methods
    )
    return toml


def test_a_cell_another_process_holds_is_skipped_and_run_on_the_next_resume(tmp_path: Path) -> None:
    config = load_config(_one_seed_grid(tmp_path, "[methods.random]\n[methods.herding]\n"))
    out = tmp_path / "out"
    lock = out / "work" / "random_n2_seed0_epsnone.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "a") as handle:  # "another process" is running the random cell
        fcntl.flock(handle, fcntl.LOCK_EX)
        rows = run_experiment(config, out)
    assert [r["cell"] for r in rows] == ["herding_n2_seed0_epsnone"]
    assert "2 cells" not in (out / "report.md").read_text() and "UNFINISHED" in (out / "report.md").read_text()
    rows = run_experiment(config, out, resume=True)  # the lock died with its holder
    assert [r["cell"] for r in rows] == ["random_n2_seed0_epsnone", "herding_n2_seed0_epsnone"]


def _zero_shot_grid_and_its_retuning(tmp_path: Path, methods: str) -> tuple[Path, ExperimentConfig]:
    """A one-seed n = 2 grid of zero-shot (6 new tokens) and ``methods``, run into the returned folder; the same
    grid with zero-shot's parameters changed (``max_new_tokens`` 3)."""
    toml = _one_seed_grid(tmp_path, "[methods.zero-shot]\nmax_new_tokens = 6\n" + methods)
    run_experiment(load_config(toml), tmp_path / "out")
    document = _toml_dict(toml)
    document["methods"]["zero-shot"]["max_new_tokens"] = 3
    return tmp_path / "out", parse_config(document, "retuned")


def test_a_stale_cell_another_process_runs_is_neither_moved_nor_run_until_it_is_free(tmp_path: Path) -> None:
    out, retuned = _zero_shot_grid_and_its_retuning(tmp_path, "[methods.random]\n")
    key = "zero-shot_n2_seed0_epsnone"
    cached = out / "sets" / f"{key}.jsonl"
    before, phases = cached.read_text(), []
    with open(out / "work" / f"{key}.lock", "a") as handle:  # a process with the old parameters still runs it ...

        def holder_ends_once_seen(text: str) -> None:  # ... and ends right after this run passed it over
            phases.append(text)
            if key in text:
                fcntl.flock(handle, fcntl.LOCK_UN)

        fcntl.flock(handle, fcntl.LOCK_EX)
        rows = run_experiment(retuned, out, resume=True, hooks=experiment.Hooks(phase=holder_ends_once_seen))
    assert cached.read_text() == before and not (out / "stale").exists()  # nothing moved from under it
    assert [r["cell"] for r in rows] == ["random_n2_seed0_epsnone"]  # its old row is not this grid's
    assert any(key in p and "another process" in p for p in phases)
    rows = run_experiment(retuned, out, resume=True)  # its holder is gone: set aside and rerun
    assert [r["method_hash"] for r in rows if r["cell"] == key] == [retuned.method_hash("zero-shot")]
    assert (out / "stale").is_dir() and len(list((out / "stale").glob(f"{key}.*/{key}.jsonl"))) == 1


def test_a_set_is_evaluated_only_under_the_parameters_it_was_made_with(tmp_path: Path) -> None:
    out, retuned = _zero_shot_grid_and_its_retuning(tmp_path, "")
    key = "zero-shot_n2_seed0_epsnone"
    log, cached = out / "results.jsonl", out / "sets" / f"{key}.jsonl"
    old_set, old_row = cached.read_text(), log.read_text()
    log.write_text("")  # its process was killed after making the set, before writing the row
    rows = run_experiment(retuned, out, resume=True)
    assert [r["method_hash"] for r in rows] == [retuned.method_hash("zero-shot")]
    assert [p.read_text() for p in (out / "stale").glob(f"{key}.*/{key}.jsonl")] == [old_set]  # set aside
    new_set = cached.read_text()
    assert (
        new_set != old_set
        and json.loads(new_set.splitlines()[0])["text"] != json.loads(old_set.splitlines()[0])["text"]
    )
    # the retuned run was killed before its row in turn, with the old row back in the log: its own set is kept
    log.write_text(old_row)
    rows = run_experiment(retuned, out, resume=True)
    assert [r["method_hash"] for r in rows] == [retuned.method_hash("zero-shot")] and cached.read_text() == new_set
    assert len(list((out / "stale").glob(f"{key}.*"))) == 1
    # ... and killed before its set, its run folder begun: kept too, and the seeded set made again the same
    log.write_text(old_row)
    for made in (cached, cached.with_suffix(".time.json"), cached.with_suffix(".card.md")):
        made.unlink()
    assert (out / "work" / key / "method.json").exists()
    rows = run_experiment(retuned, out, resume=True)
    assert [r["method_hash"] for r in rows] == [retuned.method_hash("zero-shot")] and cached.read_text() == new_set
    assert len(list((out / "stale").glob(f"{key}.*"))) == 1


def test_two_unsharded_runs_on_one_folder_run_each_cell_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
    write_dataset(data)
    head = config_text(data).split("[methods.")[0]
    toml.write_text(head.replace("n_per_class = [2, 4]", "n_per_class = [2]") + "[methods.random]\n[methods.herding]\n")
    config = load_config(toml)
    out, fits, real = tmp_path / "out", [], experiment.fit_and_score
    monkeypatch.setattr(experiment, "fit_and_score", lambda *a, **k: fits.append(1) or real(*a, **k))
    inner: list[list[dict]] = []

    def second_run_meanwhile(text: str) -> None:  # runs while the first run holds its first cell
        if not inner:
            inner.append(run_experiment(config, out, resume=True))

    rows = run_experiment(config, out, resume=True, hooks=experiment.Hooks(phase=second_run_meanwhile))
    assert [r["cell"] for r in inner[0]] == [c.key for c in config.cells()][1:]  # it skipped the held cell
    assert len(rows) == len(config.cells()) == len(fits)  # and the first run did not redo its cells


def _toml_dict(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())


def test_config_errors_name_the_file_and_key(tmp_path: Path) -> None:
    toml = tmp_path / "bad.toml"
    base = 'model = "tiny-llama"\ndataset = "x"\npool_per_class = 4\nseeds = [0]\n'
    cases = {
        base + "n_per_class = [2]\n": "missing key 'methods'",
        base + "n_per_class = [8]\n[methods.random]\n": "pool_per_class must be an integer >= every n_per_class",
        base + "n_per_class = [2]\n[methods.random]\nepsilons = [-1]\n": "epsilon must be a positive finite number",
        base + "n_per_class = [2]\ncolour = 1\n[methods.random]\n": "unknown key",
        base + "n_per_class = [2]\n[finetune]\npreset = 'tiny'\nepochz = 1\n[methods.random]\n": "bad \\[finetune\\]",
        base + "n_per_class = [2]\ntest_size = 0\n[methods.random]\n": "test_size must be a positive integer",
        base + "n_per_class = [2]\n[finetune]\ngrid = [{lr = 1e-3}]\n[methods.random]\n": "needs validation_size",
        base + "n_per_class = [2]\nvalidation_size = 4\n[finetune]\ngrid = [{lx = 1}]\n[methods.random]\n": "bad",
        "model = ": "not valid TOML",
        base + 'n_per_class = [2]\n[methods."random@a/b"]\n': "must be NAME or NAME@VARIANT",
        base + "n_per_class = [2]\n[head_probe]\nepochs = 0\n[methods.random]\n": "head_probe.epochs must be",
        base + "n_per_class = [2]\n[head_probe]\nepoch = 3\n[methods.random]\n": "head_probe: unknown key",
        base + "n_per_class = [2]\nhead_probe = 3\n[methods.random]\n": "head_probe must be true or a table",
    }
    for text, message in cases.items():
        toml.write_text(text)
        with pytest.raises(UserError, match=message):
            load_config(toml)
    toml.write_text(base + "n_per_class = [2]\n[methods.random]\nepsilons = [1.0]\n")
    with pytest.raises(UserError, match="takes no epsilon"):
        run_experiment(load_config(toml), tmp_path / "out")
    toml.write_text(base + "n_per_class = [2]\n[methods.few-shot]\nkk = 3\n")
    with pytest.raises(UserError, match="methods.few-shot: unknown parameter\\(s\\) \\['kk'\\]"):
        run_experiment(load_config(toml), tmp_path / "out")
    toml.write_text(base + "n_per_class = [2]\n[methods.magic]\n")
    with pytest.raises(UserError, match="unknown method 'magic'"):
        run_experiment(load_config(toml), tmp_path / "out")


def test_a_method_variant_runs_as_its_method_and_is_compared_with_baselines_only(tmp_path: Path) -> None:
    data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
    write_dataset(data)
    toml.write_text(
        f'model = "tiny-llama"\ndataset = "jsonl:{data}"\nlabels = ["bad", "good"]\npool_per_class = 4\nn_per_class = [2]\nseeds = [0]\n'
        'test_size = 8\n[finetune]\npreset = "tiny"\nepochs = 1\n'
        '[methods.first-eps]\n[methods."first-eps@dp"]\nepsilons = [1.0]\n[methods.random]\n'
    )
    rows = run_experiment(load_config(toml), tmp_path / "out")
    assert [r["cell"] for r in rows] == [
        "first-eps_n2_seed0_epsnone",
        "first-eps@dp_n2_seed0_eps1",
        "random_n2_seed0_epsnone",
    ]
    assert CALLS == ["2/0/None", "2/0/1.0"]
    verdicts = (tmp_path / "out" / "report.md").read_text().split("## Against the best baseline")[1]
    assert verdicts.count("the best baseline, random") == 2  # an ε-method is never another one's baseline
    toml.write_text(toml.read_text() + '[methods."magic@x"]\n')
    with pytest.raises(UserError, match="unknown method 'magic'"):
        run_experiment(load_config(toml), tmp_path / "out2")


def test_a_set_smaller_than_asked_is_warned_about_and_evaluated_as_it_is(tmp_path: Path) -> None:
    register_method("one-each", Method(lambda ctx: _first_of_each_class(replace(ctx, n_per_class=1)), "test method"))
    try:
        data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
        write_dataset(data)
        toml.write_text(
            f'model = "tiny-llama"\ndataset = "jsonl:{data}"\nlabels = ["bad", "good"]\npool_per_class = 4\n'
            'n_per_class = [1, 2]\nseeds = [0]\ntest_size = 8\n[finetune]\npreset = "tiny"\nepochs = 1\n'
            "[methods.one-each]\n[methods.full-pool]\n"
        )
        warned: list[str] = []
        rows = run_experiment(load_config(toml), tmp_path / "out", hooks=experiment.Hooks(warn=warned.append))
    finally:
        del METHODS["one-each"]
    assert [r["n_train"] for r in rows] == [2, 2, 8]
    assert warned == [
        "one-each_n2_seed0_epsnone: the set holds bad: 1, good: 1, fewer than the 2 per class asked (the method "
        "found no more it accepts); it is evaluated as it is, and its row's n_train says its size"
    ]


def test_a_full_pool_variant_is_one_pool_sized_cell_per_seed(tmp_path: Path) -> None:
    toml = tmp_path / "exp.toml"
    toml.write_text(
        'model = "tiny-llama"\ndataset = "x"\npool_per_class = 4\nn_per_class = [2, 3]\nseeds = [0, 1]\n'
        '[methods."full-pool@again"]\n'
    )
    assert [c.key for c in load_config(toml).cells()] == [
        "full-pool@again_n4_seed0_epsnone",
        "full-pool@again_n4_seed1_epsnone",
    ]


def test_cells_patterns_run_only_matching_cells_and_a_method_may_have_its_own_sizes(tmp_path: Path) -> None:
    data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
    write_dataset(data)
    head = config_text(data).split("[methods.")[0]
    toml.write_text(head + '[methods.random]\n[methods.first-eps]\nepsilons = ["none", 1.0]\nn_per_class = [2]\n')
    config = load_config(toml)
    assert [c.key for c in config.cells() if c.method == "first-eps"] == [
        f"first-eps_n2_seed{s}_eps{e}" for e in ("none", "1") for s in (0, 1)
    ]
    out = tmp_path / "out"
    assert pending_cells(config, out) == config.cells()  # an empty folder: every cell is still to run
    patterns = ["first-eps_*_eps1", "random_n4_seed1_*"]
    rows = run_experiment(config, out, cells_matching=patterns)
    assert [r["cell"] for r in rows] == [
        "random_n4_seed1_epsnone",
        "first-eps_n2_seed0_eps1",
        "first-eps_n2_seed1_eps1",
    ]
    assert "UNFINISHED" in (out / "report.md").read_text()
    # what is still to run, read from the folder alone, for the same choices a run takes (that it loads no model,
    # data or torch: tests/cli/test_help_imports.py)
    finished = {r["cell"] for r in rows}
    left = [c for c in config.cells() if c.key not in finished]
    assert len(left) == len(config.cells()) - 3 and pending_cells(config, out) == left
    assert pending_cells(config, out, cells_matching=patterns) == []
    assert [c.key for c in pending_cells(config, out, cells_matching=["first-eps_*"])] == [
        "first-eps_n2_seed0_epsnone",
        "first-eps_n2_seed1_epsnone",
    ]
    by_index = {c.key: i for i, c in enumerate(config.cells())}
    assert pending_cells(config, out, only=["random"], shard=(1, 2)) == [
        c for c in left if c.method == "random" and by_index[c.key] % 2 == 1
    ]
    with pytest.raises(UserError, match="--only: \\['kcenter'\\] not among"):
        pending_cells(config, out, only=["kcenter"])
    # a configuration without per-method sizes hashes as it did before they existed
    assert "sizes" not in json.dumps(load_config(toml).to_dict()["methods"][0])


def test_pool_features_are_computed_once_per_experiment_and_random_never_needs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
    write_dataset(data)
    head = config_text(data).split("[methods.")[0].replace("n_per_class = [2, 4]", "n_per_class = [2]")
    toml.write_text(head + "[methods.random]\n")
    calls: list[int] = []
    real = experiment.last_token_features
    monkeypatch.setattr(
        experiment, "last_token_features", lambda m, t, texts: calls.append(len(texts)) or real(m, t, texts)
    )
    out = tmp_path / "out"
    run_experiment(load_config(toml), out)
    assert calls == []  # random draws from indices only
    toml.write_text(head + "[methods.random]\n[methods.herding]\n")
    run_experiment(load_config(toml), out, resume=True)
    assert calls == [12]  # the 6-per-class pool, once for both herding seeds
    cached = list((out / "work" / "private-cache").glob("*/pool-features.npy"))
    assert len(cached) == 1
    (out / "results.jsonl").unlink()
    for s in (out / "sets").glob("herding_*"):
        s.unlink()
    run_experiment(load_config(toml), out, resume=True)
    assert calls == [12]  # a new process (here: a new run) reads the cached features
    np.save(cached[0], np.zeros((3, 2)))  # a file of another pool's shape is not reused
    (out / "results.jsonl").unlink()
    for s in (out / "sets").glob("herding_*"):
        s.unlink()
    run_experiment(load_config(toml), out, resume=True)
    assert calls == [12, 12] and np.load(cached[0]).shape[0] == 12


def test_the_head_only_classifier_scores_every_cell_beside_the_fine_tune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
    write_dataset(data)
    head = config_text(data).split("[methods.")[0].replace("n_per_class = [2, 4]", "n_per_class = [2]")
    plain = head + "[methods.random]\n[methods.first-eps]\nepsilons = [1.0]\n"
    toml.write_text(plain)
    without = load_config(toml)
    toml.write_text(plain.replace("[finetune]", "[head_probe]\nepochs = 5\n\n[finetune]"))
    config = load_config(toml)
    assert "head_probe" not in without.to_dict() and config.shared_hash != without.shared_hash
    assert config.head_probe_config().epochs == 5
    test_features: list[int] = []
    real = experiment.prompt_features
    monkeypatch.setattr(experiment, "prompt_features", lambda *a: test_features.append(len(a[2])) or real(*a))
    rows = run_experiment(config, tmp_path / "out")
    assert test_features == [12]  # the test prompts' features: once for every cell (train sets: in head_probe)
    for row in rows:
        assert 0.0 <= row["head_ci_low"] <= row["head_accuracy"] <= row["head_ci_high"] <= 1.0
        assert "accuracy" in row  # the fine-tune's score beside it
    report = (tmp_path / "out" / "report.md").read_text()
    assert "head-only (mean ± sd)" in report and "head-only classifier: HeadProbeConfig(epochs=5" in report


def test_a_cell_killed_while_fine_tuning_resumes_at_its_last_epoch_and_keeps_its_head_only_score(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
    write_dataset(data)
    head = config_text(data).split("[methods.")[0].replace("n_per_class = [2, 4]", "n_per_class = [6]")
    toml.write_text(head.replace("seeds = [0, 1]", "seeds = [0]") + "[head_probe]\nepochs = 5\n[methods.random]\n")
    config = load_config(toml)  # one cell: 12 rows, 2 steps per epoch, 3 epochs
    whole = run_experiment(config, tmp_path / "whole")
    fits: list[int] = []
    real = experiment.head_probe
    monkeypatch.setattr(experiment, "head_probe", lambda *a: fits.append(1) or real(*a))
    steps: list[int] = []
    kills = [4]  # the first run dies at step 4, the second epoch's last

    def step(s: int, loss: float) -> None:
        steps.append(s)
        if s in kills:
            kills.remove(s)
            raise KeyboardInterrupt

    hooks = experiment.Hooks(step=step)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "out", hooks=hooks)
    evaluation = tmp_path / "out" / "work" / "random_n6_seed0_epsnone" / "evaluation"
    assert sorted(p.name.split("-")[0] for p in evaluation.iterdir()) == ["finetune.pt", "head"]
    made = json.loads((tmp_path / "out" / "sets" / "random_n6_seed0_epsnone.time.json").read_text())["set_s"]
    steps.clear()
    toml.write_text(toml.read_text().replace("seeds = [0]", "seeds = [0, 1]"))  # a cell added to the grid meanwhile
    grown = load_config(toml)
    resumed = run_experiment(grown, tmp_path / "out", resume=True, hooks=hooks, cells_matching=["*_seed0_*"])
    assert fits == [1] and steps == [3, 4, 5, 6]  # the head-only score is kept; epoch 1 is not rerun
    assert resumed[0]["set_s"] == made >= 0  # the killed process's time making it, not the resumed one's reuse
    drop = "config_hash"  # the grown grid's: it names the grid's lists too
    assert [{k: v for k, v in r.items() if k != drop} for r in without_timing(resumed)] == [
        {k: v for k, v in r.items() if k != drop} for r in without_timing(whole)
    ]
    assert not evaluation.exists()  # the private evaluation state is gone once the row is written


def _drawn(ctx) -> list[dict]:
    """A stand-in DP method that writes its ledger and sidecar in its work folder, as GRADMM and PE do."""
    ledger = Ledger([LedgerEntry(GaussianRelease(3.0), 1, "release")])
    ledger.save(ctx.workdir / "run" / "privacy.json")
    sidecar = {"dp": True, "epsilon": ctx.epsilon, "delta": ctx.delta, "ledger_file": "run/privacy.json"}
    (ctx.workdir / "synthetic.privacy.json").write_text(json.dumps(sidecar))
    return _first_of_each_class(ctx)


def test_a_sets_ledger_sidecar_and_card_are_kept_before_its_evaluation_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine lost while a cell is evaluated (an hour at n = 1,000) keeps the drawn set's statement."""
    register_method("drawn", Method(_drawn, "test method", takes_epsilon=True))
    try:
        data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
        write_dataset(data)
        head = config_text(data).split("[methods.")[0].replace("n_per_class = [2, 4]", "n_per_class = [2]")
        toml.write_text(head.replace("seeds = [0, 1]", "seeds = [0]") + "[methods.drawn]\nepsilons = [1.0]\n")

        def lost(*args, **kwargs):
            raise KeyboardInterrupt  # the machine goes while the set is being evaluated

        monkeypatch.setattr(experiment, "fit_and_score", lost)
        with pytest.raises(KeyboardInterrupt):
            run_experiment(load_config(toml), tmp_path / "out")
        card_path = tmp_path / "out" / "sets" / "drawn_n2_seed0_eps1.card.md"
        card_path.unlink()  # as if the process had died between the set and its card
        with pytest.raises(KeyboardInterrupt):  # a resumed cell reuses the set and writes the card before evaluating
            run_experiment(load_config(toml), tmp_path / "out", resume=True)
    finally:
        del METHODS["drawn"]
    kept = json.loads((tmp_path / "out" / "accounting.json").read_text())
    cell = "work/drawn_n2_seed0_eps1"
    assert list(kept["ledgers"]) == [f"{cell}/run/privacy.json"]
    assert kept["sidecars"][f"{cell}/synthetic.privacy.json"]["epsilon"] == 1.0
    card = card_path.read_text()  # beside the set, with its ε
    assert "(ε = 1, δ = 1e-05)-DP" in card and "WARNING" not in card


def test_a_sets_time_outlives_the_work_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine lost after the set was made (the set and its time are kept, the private work folder is not):
    the row written on the next machine still says how long the set took."""
    data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
    write_dataset(data)
    head = config_text(data).split("[methods.")[0].replace("n_per_class = [2, 4]", "n_per_class = [2]")
    toml.write_text(head.replace("seeds = [0, 1]", "seeds = [0]") + "[methods.random]\n")

    def lost(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(experiment, "fit_and_score", lost)
        with pytest.raises(KeyboardInterrupt):
            run_experiment(load_config(toml), tmp_path / "out")
    made = json.loads((tmp_path / "out" / "sets" / "random_n2_seed0_epsnone.time.json").read_text())["set_s"]
    shutil.rmtree(tmp_path / "out" / "work")
    (row,) = run_experiment(load_config(toml), tmp_path / "out", resume=True)
    assert row["set_s"] == made >= 0


@pytest.mark.parametrize("first_kept_a_clock", [True, False])
def test_a_sets_time_sums_every_process_that_made_it(tmp_path: Path, first_kept_a_clock: bool) -> None:
    """A set made across two processes (the first interrupted part-way, as at the end of a stop) states both one's
    seconds, with their count; the row's wall time holds them and the evaluation's. A first process that kept no
    clock (an earlier privlm) leaves a segment of unknown length, and the set's time says it is a lower bound."""
    tries: list[int] = []

    def made_on_the_second_try(ctx) -> list[dict]:
        time.sleep(0.2)
        tries.append(1)
        if len(tries) == 1:
            raise KeyboardInterrupt
        return _first_of_each_class(ctx)

    register_method("twice", Method(made_on_the_second_try, "test method"))
    try:
        data, toml = tmp_path / "data.jsonl", tmp_path / "exp.toml"
        write_dataset(data)
        head = config_text(data).split("[methods.")[0].replace("n_per_class = [2, 4]", "n_per_class = [2]")
        toml.write_text(head.replace("seeds = [0, 1]", "seeds = [0]") + "[methods.twice]\n")
        with pytest.raises(KeyboardInterrupt):
            run_experiment(load_config(toml), tmp_path / "out")
        work = tmp_path / "out" / "work" / "twice_n2_seed0_epsnone"
        if not first_kept_a_clock:
            (work / "wall.json").unlink()
            (work / "begun").write_text("")  # what the method had left in its work folder
        (row,) = run_experiment(load_config(toml), tmp_path / "out", resume=True)
    finally:
        del METHODS["twice"]
    made = json.loads((tmp_path / "out" / "sets" / "twice_n2_seed0_epsnone.time.json").read_text())
    assert made["segments"] == 2 and row["set_s"] == made["set_s"]
    wall = json.loads((work / "wall.json").read_text())
    if first_kept_a_clock:
        assert made["set_s"] >= 0.4 and "unrecorded_segments" not in made
        assert len(wall["set"]) == 2 and all(s >= 0.2 for s in wall["set"])
    else:
        assert made["unrecorded_segments"] == 1 and wall["set"][0] is None
        assert 0.2 <= made["set_s"] <= wall["set"][1] + 1e-3  # the second process's seconds only: a lower bound
    assert len(wall["evaluation"]) == 1
    assert made["set_s"] < row["wall_time_s"] <= sum(s for s in wall["set"] + wall["evaluation"] if s is not None)


def test_a_cell_set_aside_twice_in_one_second_keeps_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(experiment.time, "strftime", lambda *_: "20260101T000000")
    for made in ("first", "second"):
        (tmp_path / "sets").mkdir(exist_ok=True)
        (tmp_path / "sets" / "cell.jsonl").write_text(made)
        (tmp_path / "work" / "cell").mkdir(parents=True)
        (tmp_path / "work" / "cell" / "ledger.jsonl").write_text(made)
        experiment._set_aside(tmp_path, "cell")
    kept = sorted((tmp_path / "stale").glob("cell.20260101T000000.*"))
    assert sorted(p.joinpath("cell.jsonl").read_text() for p in kept) == ["first", "second"]
    assert sorted(p.joinpath("cell", "ledger.jsonl").read_text() for p in kept) == ["first", "second"]
    assert not (tmp_path / "work" / "cell").exists() and not (tmp_path / "sets" / "cell.jsonl").exists()
