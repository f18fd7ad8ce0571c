"""``privlm data show [NAME] [--train FILE] [--validation FILE] [--test FILE]``: size, classes, verbalizer,
split sizes and a few examples of a dataset."""

from __future__ import annotations

import typer
from rich.table import Table

from privlm.cli._common import (
    DESCRIBE,
    LABELS,
    TEMPLATE,
    TEST_FILE,
    TRAIN_FILE,
    VALIDATION_FILE,
    console,
    print_json,
    public_classes,
)
from privlm.resources.datasets import data_spec, dataset_names, load_dataset
from privlm.resources.verbalizers import NO_DESCRIPTION_WARNING, undescribed

data_app = typer.Typer(help="Inspect datasets.", no_args_is_help=True)
PREVIEW_CHARS = 120


@data_app.command("show")
def show(
    name: str | None = typer.Argument(None, help=f"Dataset: {', '.join(dataset_names())}."),
    train: str | None = TRAIN_FILE,
    validation: str | None = VALIDATION_FILE,
    test: str | None = TEST_FILE,
    split: str = typer.Option("train", help="Split to preview: train, validation or test."),
    n: int = typer.Option(5, "--n", min=0, help="Number of examples to print."),
    seed: int = typer.Option(0, help="Seed of the split (stratified for built-ins, per row for user data)."),
    labels: str | None = LABELS,
    template: str | None = TEMPLATE,
    describe: str | None = DESCRIBE,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Show a dataset: examples, classes, verbalizer, split sizes and the first N examples of a split."""
    spec, classes = data_spec(name, train, validation, test), public_classes(labels, template, describe)
    name = str(spec)
    full = load_dataset(spec, seed=seed, labels=classes)
    part = load_dataset(spec, split=split, seed=seed, labels=classes)
    examples = [
        {"text": text, "label": label, "label_name": full.label_names[label]} for text, label in part.examples[:n]
    ]
    summary = {
        "name": name,
        "num_examples": len(full),
        "num_classes": full.num_classes,
        "label_names": list(full.label_names),
        "class_counts": full.class_counts(),
        "verbalizer": full.verbalizer.to_dict(),
        "generation_instruction": full.verbalizer.instruction,
        "description_warning": NO_DESCRIPTION_WARNING if undescribed(full.verbalizer) else None,
        "seed": seed,
        "split_sizes": full.split_sizes,
        "split": split,
        "split_class_counts": part.class_counts(),
        "examples": examples,
    }
    if as_json:
        print_json(summary)
        return
    overview = Table(title=f"{name}: {len(full):,} examples, {full.num_classes} classes", show_header=False)
    overview.add_row("classes", ", ".join(f"{k}={c:,}" for k, c in full.class_counts().items()))
    overview.add_row("verbalizer", f"{full.verbalizer.template!r} + {' | '.join(full.verbalizer.label_words)}")
    overview.add_row("generation", repr(full.verbalizer.instruction or "the built-in default instruction"))
    overview.add_row("splits", ", ".join(f"{k}={c:,}" for k, c in full.split_sizes.items()) + f" (seed {seed})")
    console.print(overview)
    preview = Table(title=f"first {len(examples)} of {split}")
    preview.add_column("label")
    preview.add_column("text")
    for example in examples:
        text = example["text"].replace("\n", " ")
        preview.add_row(example["label_name"], text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…")
    console.print(preview)


def register(app: typer.Typer) -> None:
    """Add ``privlm data``."""
    app.add_typer(data_app, name="data")
