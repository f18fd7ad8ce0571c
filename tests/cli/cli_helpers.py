"""Run ``privlm`` in-process the way the console script does, and read what it returned."""

from __future__ import annotations

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
