"""The project's Python sources as ASTs, for the structural tests (layers, names, imports, prints).

Nothing here imports the project: it reads files only, so the tests stay fast and see every module,
also those that need optional dependencies.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "trainer_template", "evaluators")
_SKIP_DIRS = {"checkpoints", "data", "__pycache__"}


@dataclass(frozen=True)
class Module:
    name: str
    """dotted module name, e.g. ``engine.loop.core`` (a package: ``engine.loop``)"""
    path: Path
    tree: ast.Module

    @property
    def rel(self) -> str:
        return self.path.relative_to(REPO).as_posix()

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


@functools.lru_cache(maxsize=1)
def modules() -> tuple[Module, ...]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            if _SKIP_DIRS & set(path.relative_to(REPO).parts):
                continue
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out.append(
                Module(
                    ".".join(parts), path, ast.parse(path.read_text(encoding="utf-8"), str(path))
                )
            )
    return tuple(out)


@dataclass(frozen=True)
class Import:
    module: Module
    target: str
    """the imported module (``from a.b import c`` gives ``a.b.c`` when that is a module, else ``a.b``)"""
    line: int
    top_level: bool
    """executed when the module is imported (module body, also inside if/try); False: in a function"""
    type_checking: bool = False


def _resolve(mod: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.name.split(".")
    if not mod.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def imports(mod: Module) -> Iterator[Import]:
    """Every import statement of ``mod`` that names a module of the project or beyond."""
    names = {m.name for m in modules()}

    def walk(node: ast.AST, in_function: bool, type_checking: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            func = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            tc = type_checking or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            )
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(mod, alias.name, child.lineno, not func, tc)
            elif isinstance(child, ast.ImportFrom):
                base = _resolve(mod, child)
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    yield Import(mod, full if full in names else base, child.lineno, not func, tc)
            yield from walk(child, func, tc)

    yield from walk(mod.tree, False, False)


def is_under(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def top_level_definitions(mod: Module) -> Iterator[tuple[str, int]]:
    """(name, line) of every function, class and assigned name in the module body."""
    for node in mod.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node.lineno
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    yield t.id, node.lineno
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.target.id, node.lineno
