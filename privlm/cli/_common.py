"""Helpers shared by the CLI commands: JSON output and rich console."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console

console = Console(stderr=False)
err_console = Console(stderr=True)


def print_json(obj: Any) -> None:
    """Print one JSON object on stdout (machine-readable output of ``--json``)."""
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))
