"""``privlm experiment`` on a tiny grid: results, report, ``--only`` then resume, phase lines in a log;
bad config exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import exit_code as run
from cli_helpers import write_films


def test_experiment_cli_runs_resumes_and_refuses_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_films(tmp_path / "data.jsonl", 40)
    toml = tmp_path / "exp.toml"
    toml.write_text(
        f'model = "tiny-gpt2"\ndataset = "jsonl:{data}"\nlabels = ["bad", "good"]\npool_per_class = 4\nn_per_class = [2]\n'
        'seeds = [0]\ntest_size = 10\nvalidation_size = 4\n[finetune]\npreset = "tiny"\n'
        "grid = [{epochs = 1}, {epochs = 2, lr = 1e-2}]\n[methods.random]\n[methods.herding]\n"
    )
    out = tmp_path / "out"
    assert run(["experiment", str(toml), "--out", str(out), "--cells", "random_*", "--json"]) == 0
    assert [r["method"] for r in json.loads(capsys.readouterr().out)["rows"]] == ["random"]
    assert "(UNFINISHED" in (out / "report.md").read_text()
    assert "--cells 'random_*'" in (out / "report.md").read_text()
    assert run(["experiment", str(toml), "--out", str(out), "--pending"]) == 0
    assert capsys.readouterr().out.split() == ["herding_n2_seed0_epsnone"]
    assert run(["experiment", str(toml), "--out", str(out), "--pending", "--cells", "random_*", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pending"] == []
    assert run(["experiment", str(toml), "--out", str(out), "--resume", "--only", "random", "--json"]) == 0
    assert [r["method"] for r in json.loads(capsys.readouterr().out)["rows"]] == ["random"]
    assert run(["experiment", str(toml), "--out", str(out), "--resume", "--only", "kcenter"]) == 2
    assert "--only: ['kcenter'] not among" in capsys.readouterr().err
    assert run(["experiment", str(toml), "--out", str(out), "--resume", "--json"]) == 0
    captured = capsys.readouterr()
    first = json.loads(captured.out)
    assert "herding_n2_seed0_epsnone: fine-tuning on" in captured.err  # stderr is no terminal here: phases are logged
    assert [r["method"] for r in first["rows"]] == ["random", "herding"]
    assert all(r["selected"]["epochs"] in (1, 2) and len(r["grid"]) == 2 for r in first["rows"])
    assert (out / "report.md").exists() and (out / "report.html").exists()
    assert "command: `privlm experiment" in (out / "report.md").read_text()
    assert run(["experiment", str(toml), "--out", str(out)]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert run(["experiment", str(toml), "--out", str(out), "--resume", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == first["rows"]
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    assert run(["experiment", str(toml), "--out", str(out), "--pending"]) == 0
    assert capsys.readouterr().out == ""  # every cell finished: nothing left
    assert run(["experiment", str(toml), "--out", str(out), "--pending", "--keep-accounting"]) == 2
    assert "give one of them" in capsys.readouterr().err
    assert run(["experiment", str(toml), "--out", str(out), "--resume", "--shard", "1of2"]) == 2
    assert "--shard must look like K/N, e.g. 0/2 (got '1of2')" in capsys.readouterr().err
    toml.write_text("model = 1\n")
    assert run(["experiment", str(toml), "--out", str(out)]) == 2
    assert f"{toml}: missing key 'dataset'" in capsys.readouterr().err
    toml.write_text(
        f'model = "tiny-gpt2"\ndataset = "jsonl:{data}"\npool_per_class = 4\nn_per_class = [2]\n'
        "seeds = [0]\n[methods.random]\n"
    )  # user data without its public class names
    assert run(["experiment", str(toml), "--out", str(tmp_path / "other")]) == 2
    assert "is user data: give its public class names, e.g. labels = [" in capsys.readouterr().err


def test_keep_accounting_copies_a_training_still_in_its_steps_and_refuses_a_choice_of_cells(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from privlm.privacy.events import PoissonGaussianStep
    from privlm.privacy.ledger import Ledger, LedgerEntry

    out, config = tmp_path / "grid", str(tmp_path / "grid.toml")  # CONFIG is not read by --keep-accounting
    running = out / "work" / "private-cache" / "h" / "dpft-x" / "privacy.json"  # no set and no sidecar yet
    running.parent.mkdir(parents=True)
    Ledger([LedgerEntry(PoissonGaussianStep(0.05, 1.2), 7, "steps 1-7")]).save(running)
    pe_run = out / "work" / "pe_n2_seed0_eps1" / "synthetic.jsonl.pe"  # an unfinished PE run: its public state is kept
    pe_run.mkdir(parents=True)
    Ledger([LedgerEntry(PoissonGaussianStep(1.0, 9.0), 1, "PE histogram 0")], run="r1").save(pe_run / "privacy.json")
    (pe_run / "run.json").write_text('{"noise_multiplier": 9.0}\n')
    for name in ("histogram0.json", "population0.json"):
        (pe_run / name).write_text("{}\n")
    assert run(["experiment", config, "--out", str(out), "--keep-accounting", "--cells", "gradmm_*"]) == 2
    assert "drop --only, --cells and --shard" in capsys.readouterr().err
    assert not (out / "accounting.json").exists()
    assert run(["experiment", config, "--out", str(tmp_path / "empty"), "--keep-accounting"]) == 2
    assert "not an experiment folder (no work/, stale/ or accounting.json)" in capsys.readouterr().err
    assert not (tmp_path / "empty").exists()
    assert run(["experiment", config, "--out", str(out), "--keep-accounting", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) | {"out": None, "accounting": None} == {
        "out": None,
        "accounting": None,
        "ledgers": 2,
        "sidecars": 0,
        "kept_runs": str(out / "kept-runs"),
        "runs": 1,
    }
    mirrored = out / "kept-runs" / "pe_n2_seed0_eps1" / "synthetic.jsonl.pe"
    assert sorted(p.name for p in mirrored.iterdir()) == [
        "histogram0.json",
        "population0.json",
        "privacy.json",
        "run.json",
    ]
    kept = json.loads((out / "accounting.json").read_text())["ledgers"]
    assert Ledger.from_dict(kept["work/private-cache/h/dpft-x/privacy.json"]).count == 7
