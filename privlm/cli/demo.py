"""``privlm demo``: load the default model and dataset and print what the demo will run."""

from __future__ import annotations

import typer
from rich.panel import Panel

from privlm.cli._common import console, print_json
from privlm.cli.models import load_with_status
from privlm.resources.datasets import DEFAULT_DATASET, load_dataset
from privlm.resources.models import DEFAULT_MODEL

PLAN = (
    "release a differentially private per-class gradient of the model's last layer on the train split",
    "generate readable synthetic examples whose gradient matches the release (GRADMM)",
    "fine-tune on the synthetic examples and report accuracy on the test split",
)


def demo(
    model: str = typer.Option(DEFAULT_MODEL, help="Model name, local folder or hub id."),
    data: str = typer.Option(DEFAULT_DATASET, help="Dataset name, jsonl:PATH or csv:PATH."),
    seed: int = typer.Option(0, help="Seed of the split."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Load the model and the dataset offline, then print the planned run (the run itself comes later)."""
    _, _, model_facts = load_with_status(model)
    dataset = load_dataset(data, seed=seed)
    text, label = load_dataset(data, split="train", seed=seed)[0]
    facts = {
        "model": model_facts,
        "data": {
            "name": data,
            "num_examples": len(dataset),
            "class_counts": dataset.class_counts(),
            "split_sizes": dataset.split_sizes,
            "verbalizer": dataset.verbalizer.to_dict(),
            "first_train_example": dataset.verbalizer.completion(text, label),
        },
        "plan": list(PLAN),
    }
    if as_json:
        print_json(facts)
        return
    splits = ", ".join(f"{split}={size:,}" for split, size in dataset.split_sizes.items())
    lines = [
        f"model [bold]{model}[/]: {model_facts['architecture']}, {model_facts['parameters']:,} parameters "
        f"(loaded in {model_facts['load_seconds']} s)",
        f"data [bold]{data}[/]: {len(dataset):,} examples; splits {splits}",
        f"verbalized example: {facts['data']['first_train_example']!r}",
    ]
    console.print(Panel.fit("\n".join(lines), title="privlm demo"))
    console.print("Planned run (not implemented yet):")
    for step, line in enumerate(PLAN, start=1):
        console.print(f"  {step}. {line}")


def register(app: typer.Typer) -> None:
    """Add ``privlm demo``."""
    app.command("demo")(demo)
