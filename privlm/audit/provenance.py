"""What determines an audit cell, hashed: the cache key that keeps a stale cell from being reused.

A cached cell may stand in for a fresh run only if nothing it depends on has changed: the cell (mechanism,
mode, ε), δ, the seed, the :class:`~privlm.audit.scale.Scale` fields its mechanism reads, the versions
of the numerical libraries it runs on, and **the source code it runs**: the mechanism's entry module and,
transitively, every module of the same top-level package (privlm, or a plug-in's own) that it imports —
at module level or inside a function — together with the modules that compute the bound. Imports are
read from the source with :mod:`ast`, not from ``sys.modules``, so the key does not depend on what the
process happened to import before. A changed line anywhere in that closure gives another key: the cell
is run again (:func:`privlm.audit.runner.run_grid`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
from collections.abc import Iterable
from pathlib import Path

from privlm.digest import digest

LIBRARIES = ("torch", "numpy", "scipy", "transformers", "peft", "dp-accounting", "scikit-learn")
BOUND_MODULES = ("privlm.audit.bound",)


def _origin(name: str) -> Path | None:
    """The source file of module ``name`` (a package's ``__init__.py``); None if it is not a source module."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _imports(name: str, path: Path) -> set[str]:
    """Absolute names of every module that ``name``'s source imports, anywhere in the file."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")
                base = parts[: len(parts) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # a submodule, if it is one
    return found


def module_closure(root: str) -> tuple[str, ...]:
    """``root`` and every module of privlm or of ``root``'s own top-level package that it imports,
    transitively (sorted), with the parent packages each one's import runs (their ``__init__``). Read
    afresh on every call: a file edited since the last call is followed as it is now."""
    packages = {"privlm", root.split(".")[0]}
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _origin(name)
        if path is None:
            continue
        seen.add(name)
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        todo.extend(m for m in _imports(name, path) | set(parents) if m.split(".")[0] in packages)
    return tuple(sorted(seen))


def source_digest(modules: Iterable[str]) -> str:
    """SHA-256 (16 hex digits) of the named modules' source files, by name."""
    h = hashlib.sha256()
    for name in sorted(set(modules)):
        path = _origin(name)
        h.update(name.encode() + b"\0" + (path.read_bytes() if path else b"") + b"\0")
    return h.hexdigest()[:16]


def library_versions() -> dict[str, str]:
    """Installed versions of :data:`LIBRARIES` (absent ones as ``"absent"``)."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def code_digest(entry_module: str) -> str:
    """The digest of the code a cell of the mechanism in ``entry_module`` runs (module docstring)."""
    modules = set(module_closure(entry_module))
    for name in BOUND_MODULES:
        modules.update(module_closure(name))
    return source_digest(modules)


def cell_key(cell: dict, scale: dict, delta: float, seed: int, entry_module: str) -> str:
    """The cache key of one cell: everything that determines it (module docstring)."""
    return digest(
        {
            "cell": cell,
            "scale": scale,
            "delta": delta,
            "seed": seed,
            "code": code_digest(entry_module),
            "libraries": library_versions(),
        }
    )
