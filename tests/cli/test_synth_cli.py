"""``privlm synth``: bad input exits 2; SIGKILL + --resume; poisoning the data file after the release."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from privlm.cli import main
from privlm.synthesis.gradmm.pipeline import PRIVATE_PASS, GradmmPaths

ROWS = [
    ("the movie was a delight from start to finish", "pos"),
    ("slow, dull and far too long", "neg"),
    ("a warm, funny and moving story with a wonderful cast", "pos"),
    ("the plot makes no sense and the acting is wooden", "neg"),
    ("I loved every minute of it and would watch it again", "pos"),
    ("this is one of the worst films of the year", "neg"),
    ("a sharp, smart and honest picture", "pos"),
    ("terrible from the first scene to the last", "neg"),
    ("great fun for the whole family", "pos"),
    ("a bad, boring film", "neg"),
]
SMALL = [
    "--model",
    "tiny-llama",
    "--labels",
    "neg,pos",
    "--preset",
    "demo",
    "--length",
    "4",
    "--batch",
    "3",
    "--top-k",
    "8",
    "--seed",
    "3",
]


def _write_data(path: Path, rows) -> str:
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    return f"jsonl:{path}"


def _synth(args: list[str]) -> int:
    try:
        main(["synth", *args])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.mark.parametrize(
    "override, flags, fragment",
    [
        ({}, ["--epsilon", "4", "--delta", "1e-5", "--no-dp"], "--no-dp"),
        ({}, ["--epsilon", "4"], "--delta"),
        ({}, ["--epsilon", "-1", "--delta", "1e-5"], "-1"),
        ({}, ["--no-dp", "--preset", "huge"], "huge"),
        ({}, ["--no-dp", "--length", "0"], "--length"),
        ({"--per-class": "0"}, ["--no-dp"], "--per-class"),
        ({"--data": "jsonl:/nonexistent/data.jsonl"}, ["--no-dp"], "/nonexistent/data.jsonl"),
        ({"--out": "/nonexistent/dir/out.jsonl"}, ["--no-dp"], "/nonexistent/dir"),
        ({"--model": "no-such-model"}, ["--no-dp"], "no-such-model"),
        ({}, ["--no-dp", "--release", "rows"], "label-rows, full"),
        ({}, ["--no-dp", "--optimizer", "sgd"], "admm, select"),
        ({}, ["--no-dp", "--optimizer", "select", "--source", "web"], "sample, instruct"),
        ({}, ["--no-dp", "--optimizer", "admm", "--source", "instruct"], "--optimizer select"),
        (
            {},
            ["--no-dp", "--optimizer", "select", "--source", "instruct", "--instruction", "Write."],
            "must name the class by {label_name} or {label_word}",
        ),
        ({}, ["--epsilon", "1", "--delta", "1e-5", "--private-per-class", "6"], "--private-per-class 6 is larger"),
    ],
)
def test_bad_input_exits_2_with_one_line(override, flags, fragment, tmp_path, capsys) -> None:
    data = _write_data(tmp_path / "d.jsonl", ROWS)
    options = {
        "--model": "tiny-llama",
        "--data": data,
        "--labels": "neg,pos",
        "--per-class": "2",
        "--out": str(tmp_path / "o.jsonl"),
    }
    options.update(override)
    assert _synth([*[x for kv in options.items() for x in kv], *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err
    assert not (tmp_path / "o.jsonl").exists()


# The CLI in a child process with seeded_os_keys' noise keys: with some OS draws the tiny model's label filter
# keeps no example, and two empty files would compare equal whatever the resume did.
SEEDED_CLI = (
    "import itertools; from privlm.randomness import SecureRandom; keys = itertools.count(); "
    "SecureRandom.from_os = classmethod(lambda cls: SecureRandom.from_seed(next(keys), 'audit-test')); "
    "from privlm.cli import main; main()"
)


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path, seeded_os_keys) -> None:
    data = _write_data(tmp_path / "d.jsonl", ROWS)
    out = tmp_path / "killed.jsonl"
    args = [
        *SMALL,
        "--data",
        data,
        "--per-class",
        "3",
        "--outer-steps",
        "2",
        "--inner-steps",
        "10",
        "--epsilon",
        "4",
        "--delta",
        "1e-5",
    ]
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", SEEDED_CLI, "synth", *args, "--out", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    batches = GradmmPaths(out).batches
    deadline = time.monotonic() + 120
    while not (batches.is_dir() and any(batches.glob("*.json"))):
        assert proc.poll() is None and time.monotonic() < deadline, (
            f"the run ended (code {proc.returncode}) before the first batch:\n{log.read_text()[-2000:]}"
        )
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_done = len(list(batches.glob("*.json")))
    assert not out.exists() and 1 <= n_done < 6
    # the uninterrupted reference: the same release, no finished batch
    ref = tmp_path / "ref.jsonl"
    GradmmPaths(ref).workdir.mkdir()
    for name in ("release.pt", "run.json"):
        shutil.copy(GradmmPaths(out).workdir / name, GradmmPaths(ref).workdir / name)
    assert _synth([*args, "--out", str(ref), "--resume"]) == 0
    assert _synth([*args, "--out", str(out), "--resume"]) == 0
    assert out.read_bytes() == ref.read_bytes() and len(out.read_bytes()) > 0


def test_poisoned_data_file_after_release_gives_bit_identical_output(tmp_path, capsys, seeded_os_keys) -> None:
    # seeded noise: with some OS draws the tiny model's label filter keeps no example, and the comparison
    # of two empty files would prove nothing
    path = tmp_path / "d.jsonl"
    data = _write_data(path, ROWS)
    args = [
        *SMALL,
        "--data",
        data,
        "--per-class",
        "3",
        "--outer-steps",
        "2",
        "--inner-steps",
        "3",
        "--epsilon",
        "4",
        "--delta",
        "1e-5",
    ]
    first = tmp_path / "first.jsonl"
    assert _synth([*args, "--out", str(first)]) == 0
    printed = capsys.readouterr()
    shown = " ".join(printed.out.split())
    # the progress lines (stderr, not a terminal): the private pass (no count) ends before the batches start, the
    # label filter's task opens when it starts, after the batches, not with the others at the start
    lines = printed.err.splitlines()
    at = {
        key: next(i for i, line in enumerate(lines) if key in line)
        for key in (
            "done: reading the private examples",
            "start: GRADMM batches (6)",
            "done: GRADMM batches",
            "start: public label filter",
            "done: public label filter",
        )
    }
    assert list(at.values()) == sorted(at.values())
    start = next(line for line in lines if "start: reading the private examples" in line)
    assert start.split("start: ")[1].strip() == PRIVATE_PASS  # no count or total after it (N would be 10)
    noise = json.loads(GradmmPaths(first).sidecar.read_text())["examples_per_class_to_match_noise"]
    assert f"with fewer than ≈ {noise:,.0f} examples per class the target is mostly noise" in shown
    assert "the release keeps 2 rows of the LM-head gradient" in shown  # --release label-rows, the default
    _write_data(path, [("POISON " + t[::-1], "neg" if y == "pos" else "pos") for t, y in ROWS])
    second = tmp_path / "second.jsonl"
    GradmmPaths(second).workdir.mkdir()
    for name in ("release.pt", "run.json"):
        shutil.copy(GradmmPaths(first).workdir / name, GradmmPaths(second).workdir / name)
    assert _synth([*args, "--out", str(second), "--resume"]) == 0
    assert second.read_bytes() == first.read_bytes() and len(first.read_bytes()) > 0
    privacy, before = (json.loads(GradmmPaths(out).sidecar.read_text()) for out in (second, first))
    # each names its own run folder's ledger and its run's identity (grid_privacy follows them); all else is identical
    assert (privacy.pop("ledger_file"), before.pop("ledger_file")) == (
        "second.jsonl.gradmm/privacy.json",
        "first.jsonl.gradmm/privacy.json",
    )
    assert privacy.pop("ledger_run") != before.pop("ledger_run")
    assert privacy == before


def test_no_dp_says_so_in_every_output(tmp_path, capsys) -> None:
    data = _write_data(tmp_path / "d.jsonl", ROWS)
    out = tmp_path / "o.jsonl"
    args = [*SMALL, "--data", data, "--per-class", "2", "--outer-steps", "1", "--inner-steps", "2", "--no-dp"]
    assert _synth([*args, "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["privacy"]["dp"] is False and "NOT differentially private" in summary["privacy"]["warning"]
    assert json.loads(GradmmPaths(out).sidecar.read_text())["dp"] is False
    assert all(json.loads(line)["dp"] is False for line in out.read_text().splitlines())
    card = Path(summary["card"]).read_text()
    assert Path(summary["card"]) == tmp_path / "o.card.md" and "NOT differentially private" in card
    assert "(ε =" not in card


def test_the_data_card_states_the_sidecars_privacy_and_no_private_row(tmp_path, capsys) -> None:
    data = _write_data(tmp_path / "d.jsonl", ROWS)
    out = tmp_path / "o.jsonl"
    args = [*SMALL, "--data", data, "--per-class", "2", "--outer-steps", "1", "--inner-steps", "2"]
    assert _synth([*args, "--epsilon", "4", "--delta", "1e-5", "--out", str(out)]) == 0
    shown = capsys.readouterr().out
    card_file = tmp_path / "o.card.md"
    assert f"data card: {card_file}" in shown.replace("\n", "")
    card = card_file.read_text()
    sidecar = json.loads(GradmmPaths(out).sidecar.read_text())
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert f"(ε = {sidecar['epsilon']:.4g}, δ = {sidecar['delta']:.3g})-DP** for the whole file" in card
    assert f"ε accounted {sidecar['epsilon_accounted']:.4g}" in card and "add/remove-one" in card
    assert f"**Rows:** {len(rows)} (neg: 2, pos: 2)" in card and "`gradmm`; public model `tiny-llama`" in card
    assert "class names: neg, pos" in card and "privlm synth" in card and "o.privacy.json" in card
    assert not any(text in card for text, _ in ROWS)  # no private row, nor the private set's size
    assert f"{len(ROWS)} " not in card.replace(f"**Rows:** {len(rows)} ", "")


def test_a_new_label_or_no_labels_exits_2_and_never_shows_the_label(tmp_path, capsys) -> None:
    data = _write_data(tmp_path / "d.jsonl", [*ROWS, ("patient 11 tested", "hiv_positive")])
    out = tmp_path / "o.jsonl"
    base = [*SMALL, "--data", data, "--per-class", "2", "--no-dp", "--out", str(out)]
    assert _synth(base) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {tmp_path / 'd.jsonl'}:11: label is not one of the 2 class names")
    assert "hiv_positive" not in captured.err + captured.out and not out.exists()
    no_labels = [arg for arg in base if arg not in ("--labels", "neg,pos")]
    assert _synth(no_labels) == 2
    err = capsys.readouterr().err
    assert "--labels NAME,NAME,..." in err and "never read off the private rows" in err and not out.exists()


def test_outputs_do_not_depend_on_which_labels_occur(tmp_path, capsys) -> None:
    """--labels neg,pos,mixed: a file without 'neg' and 'mixed' rows gives the same prompt, metadata and
    label_names as one with every class (only the DP release's noise differs)."""
    everything = _write_data(tmp_path / "all.jsonl", [*ROWS, ("an odd, uneven film", "mixed")])
    only_pos = _write_data(tmp_path / "pos.jsonl", [(t, y) for t, y in ROWS if y == "pos"])
    outputs = []
    for data, out in ((everything, tmp_path / "a.jsonl"), (only_pos, tmp_path / "b.jsonl")):
        args = [
            *SMALL,
            "--labels",
            "neg,pos,mixed=so-so",
            "--data",
            data,
            "--per-class",
            "1",
            "--outer-steps",
            "1",
            "--inner-steps",
            "1",
            "--no-label-filter",
            "--epsilon",
            "4",
            "--delta",
            "1e-5",
            "--out",
            str(out),
        ]
        assert _synth(args) == 0
        manifest = json.loads((GradmmPaths(out).workdir / "run.json").read_text())
        sidecar = json.loads(GradmmPaths(out).sidecar.read_text())
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        outputs.append((manifest, sidecar, rows))
    capsys.readouterr()
    (m_a, s_a, rows_a), (m_b, s_b, rows_b) = outputs
    assert m_a.pop("data") != m_b.pop("data") and m_a == m_b  # the same prompt, words and names
    assert m_a["prompt"]["label_names"] == ["neg", "pos", "mixed"]
    assert m_a["prompt"]["label_words"] == ["neg", "pos", "so-so"]
    assert "private_examples" not in s_a  # the set's size N is never released (an exact N reveals membership)
    for key in ("release_sha256", "private_data", "ledger_file", "ledger_run"):  # the release, the set, its run
        assert s_a.pop(key) != s_b.pop(key)
    assert s_a == s_b
    assert [(r["label"], r["label_name"]) for r in rows_a] == [(r["label"], r["label_name"]) for r in rows_b]
    assert [r["label_name"] for r in rows_a] == ["neg", "pos", "mixed"]  # one per class, named by --labels


INSTRUCT = ["--optimizer", "select", "--source", "instruct", "--no-label-filter", "--no-dp", "--per-class", "1"]


def _instructed_prompts(monkeypatch) -> list[str]:
    """The prompts the public LM answers for instructed candidates, recorded (its answers: fixed texts)."""
    from privlm.synthesis.gradmm import generate

    prompts: list[str] = []

    def answer(model, tokenizer, prompt, n, seed, sampling):
        prompts.append(prompt)
        return [f"a short text number {i}" for i in range(n)]

    monkeypatch.setattr(generate, "sample_texts", answer)
    return prompts


def test_instructed_candidates_of_user_data_answer_its_verbalizers_instruction(tmp_path, monkeypatch) -> None:
    """No --instruction: user data gets its verbalizer's instruction (as zero-shot), not the movie-review
    default, and the sidecar names the instruction of each class."""
    prompts = _instructed_prompts(monkeypatch)
    data = _write_data(tmp_path / "d.jsonl", ROWS)
    out = tmp_path / "o.jsonl"
    assert _synth([*SMALL, "--data", data, *INSTRUCT, "--out", str(out)]) == 0
    expected = ['Write one short text for "... Label: neg".', 'Write one short text for "... Label: pos".']
    assert json.loads(GradmmPaths(out).sidecar.read_text())["instructions"] == expected
    assert sorted(set(prompts)) == [text + "\n" for text in expected]  # tiny-llama has no chat template
    assert not any("movie review" in p for p in prompts)
    config = json.loads((GradmmPaths(out).workdir / "run.json").read_text())["config"]
    assert config["instruction"] is None and config["instructions"] == expected


def test_an_instruction_may_name_the_class_by_its_word_only(tmp_path, monkeypatch) -> None:
    prompts = _instructed_prompts(monkeypatch)
    data = _write_data(tmp_path / "d.jsonl", ROWS)
    out = tmp_path / "o.jsonl"
    args = [*SMALL, "--data", data, *INSTRUCT, "--instruction", "Write a {label_word} line after {prompt}"]
    assert _synth([*args, "--out", str(out)]) == 0
    expected = ["Write a neg line after ... Label:", "Write a pos line after ... Label:"]
    assert json.loads(GradmmPaths(out).sidecar.read_text())["instructions"] == expected
    assert sorted(set(prompts)) == [text + "\n" for text in expected]
