"""``privlm models show NAME``: architecture, parameter count and cache path of a model."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from privlm.cli._common import console, err_console, print_json
from privlm.names import MODEL_NAMES

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

models_app = typer.Typer(help="Inspect models.", no_args_is_help=True)


def load_with_status(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, object]]:
    """Load ``name`` with a spinner on stderr when it needs conversion; returns model, tokenizer, facts."""
    from privlm.resources.models import cache_path, describe_model, is_cached, load_model

    cached = is_cached(name)
    waiting = (
        contextlib.nullcontext()
        if cached
        else err_console.status(f"Preparing {name} (first load: dequantize or download, then cache)…")
    )
    start = time.perf_counter()
    with waiting:
        model, tokenizer = load_model(name)
    path = cache_path(name)
    facts = {
        "name": name,
        "cache_path": str(path) if path else None,
        "was_cached": cached,
        "cached": is_cached(name),
        "load_seconds": round(time.perf_counter() - start, 2),
        **describe_model(model),
    }
    return model, tokenizer, facts


@models_app.command("show")
def show(
    name: str = typer.Argument(..., help=f"Model: {', '.join(MODEL_NAMES)}, a local folder or a hub id."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Load a model and show its architecture, parameter count and cache path."""
    _, _, facts = load_with_status(name)
    if as_json:
        print_json(facts)
        return
    table = Table(title=name, show_header=False)
    for key, value in facts.items():
        table.add_row(key, f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value))
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add ``privlm models``."""
    app.add_typer(models_app, name="models")
