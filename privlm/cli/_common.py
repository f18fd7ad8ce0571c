"""Helpers shared by the CLI commands: JSON output and rich console."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

console = Console(stderr=False)
LABELS_HELP = (
    "Public class names of user data (jsonl:PATH, csv:PATH, hf:NAME), in class order: NAME,NAME,... or "
    "NAME=WORD,... (WORD: the class's label word; default: the name). Required for user files: class names "
    "are never read off the private rows. Rows may use a name or a class index 0..K-1."
)
err_console = Console(stderr=True, log_path=False)


def log_when_detached(text: str) -> None:
    """A timestamped line on stderr when it is not a terminal (``nohup … > log``), where progress bars
    do not draw: long runs then still say what they are doing."""
    if not err_console.is_terminal:
        err_console.log(text)


def print_json(obj: Any) -> None:
    """Print one JSON object on stdout (machine-readable output of ``--json``)."""
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))
