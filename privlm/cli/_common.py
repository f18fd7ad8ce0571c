"""Helpers shared by the CLI commands: JSON output, rich console, and the options that name data.

Standard library, typer and rich only: ``privlm COMMAND --help`` must not import torch or transformers,
so each command imports its heavy modules inside its function.
"""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console

from privlm.resources.labels import LabelSpec, as_labels, with_description, with_template
from privlm.resources.verbalizers import DESCRIBE_HELP

console = Console(stderr=False)
LABELS_HELP = (
    "Public class names of user data (jsonl:PATH, csv:PATH, hf:NAME), in class order: NAME,NAME,... or "
    "NAME=WORD,... (WORD: the class's label word; default: the name). Required for user files: class names "
    "are never read off the private rows. Rows may use a name or a class index 0..K-1."
)
err_console = Console(stderr=True, log_path=False)
SPLIT_FILE_HELP = (
    "The {split} split, whole: a .jsonl/.csv file (or jsonl:PATH, csv:PATH) with text and label columns; "
    "the splits not given as files come from --data's seeded 80/10/10 split."
)
TRAIN_FILE = typer.Option(None, "--train", metavar="FILE", help=SPLIT_FILE_HELP.format(split="train"))
VALIDATION_FILE = typer.Option(None, "--validation", metavar="FILE", help=SPLIT_FILE_HELP.format(split="validation"))
TEST_FILE = typer.Option(None, "--test", metavar="FILE", help=SPLIT_FILE_HELP.format(split="test"))
LABELS = typer.Option(None, "--labels", metavar="NAMES", help=LABELS_HELP)
TEMPLATE = typer.Option(
    None,
    "--template",
    metavar="TEXT",
    help='Prompt of user data with {text} where the example goes, e.g. "Note: {text} Diagnosis:"; the label '
    'word follows after a space (default "{text} Label:"). Needs --labels.',
)


DESCRIBE = typer.Option(None, "--describe", metavar="TEXT", help=DESCRIBE_HELP)


def public_classes(labels: str | None, template: str | None, describe: str | None = None) -> LabelSpec | None:
    """The public classes of user data with their prompt template and description: ``--labels``,
    ``--template`` and ``--describe``."""
    return with_description(with_template(as_labels(labels), template), describe)


def log_when_detached(text: str) -> None:
    """A timestamped line on stderr when it is not a terminal (``nohup … > log``), where progress bars
    do not draw: long runs then still say what they are doing."""
    if not err_console.is_terminal:
        err_console.log(text)


def print_json(obj: Any) -> None:
    """Print one JSON object on stdout (machine-readable output of ``--json``)."""
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))
