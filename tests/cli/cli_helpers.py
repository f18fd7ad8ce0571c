"""Run ``privlm`` in-process the way the console script does, and read what it returned; a tiny user data file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privlm.cli import main


def exit_code(argv: list[str]) -> int:
    """The exit code of ``privlm ARGV`` (0 when the command returns normally)."""
    try:
        main(argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    return 0


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``privlm ARGV``."""
    code = exit_code(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def write_films(path: Path, per_class: int) -> Path:
    """A JSONL data file of ``per_class`` "good film" (label 1) and "bad film" (label 0) rows each; ``path``."""
    path.write_text(
        "".join(
            json.dumps({"text": f"{w} film number {i}", "label": int(w == "good")}) + "\n"
            for i in range(per_class)
            for w in ("good", "bad")
        )
    )
    return path
