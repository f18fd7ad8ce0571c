"""The package's floors: each module imports only from its own floor or the floors below, and the
packages import each other without a cycle. Read from the source (every import, at module level or
inside a function), so a lazy import up a floor is caught too."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "privlm"
FLOORS = {
    1: {"randomness", "chacha", "atomic", "journal", "errors", "names", "norm_modes", "digest", "progress"},
    2: {"privacy", "resources"},
    3: {"dpsgd", "lm", "runfolder"},
    4: {"training", "evaluation"},
    5: {"synthesis"},
    6: {"experiments", "audit"},
    7: {"cli"},
}
FLOOR = {unit: floor for floor, units in FLOORS.items() for unit in units}


def _unit(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imported_units(path: Path) -> set[str]:
    units = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level == 0
            else []
        )
        for name in names:
            parts = name.split(".")
            if parts[0] == "privlm" and len(parts) > 1:
                units.add(parts[1])
    return units


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.parent == PACKAGE and path.name == "__init__.py":
            continue  # the top-level exports, imported lazily by name
        edges.setdefault(_unit(path), set()).update(_imported_units(path) - {_unit(path)})
    return edges


def test_every_unit_has_a_floor():
    assert set(_edges()) - set(FLOOR) == set()


def test_no_import_runs_up_a_floor():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent == PACKAGE and path.name == "__init__.py":
            continue
        unit = _unit(path)
        upward += [
            f"{path.relative_to(PACKAGE.parent)} imports privlm.{other}"
            for other in _imported_units(path)
            if other in FLOOR and FLOOR[other] > FLOOR[unit]
        ]
    assert upward == []


def test_no_package_level_cycle():
    edges = _edges()
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(unit: str, trail: list[str]) -> None:
        state[unit] = 1
        for other in sorted(edges.get(unit, ())):
            if state.get(other) == 1 and not cycle:
                cycle.extend(trail[trail.index(other) :] + [other])
            elif other not in state:
                visit(other, trail + [other])
        state[unit] = 2

    for unit in sorted(edges):
        if unit not in state:
            visit(unit, [unit])
    assert cycle == []
