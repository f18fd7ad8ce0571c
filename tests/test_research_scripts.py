"""The studies' scripts still point at what exists: a folder or module renamed in the library or in
``research/`` must not leave a driver or report script that fails only when someone reruns it.

Static checks, no script is run: every ``privlm`` name a research script imports exists, every sibling study
folder it names (``HERE.parent / "name"``) exists, and every file a driver sources exists.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

RESEARCH = Path(__file__).resolve().parent.parent / "research"
SCRIPTS = sorted(RESEARCH.rglob("*.py"))
DRIVERS = sorted(RESEARCH.rglob("*.sh"))


def _privlm_imports(tree: ast.AST) -> list[tuple[str, str | None]]:
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "privlm":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "privlm"]
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(RESEARCH)))
def test_a_research_script_imports_names_that_exist(script: Path) -> None:
    for module, name in _privlm_imports(ast.parse(script.read_text())):
        imported = importlib.import_module(module)
        assert name is None or hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), (
            f"{script.name}: {module}.{name} does not exist"
        )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(RESEARCH)))
def test_a_research_script_names_study_folders_that_exist(script: Path) -> None:
    for name in re.findall(r'HERE\.parent / "([^"]+)"', script.read_text()):
        assert (script.parent.parent / name).is_dir(), f"{script.name}: research/{name} does not exist"


@pytest.mark.parametrize("driver", DRIVERS, ids=lambda p: str(p.relative_to(RESEARCH)))
def test_a_driver_sources_files_that_exist(driver: Path) -> None:
    for sourced in re.findall(r'source "\$\(dirname "\$0"\)/([^"]+)"', driver.read_text()):
        assert (driver.parent / sourced).is_file(), f"{driver.name}: {sourced} does not exist"
    for toml in re.findall(r"^TOML=(\S+)", driver.read_text(), flags=re.M):
        assert (RESEARCH.parent / toml).is_file(), f"{driver.name}: {toml} does not exist"
