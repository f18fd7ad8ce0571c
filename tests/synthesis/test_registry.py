"""The one method registry: every method registers itself, cheaply, and the README's table is the registry's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from privlm.errors import UserError
from privlm.synthesis.registry import get_method, load_methods, methods_table, synth_methods

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_method_is_registered_and_synth_reads_the_registry() -> None:
    names = set(load_methods())
    assert {"gradmm", "pe", "dp-finetune-gen", "zero-shot", "few-shot", "random", "herding", "k-center", "full-pool"} <= names
    assert synth_methods() == {"gradmm": "gradmm", "pe": "pe", "dp-finetune": "dp-finetune-gen"}
    assert get_method("pe@fast") is get_method("pe") and get_method("pe").takes_epsilon
    with pytest.raises(UserError, match="unknown method 'magic'"):
        get_method("magic")


def test_the_readme_table_is_the_registrys() -> None:
    assert methods_table() in README.read_text()


def test_loading_the_registry_imports_no_torch() -> None:
    code = ("import sys\nfrom privlm.synthesis.registry import load_methods\nload_methods()\n"
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "[]"
