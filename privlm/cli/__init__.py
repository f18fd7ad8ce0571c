"""The ``privlm`` command line.

Each command lives in its own module in this package, named after the command, and exposes
``register(app)``; modules are discovered here so that adding a command never edits a shared list, and
only the invoked command's module is imported. Every command turns
:class:`privlm.errors.UserError` into a one-line message on stderr and exit code 2.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

from privlm.errors import UserError

app = typer.Typer(
    name="privlm",
    help="Differentially private fine-tuning (DP-SGD-RC) and private synthetic text (GRADMM).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Differentially private fine-tuning (DP-SGD-RC) and private synthetic text (GRADMM)."""


_registered: set[str] = set()
_invocation: list[str] = []


def invocation() -> str:
    """The command line :func:`main` is running (``privlm`` and its arguments, shell-quoted), for the records
    a command writes (e.g. a synthetic set's data card); empty outside :func:`main`."""
    import shlex

    return shlex.join(_invocation)


def _register_commands(argv: list[str]) -> None:
    """Register the command named by ``argv`` only (each module is named after its command), or all of
    them for ``--help`` and unknown names: a command never pays for the others' imports (torch,
    transformers, dp-accounting)."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    for name in [first] if first in names else names:
        if name not in _registered:
            importlib.import_module(f"{__name__}.{name}").register(app)
            _registered.add(name)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``privlm`` script: bad input exits with code 2 and one line, no traceback."""
    argv = sys.argv[1:] if argv is None else argv
    _invocation[:] = ["privlm", *argv]
    try:
        _register_commands(argv)
        code = app(args=argv, standalone_mode=False)  # a command's ``typer.Exit(n)`` comes back as n here
    except UserError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
    except typer.Exit as err:
        sys.exit(err.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except Exception as err:  # click usage errors carry their own exit code (2)
        import click
        from typer._click.exceptions import ClickException as TyperClickException

        if isinstance(err, (click.ClickException, TyperClickException)):
            err.show()
            sys.exit(err.exit_code)
        raise
    if isinstance(code, int) and not isinstance(code, bool) and code != 0:
        sys.exit(code)
