"""``privlm synth``: differentially private synthetic text with any registered method (GRADMM by default).

The command's options are the common ones below plus every registered method's own
(:class:`privlm.synthesis.command.SynthCommand`); it checks the request, loads the model and runs the
method through the registry, so adding a method edits nothing here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.table import Table

from privlm.cli._common import DESCRIBE, LABELS, TEMPLATE, console, err_console, print_json, public_classes
from privlm.cli._progress import cli_progress
from privlm.errors import UserError
from privlm.synthesis.command import SynthOption, SynthRequest
from privlm.synthesis.registry import synth_commands

if TYPE_CHECKING:
    from privlm.synthesis.command import SynthCommand, SynthOutcome

DEFAULT_METHOD = "gradmm"


def print_rows(title: str, rows: list[dict[str, Any]], score: str, show: Callable[[dict[str, Any]], str]) -> None:
    """The synthetic rows as a rich table: label name, ``score`` (``show(row)``) and text."""
    table = Table(title=title)
    for col in ("label", score, "text"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["label_name"], show(row), row["text"])
    console.print(table)


def show_outcome(outcome: SynthOutcome) -> None:
    """A run's examples beside the privacy they cost."""
    title = (
        f"synthetic examples ({outcome.out})"
        if outcome.method == DEFAULT_METHOD
        else f"{outcome.method} synthetic examples ({outcome.out})"
    )
    print_rows(title, outcome.rows, *outcome.score)
    privacy = outcome.privacy
    if privacy["dp"]:
        console.print(
            f"privacy spent: (ε = {privacy['epsilon']:.4g}, δ = {privacy['delta']:.3g})-DP for the whole output ("
            + outcome.detail.format(**privacy, **privacy.get("settings", {}))
            + ")"
        )
    else:
        console.print(f"[bold red]{privacy['warning']}[/bold red]")
    for note in outcome.notes:
        console.print(note)
    console.print(
        f"{len(outcome.rows)} examples in {outcome.out} (sidecar {outcome.out.with_suffix('.privacy.json')}), "
        f"{outcome.wall_s:.0f} s"
    )


def check_privacy_args(epsilon: float | None, delta: float | None, no_dp: bool) -> None:
    """Exactly one of ``--epsilon E --delta D`` and ``--no-dp``."""
    from privlm.privacy.validation import check_delta, check_epsilon

    if no_dp and (epsilon is not None or delta is not None):
        raise UserError("--no-dp cannot be combined with --epsilon/--delta")
    if not no_dp and (epsilon is None or delta is None):
        raise UserError("give both --epsilon and --delta, or --no-dp")
    if not no_dp:
        check_epsilon(epsilon, "--epsilon")
        check_delta(delta, "--delta")


def run_request(command: SynthCommand, request: SynthRequest, json_out: bool) -> None:
    """Check the request, load the model, run the method, print its outcome."""
    from privlm.resources.models import load_model
    from privlm.resources.verbalizers import NO_DESCRIPTION_WARNING, undescribed
    from privlm.synthesis.command import public_label_names

    run = command.start(request)  # every check before the model is loaded or anything written
    model, tokenizer = load_model(request.model_name)
    if undescribed(public_label_names(request)[1]):  # before any work: the run may still be stopped
        err_console.print(f"[bold yellow]warning[/]: {NO_DESCRIPTION_WARNING}")
    with cli_progress(err_console) as progress:
        outcome = run(model, tokenizer, progress)
    card = write_card(request, outcome)
    if json_out:
        print_json({**outcome.summary(), "card": str(card)})
    else:
        show_outcome(outcome)
        console.print(f"data card: {card}")


def write_card(request: SynthRequest, outcome: SynthOutcome) -> Path:
    """``FILE.card.md`` beside the output (:mod:`privlm.synthesis.card`): the public settings of ``request``
    and the outcome's privacy statement and rows; nothing of the private rows."""
    from privlm import __version__
    from privlm.cli import invocation
    from privlm.privacy.ledger import Ledger
    from privlm.synthesis.card import write_data_card
    from privlm.synthesis.command import public_label_names

    names, verbalizer = public_label_names(request)
    ledger = outcome.privacy.get("ledger_file")
    seeded = ledger is not None and not Ledger.load(outcome.out.parent / ledger).private_release
    spec = request.labels
    public = {
        "class names": ", ".join(names),
        "label words": ", ".join(w.strip() for w in verbalizer.label_words),
        "prompt template": repr(verbalizer.template),
        "description (--describe)": getattr(spec, "description", None),
        **{f"--{k.replace('_', '-')}": v for k, v in sorted(request.options.items())},
    }
    return write_data_card(
        outcome.out,
        method=request.method,
        model=request.model_name,
        data=str(request.data),
        rows=outcome.rows,
        privacy=outcome.privacy,
        public=public,
        private_release=not seeded,
        command=invocation() or None,
        version=__version__,
    )


def method_options(commands: dict[str, SynthCommand]) -> dict[str, list[tuple[str, SynthOption]]]:
    """Every method option once (by config field), with each method that takes it, in first-seen order."""
    merged: dict[str, list[tuple[str, SynthOption]]] = {}
    for name, command in commands.items():
        for option in command.options:
            merged.setdefault(option.field, []).append((name, option))
    return merged


def _parameter(takers: list[tuple[str, SynthOption]]) -> inspect.Parameter:
    """The typer parameter of one method option; its help names the methods that take it."""
    option = takers[0][1]
    helps = {o.help for _, o in takers}
    text = (
        f"{', '.join(name for name, _ in takers)}: {option.help}"
        if len(helps) == 1
        else "; ".join(f"{name}: {o.help}" for name, o in takers)
    )
    annotation = Optional[option.type]  # noqa: UP045 (typer reads the annotation at run time)
    return inspect.Parameter(
        option.field,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=annotation,
        default=typer.Option(None, *option.flag.split(" "), help=text),
    )


def register(app: typer.Typer) -> None:
    """Add ``privlm synth``, with every registered method's options."""
    commands = synth_commands()
    options = method_options(commands)

    def synth(
        model: str = typer.Option("smollm2-135m", "--model", help="registered name, local folder or hub id"),
        data: Optional[str] = typer.Option(  # noqa: UP045
            None, "--data", help="private dataset: rotten-tomatoes, jsonl:PATH, ... (its seeded train split is read)"
        ),
        train: Optional[str] = typer.Option(  # noqa: UP045
            None, "--train", metavar="FILE", help="private file, .jsonl/.csv: the whole private set (instead of --data)"
        ),
        labels: Optional[str] = LABELS,  # noqa: UP045
        template: Optional[str] = TEMPLATE,  # noqa: UP045
        describe: Optional[str] = DESCRIBE,  # noqa: UP045
        per_class: int = typer.Option(..., "--per-class", help="synthetic examples per class"),
        out: Path = typer.Option(..., "--out", help="output FILE.jsonl (+ sidecar FILE.privacy.json)"),
        epsilon: Optional[float] = typer.Option(None, "--epsilon", help="privacy budget ε of the whole output"),  # noqa: UP045
        delta: Optional[float] = typer.Option(None, "--delta", help="privacy parameter δ"),  # noqa: UP045
        no_dp: bool = typer.Option(False, "--no-dp", help="no clipping, no noise: NOT private"),
        private_per_class: Optional[int] = typer.Option(  # noqa: UP045
            None, "--private-per-class", help="cut the private set to the first N per class (default: all of it)"
        ),
        resume: bool = typer.Option(False, "--resume", help="reuse the saved DP release and finished work"),
        json_out: bool = typer.Option(False, "--json", help="print a JSON summary"),
        method: str = typer.Option(DEFAULT_METHOD, "--method", help=f"one of {', '.join(commands)}"),
        **given: Any,
    ) -> None:
        """Generate DP synthetic examples with a registered method: last-layer gradient matching (GRADMM),
        Private Evolution, DP fine-tuning then sampling, ..."""
        from privlm.resources.datasets import data_spec

        check_privacy_args(epsilon, delta, no_dp)
        if data is not None and train is not None:
            raise UserError(
                "give --data NAME (its train split is private) or --train FILE (the whole private set), not both"
            )
        if method not in commands:
            raise UserError(f"--method {method!r} is not one of {', '.join(commands)}")
        chosen = {k: v for k, v in given.items() if v is not None}
        foreign = [
            options[k][0][1].flag.split("/")[0] for k in chosen if k not in {o.field for o in commands[method].options}
        ]
        if foreign:
            raise UserError(f"{', '.join(foreign)} does not apply to --method {method}")
        request = SynthRequest(
            method,
            model,
            data_spec(data, train),
            public_classes(labels, template, describe),
            per_class,
            out,
            not no_dp,
            epsilon,
            delta,
            private_per_class,
            resume,
            chosen,
        )
        run_request(commands[method], request, json_out)

    common = list(inspect.signature(synth).parameters.values())[:-1]  # all but **given
    extra = [_parameter(takers) for takers in options.values()]
    synth.__signature__ = inspect.Signature(common + extra)  # type: ignore[attr-defined]
    app.command("synth")(synth)
