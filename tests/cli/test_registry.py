"""The command registry: every command is listed by --help; a command imports only its own module."""

from __future__ import annotations

import subprocess
import sys

COMMANDS = ("account", "data", "demo", "eval", "experiment", "models", "synth", "train")


def test_help_lists_every_command(capsys) -> None:
    from privlm.cli import main

    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_account_does_not_import_torch_or_transformers() -> None:
    code = (
        "import sys\n"
        "from privlm.cli import main\n"
        "try:\n"
        "    main(['account', '--noise-multiplier', '1', '--sample-rate', '0.01', '--steps', '10',"
        " '--delta', '1e-5', '--clipping', 'exact', '--json'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, None), exc.code\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_a_command_exit_code_reaches_the_shell(monkeypatch) -> None:
    """``typer.Exit(n)`` inside a command comes back from the app as n (standalone_mode=False): main must
    exit with it (privlm audit exits 1 on a violation)."""
    import typer

    from privlm.cli import app, main

    def fail() -> None:
        raise typer.Exit(3)

    app.command("exit-three-for-test")(fail)
    try:
        main(["exit-three-for-test"])
    except SystemExit as exc:
        assert exc.code == 3
    else:
        raise AssertionError("main returned instead of exiting with the command's code")
    finally:
        app.registered_commands[:] = [c for c in app.registered_commands if c.name != "exit-three-for-test"]
