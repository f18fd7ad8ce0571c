"""A method registered from outside privlm's code reaches ``privlm synth`` with no edit to a shared file:
its option shows in ``--help`` and the command runs it end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PLUGIN = """
import json, sys
from privlm.synthesis.command import SynthCommand, SynthOption, SynthOutcome, private_examples
from privlm.synthesis.registry import Method, register_method


def prepare(request):
    request.check_output()
    load = private_examples(request.data, request.private_per_class, request.labels)

    def run(model, tokenizer, progress):
        task = progress.task("echo")
        words = ["echo"] * request.options.get("repeat", 1)
        rows = [{"text": " ".join(words), "label": k, "label_name": str(k)} for k in range(2) for _ in range(request.per_class)]
        request.out.write_text("".join(json.dumps(r) + "\\n" for r in rows))
        task.done()
        return SynthOutcome("echo", request.out, rows, {"dp": False, "warning": "NOT private: a test method"}, 0.0)

    return run


register_method("echo-method", Method(
    lambda ctx: [], "NOT private: test only", summary="test method", synth="echo",
    command=SynthCommand((SynthOption("--repeat", "repeat", int, "words per text"),), __name__ + ":prepare",
                         "privlm.synthesis.pe.mechanism:PEPaths"),
))
from privlm.cli import main
main(sys.argv[1:])
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "echo_plugin.py").write_text(PLUGIN)
    env = {**os.environ, "COLUMNS": "300"}  # help on one line per option
    return subprocess.run(
        [sys.executable, str(tmp_path / "echo_plugin.py"), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env=env,
    )


def test_a_registered_method_shows_in_help_and_runs_end_to_end(tmp_path):
    shown = _run(tmp_path, "synth", "--help")
    assert shown.returncode == 0, shown.stderr
    help_text = " ".join(shown.stdout.split())
    assert "echo" in help_text and "--repeat" in help_text and "words per text" in help_text
    done = _run(
        tmp_path,
        "synth",
        "--method",
        "echo",
        "--repeat",
        "3",
        "--model",
        "tiny-llama",
        "--data",
        "tweets",
        "--per-class",
        "2",
        "--out",
        str(tmp_path / "set.jsonl"),
        "--no-dp",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["method"] == "echo" and len(summary["rows"]) == 4 and summary["rows"][0]["text"] == "echo echo echo"
    assert (tmp_path / "set.jsonl").read_text().count("\n") == 4


def test_an_option_of_another_method_is_refused_naming_it(tmp_path):
    done = _run(
        tmp_path,
        "synth",
        "--method",
        "pe",
        "--repeat",
        "3",
        "--model",
        "tiny-llama",
        "--data",
        "tweets",
        "--per-class",
        "2",
        "--out",
        str(tmp_path / "set.jsonl"),
        "--no-dp",
    )
    assert done.returncode == 2 and done.stderr.strip() == "error: --repeat does not apply to --method pe"
