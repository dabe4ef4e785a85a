"""Hoist function-level imports to the top of their module where that is safe; say why for the rest.

Run from the repository root, then let ruff sort and merge the import blocks::

    python tools/hoist_imports.py            # rewrites engine/, evaluators/, trainer_template/
    ruff check --fix . && ruff format .

An import inside a function moves to the module's top-level import block unless one of these holds
(the reason becomes a ``# lazy: ...`` comment on the import, which ``tests/test_lint.py`` requires):

- it would load a heavy package (HEAVY) that the module does not load already (measured: every
  project module and every imported name is imported in a fresh interpreter, ``sys.modules`` read);
- it cannot be imported here (an optional extra) or sits in a ``try`` that catches ImportError;
- the module is loaded by ``poise-git --help`` and the import would add modules that it does not load;
- it would close an import-time circle (module graph of top-level imports plus the packages each
  import initialises);
- its name is bound otherwise at module level or in the function.

Imports that already carry ``# lazy:`` are left alone, so a second run changes nothing. After
writing, every project module is imported again in a fresh interpreter; a module that imported before
and fails now is reported (exit status 1). Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("engine", "evaluators", "trainer_template")
SKIP_DIRS = {"checkpoints", "data", "__pycache__"}
HEAVY = (
    "verl", "vllm", "ray", "torch", "transformers", "mlflow", "optuna", "sklearn", "scipy",
    "matplotlib", "math_verify", "openai", "libcst", "pandas", "pyarrow", "datasets", "psutil",
    "pytest", "rich", "tensordict", "hydra", "omegaconf", "numpy",
)  # fmt: skip
"""top-level packages a module must not start loading because of a hoist; a reason names the first
one an import would add, in this order (torch before the numpy it loads)"""
EXTRAS = {
    "verl": "verl", "transfer_queue": "verl", "tensordict": "verl", "hydra": "verl",
    "omegaconf": "verl", "ray": "ray", "vllm": "vllm",
}  # fmt: skip
"""packages of an optional extra of pyproject.toml (the extra's name); pandas and pyarrow are in the
verl extra too, but mlflow loads them as well, so they name no extra"""
MAX_COLUMNS = 100
PROBE = (
    "import json, sys\n{stmt}\nprint('\\n' + json.dumps(sorted(sys.modules)))"
)  # fmt: skip
HELP_PROBE = (
    "import atexit, json, runpy, sys\n"
    "atexit.register(lambda: print('\\n' + json.dumps(sorted(sys.modules))))\n"
    "sys.argv = ['poise-git', '--help']\n"
    "runpy.run_module('engine', run_name='__main__')"
)


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    lines: list[str]
    tree: ast.Module
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)


@dataclass
class Site:
    """One import statement inside a function."""

    mod: Module
    node: ast.Import | ast.ImportFrom
    block: list[ast.stmt]
    """the statement list that holds the import"""
    scopes: list[ast.AST]
    """the enclosing functions, innermost last"""
    probes: list[str]
    """import statements whose loaded modules are those of this import (absolute)"""
    targets: list[str]
    """the project modules this import initialises"""
    binds: list[tuple[str, str]]
    """(bound name, what it is bound to)"""


def discover(root: Path) -> dict[str, Module]:
    out: dict[str, Module] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root)
            if SKIP_DIRS & set(rel.parts):
                continue
            parts = list(rel.with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts.pop()
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text, str(path))
            mod = Module(".".join(parts), path, is_pkg, text.splitlines(keepends=True), tree)
            for parent in ast.walk(tree):
                for child in ast.iter_child_nodes(parent):
                    mod.parents[child] = parent
            out[mod.name] = mod
    return out


def resolve_from(mod: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.name.split(".")
    if not mod.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def targets_of(mod: Module, node: ast.Import | ast.ImportFrom, names: set[str]) -> list[str]:
    """The imported modules: ``from a.b import c`` gives ``a.b.c`` when that is a module, else ``a.b``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = resolve_from(mod, node)
    return sorted({f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names})


def binds_of(mod: Module, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str]]:
    if isinstance(node, ast.Import):
        return [
            (a.asname, a.name) if a.asname else (a.name.split(".")[0], a.name.split(".")[0])
            for a in node.names
        ]
    base = resolve_from(mod, node)
    return [(a.asname or a.name, f"{base}:{a.name}") for a in node.names]


def is_lazy_commented(mod: Module, node: ast.stmt) -> bool:
    here = mod.lines[node.lineno - 1]
    above = mod.lines[node.lineno - 2].strip() if node.lineno > 1 else ""
    return "# lazy:" in here or above.startswith("# lazy:")


def function_sites(mod: Module, names: set[str]) -> list[Site]:
    sites: list[Site] = []

    def walk(node: ast.AST, scopes: list[ast.AST]) -> None:
        for fld in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, fld, None) or []:
                if isinstance(child, ast.ExceptHandler | ast.match_case):
                    walk(child, scopes)
                    continue
                if scopes and isinstance(child, ast.Import | ast.ImportFrom):
                    block = getattr(node, fld)
                    sites.append(site_of(mod, child, block, list(scopes), names))
                inner = (
                    scopes + [child]
                    if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                    else scopes
                )
                walk(child, inner)

    walk(mod.tree, [])
    return sites


def site_of(mod: Module, node, block, scopes, names: set[str]) -> Site:
    if isinstance(node, ast.Import):
        probes = [f"import {a.name}" for a in node.names]
    else:
        base = resolve_from(mod, node)
        if base.split(".")[0] in PACKAGES:
            probes = [f"import {t}" for t in targets_of(mod, node, names)]
        else:
            probes = [f"from {base} import {', '.join(a.name for a in node.names)}"]
    return Site(mod, node, block, scopes, probes, targets_of(mod, node, names), binds_of(mod, node))


def run_probe(code: str, root: Path) -> tuple[set[str] | None, str]:
    env = dict(os.environ, PYTHONPATH=str(root))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
            timeout=300, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, "timed out"
    last = proc.stdout.rstrip().rsplit("\n", 1)[-1] if proc.stdout.strip() else ""
    if last.startswith("["):
        return set(json.loads(last)), ""
    err = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return None, err


CACHE: dict[str, list] = {}
"""probe results read from --cache (development only: valid while the tree does not change)"""


def probe_all(
    stmts: list[str], root: Path, jobs: int, label: str, cache: bool = True
) -> dict[str, tuple]:
    todo = [s for s in stmts if not cache or s not in CACHE]
    print(f"probing {len(todo)} {label} in fresh interpreters ({jobs} at a time)...", flush=True)
    with ThreadPoolExecutor(jobs) as pool:
        results = dict(zip(todo, pool.map(lambda s: run_probe(PROBE.format(stmt=s), root), todo)))
    for s in stmts:
        if s not in results:
            got, err = CACHE[s]
            results[s] = (set(got) if got is not None else None, err)
    return results


def heavy(mods: set[str]) -> set[str]:
    tops = {m.split(".")[0] for m in mods}
    return {h for h in HEAVY if h in tops}


def by_priority(pkgs: set[str]) -> list[str]:
    return [h for h in HEAVY if h in pkgs] + sorted(p for p in pkgs if p not in HEAVY)


def missing_module(err: str) -> str | None:
    marker = "No module named '"
    if marker in err:
        return err.split(marker, 1)[1].split("'", 1)[0].split(".")[0]
    return None


def catches_import_error(site: Site) -> bool:
    node: ast.AST = site.node
    parents = site.mod.parents
    while node in parents and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        parent = parents[node]
        if isinstance(parent, ast.Try) and node in parent.body:
            for h in parent.handlers:
                caught = ast.unparse(h.type) if h.type else "BaseException"
                if "ImportError" in caught or "ModuleNotFoundError" in caught:
                    return True
        node = parent
    return False


def local_bindings(func: ast.AST, skip: ast.AST) -> dict[str, set[str]]:
    """Names bound in ``func``'s own scope (not nested ones), with what they are bound to."""
    out: dict[str, set[str]] = {}

    def add(name: str, what: str) -> None:
        out.setdefault(name, set()).add(what)

    args = func.args
    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if a is not None:
            add(a.arg, "<argument>")

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if child is skip:
                continue
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                add(child.name, "<definition>")
                continue  # a nested scope
            if isinstance(child, NESTED_SCOPES):
                continue
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store | ast.Del):
                add(child.id, "<assignment>")
            elif isinstance(child, ast.Global | ast.Nonlocal):
                for n in child.names:
                    add(n, "<global>")
            elif isinstance(child, ast.ExceptHandler) and child.name:
                add(child.name, "<assignment>")
            elif isinstance(child, ast.Import | ast.ImportFrom):
                for name, what in binds_of(MODULE_OF[id(func)], child):
                    add(name, what)
            walk(child)

    walk(func)
    return out


MODULE_BINDINGS: dict[str, set[str]] = {}
"""module -> the names it binds at module level (before any hoist)"""
MODULE_OF: dict[int, Module] = {}
"""function node id -> its module"""
NESTED_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def module_bindings(mod: Module) -> dict[str, set[str]]:
    """Names bound at module level (not inside functions or classes), with what they are bound to."""
    out: dict[str, set[str]] = {}

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                out.setdefault(child.name, set()).add("<definition>")
                continue
            if isinstance(child, NESTED_SCOPES):
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                for name, what in binds_of(mod, child):
                    out.setdefault(name, set()).add(what)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store | ast.Del):
                out.setdefault(child.id, set()).add("<assignment>")
            walk(child)

    walk(mod.tree)
    return out


def _only_blocks_between(mod: Module, node: ast.AST) -> bool:
    parent = mod.parents.get(node)
    while parent is not None and parent is not mod.tree:
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return False
        parent = mod.parents.get(parent)
    return True


def import_time_graph(mods: dict[str, Module]) -> dict[str, set[str]]:
    """Module -> the project modules its import runs (top-level imports and their packages)."""
    names = set(mods)
    graph: dict[str, set[str]] = {n: set() for n in names}
    for mod in mods.values():
        for node in ast.walk(mod.tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or not _only_blocks_between(
                mod, node
            ):
                continue
            for t in targets_of(mod, node, names):
                graph[mod.name] |= edges_for(mod.name, t, names) - {mod.name}
    return graph


def edges_for(src: str, target: str, names: set[str]) -> set[str]:
    """The project modules that ``import target`` runs, seen from ``src``: the target itself and the
    packages above it, except ``src``'s own packages unless named (those are initialised first)."""
    own = {".".join(src.split(".")[:i]) for i in range(1, src.count(".") + 1)}
    parts = target.split(".")
    chain = {".".join(parts[:i]) for i in range(1, len(parts))}
    return {m for m in chain if m in names and m not in own and m != src} | ({target} & names)


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, stack = set(), [start]
    while stack:
        n = stack.pop()
        if n == goal:
            return True
        if n not in seen:
            seen.add(n)
            stack.extend(graph.get(n, ()))
    return False


def decide(site, probes, module_probe, help_mods, graph, modbinds, names) -> tuple[str, str]:
    """("hoist", "") or ("keep", reason); the reason's first words are its category."""
    mod = site.mod
    top = site.probes[0].split()[1].split(".")[0]
    if catches_import_error(site):
        extra = EXTRAS.get(top)
        if extra:
            return "keep", f"optional dependency ({extra} extra)"
        return "keep", "optional dependency (its ImportError is handled here)"
    if isinstance(site.node, ast.ImportFrom):
        base = resolve_from(mod, site.node)
        if base in names:
            have = MODULE_BINDINGS[base]
            for a in site.node.names:
                if a.name not in have and f"{base}.{a.name}" not in names:
                    return "broken", f"{base} has no `{a.name}`"
    loaded: set[str] = set()
    for stmt in site.probes:
        got, err = probes[stmt]
        if got is None:
            missing = missing_module(err)
            if missing in EXTRAS:
                return "keep", f"optional dependency ({EXTRAS[missing]} extra)"
            if missing:
                return "keep", f"optional dependency ({missing} is not installed here)"
            return "keep", "fails to import at module load (checked)"
        loaded |= got
    mine, _ = module_probe.get(mod.name, (None, ""))
    new = heavy(loaded) - heavy(mine or set())
    if new:
        first = top if top in new or top in EXTRAS else by_priority(new)[0]
        if first in EXTRAS:
            return "keep", f"optional dependency ({EXTRAS[first]} extra)"
        return "keep", f"{first} is heavy (only this path needs it)"
    if help_mods is not None and mod.name in help_mods and loaded - help_mods:
        return "keep", "keeps `poise-git --help` fast"
    scope_binds = local_bindings(site.scopes[-1], site.node)
    outer = [local_bindings(s, site.node) for s in site.scopes[:-1]]
    for name, what in site.binds:
        if scope_binds.get(name, {what}) - {what}:
            return "keep", f"`{name}` is also a local name of this function"
        if any(name in o for o in outer):
            return "keep", f"`{name}` is also a local name of an enclosing function"
        if modbinds.get(name, {what}) - {what}:
            return "keep", f"`{name}` is bound otherwise at module level"
    for t in site.targets:
        for dst in edges_for(mod.name, t, names):
            if dst == mod.name:
                return "keep", f"imports {dst} itself, still loading at module level"
            if reaches(graph, dst, mod.name):
                return "keep", f"breaks the import cycle {mod.name} <-> {dst}"
    return "hoist", ""


def category(reason: str) -> str:
    if reason.startswith("breaks the import cycle"):
        return "import cycle"
    if reason.startswith("optional dependency"):
        return "optional dependency"
    if reason.endswith("heavy (only this path needs it)"):
        return "heavy dependency"
    if reason.startswith("`"):
        return "name clash"
    if reason.startswith("imports "):
        return "self-import"
    return reason


def insertion_line(mod: Module) -> int:
    """0-based index of the line after which hoisted imports go (-1: at the very top)."""
    last = None
    for node in mod.tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            last = node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            break
    if last is not None:
        return last.end_lineno - 1
    body = mod.tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return body[0].end_lineno - 1
    return -1


def one_alias(node: ast.Import | ast.ImportFrom, alias: ast.alias) -> str:
    if isinstance(node, ast.Import):
        return ast.unparse(ast.Import([alias]))
    return ast.unparse(ast.ImportFrom(node.module, [alias], node.level))


def existing_top_imports(mod: Module) -> set[str]:
    return {
        one_alias(node, a)
        for node in mod.tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for a in node.names
    }


def trailing_comment(line: str, node: ast.stmt) -> str:
    rest = line[node.end_col_offset :].strip() if node.end_lineno == node.lineno else ""
    return rest if rest.startswith("#") else ""


def tidy_blank_lines(lines: list[str], remove: set[int], hoisted: list[Site]) -> None:
    """Drop the blank lines a removed import leaves at the start or the end of its block."""
    for site in hoisted:
        first, last = site.node.lineno - 1, site.node.end_lineno - 1
        prev = first - 1
        while prev in remove:
            prev -= 1
        code = lines[prev].split("#", 1)[0].rstrip() if prev >= 0 else ""
        if code.endswith((":", '"""', "'''")) and prev not in remove:
            nxt = last + 1
            while nxt < len(lines) and (nxt in remove or not lines[nxt].strip()):
                if not lines[nxt].strip():
                    remove.add(nxt)
                nxt += 1
        if site.node is site.block[-1] or all(
            id(s) in REMOVED for s in site.block[site.block.index(site.node) :]
        ):
            while prev >= 0 and (prev in remove or not lines[prev].strip()):
                if not lines[prev].strip():
                    remove.add(prev)
                prev -= 1


REMOVED: set[int] = set()
"""ids of the import nodes being hoisted"""


def rewrite(mod: Module, hoisted: list[Site], kept: list[tuple[Site, str]]) -> str:
    lines = list(mod.lines)
    remove: set[int] = set()
    replace: dict[int, str] = {}
    before: dict[int, list[str]] = {}
    new_imports: list[str] = []
    have = existing_top_imports(mod)
    for site in hoisted:
        node = site.node
        first = lines[node.lineno - 1]
        comment = trailing_comment(first, node) if node.lineno == node.end_lineno else ""
        aliases = [a for a in node.names if one_alias(node, a) not in have]
        if aliases:
            stmt = (
                ast.Import(aliases)
                if isinstance(node, ast.Import)
                else ast.ImportFrom(node.module, aliases, node.level)
            )
            new_imports.append(ast.unparse(stmt) + (f"  {comment}" if comment else "") + "\n")
            have |= {one_alias(node, a) for a in aliases}
        remove.update(range(node.lineno - 1, node.end_lineno))
    gone = {id(s.node) for s in hoisted}
    REMOVED.update(gone)
    for site in hoisted:
        if all(id(s) in gone for s in site.block):
            head = site.block[0]
            indent = lines[head.lineno - 1][: head.col_offset]
            replace.setdefault(head.lineno - 1, f"{indent}pass\n")
    for site, reason in kept:
        node = site.node
        idx = node.lineno - 1
        line = lines[idx].rstrip("\n")
        text = f"# lazy: {reason}"
        single = node.lineno == node.end_lineno and not trailing_comment(line, node)
        if single and len(line) + 2 + len(text) <= MAX_COLUMNS:
            lines[idx] = f"{line}  {text}\n"
        else:
            before.setdefault(idx, []).append(f"{line[: node.col_offset]}{text}\n")
    tidy_blank_lines(lines, remove, hoisted)
    at = insertion_line(mod)
    body = mod.tree.body
    if at >= 0 and not isinstance(body[0], ast.Import | ast.ImportFrom):
        if at == body[0].end_lineno - 1:  # after the docstring: keep a blank line between
            new_imports = ["\n", *new_imports]
    out: list[str] = []
    if at == -1 and new_imports:
        out += new_imports + ["\n"]
    for i, line in enumerate(lines):
        out += before.get(i, [])
        if i in replace:
            out.append(replace[i])
        elif i not in remove:
            out.append(line)
        if i == at:
            out += new_imports
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path.cwd())
    ap.add_argument("--jobs", type=int, default=2, help="probes run at once (default 2)")
    ap.add_argument("--dry-run", action="store_true", help="report only; write nothing")
    ap.add_argument("--no-verify", action="store_true", help="skip the import check after writing")
    ap.add_argument(
        "--verify-only", action="store_true", help="only import every module in a fresh interpreter"
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="list every decision")
    ap.add_argument(
        "--cache", type=Path, help="reuse/save the probes (development; same tree only)"
    )
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if args.cache and args.cache.exists():
        CACHE.update(json.loads(args.cache.read_text()))
    mods = discover(root)
    names = set(mods)
    for mod in mods.values():
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                MODULE_OF[id(node)] = mod
    sites = [s for m in mods.values() for s in function_sites(m, names)]
    todo = [s for s in sites if not is_lazy_commented(s.mod, s.node)]
    annotated = len(sites) - len(todo)
    if args.verify_only:
        probes = probe_all(
            [f"import {n}" for n in sorted(names)], root, args.jobs, "modules", False
        )
        failed = [f"{stmt}: {err}" for stmt, (got, err) in probes.items() if got is None]
        print(f"{len(probes) - len(failed)} of {len(probes)} modules import in a fresh interpreter")
        print("".join(f"  {f}\n" for f in failed), end="")
        return 0
    if not todo:
        print(f"hoisted 0, kept 0 (all {annotated} function-level imports already say why)")
        return 0

    module_probe = probe_all([f"import {n}" for n in sorted(names)], root, args.jobs, "modules")
    module_probe = {stmt.split(" ", 1)[1]: r for stmt, r in module_probe.items()}
    stmts = sorted({p for s in todo for p in s.probes} - {f"import {n}" for n in names})
    probes = probe_all(stmts, root, args.jobs, "imports")
    probes.update({f"import {n}": r for n, r in module_probe.items()})
    if args.cache:
        saved = {k: [sorted(v[0]) if v[0] is not None else None, v[1]] for k, v in probes.items()}
        args.cache.write_text(json.dumps(saved))
    help_mods, err = run_probe(HELP_PROBE, root)
    if help_mods is None:
        print(f"warning: `python -m engine --help` failed ({err}); not guarding its start-up")

    graph = import_time_graph(mods)
    hoisted: dict[str, list[Site]] = {}
    kept: dict[str, list[tuple[Site, str]]] = {}
    broken: list[str] = []
    modbinds = {n: module_bindings(m) for n, m in mods.items()}
    MODULE_BINDINGS.update({n: set(b) for n, b in modbinds.items()})
    for site in sorted(todo, key=lambda s: (s.mod.name, s.node.lineno)):
        verdict, reason = decide(
            site, probes, module_probe, help_mods, graph, modbinds[site.mod.name], names
        )
        where = f"{site.mod.path.relative_to(root)}:{site.node.lineno}"
        if verdict == "hoist":
            hoisted.setdefault(site.mod.name, []).append(site)
            for t in site.targets:
                graph[site.mod.name] |= edges_for(site.mod.name, t, names)
            for name, what in site.binds:
                modbinds[site.mod.name].setdefault(name, set()).add(what)
        elif verdict == "broken":
            broken.append(f"{where}: {reason}")
        else:
            kept.setdefault(site.mod.name, []).append((site, reason))
        if args.verbose:
            print(f"{where}: {verdict} {reason}".rstrip())

    changed = []
    for name in sorted(set(hoisted) | set(kept)):
        mod = mods[name]
        text = rewrite(mod, hoisted.get(name, []), kept.get(name, []))
        ast.parse(text, str(mod.path))  # never write a file that does not parse
        if not args.dry_run:
            mod.path.write_text(text, encoding="utf-8")
        changed.append(name)

    n_kept = Counter(category(r) for v in kept.values() for _, r in v)
    n_hoisted = sum(len(v) for v in hoisted.values())
    verb = "would hoist" if args.dry_run else "hoisted"
    print(f"{verb} {n_hoisted}, kept {sum(n_kept.values())} ({len(changed)} files)")
    for cat, n in n_kept.most_common():
        print(f"  kept {n:4d}  {cat}")
    if annotated:
        print(f"  ({annotated} function-level imports already carried a `# lazy:` reason)")
    if broken:
        print(
            f"{len(broken)} imports name something their module lacks (left as they are; fix them "
            "and run again):\n  " + "\n  ".join(broken)
        )
    if args.dry_run or args.no_verify:
        return 1 if broken else 0
    after = probe_all(
        [f"import {n}" for n in sorted(names)], root, args.jobs, "modules again", cache=False
    )
    broken = [
        f"{stmt}: {err}"
        for stmt, (got, err) in after.items()
        if got is None and module_probe[stmt.split(" ", 1)[1]][0] is not None
    ]
    if broken:
        print("modules that imported before and fail now:\n  " + "\n  ".join(broken))
        return 1
    print("every module that imported before still imports in a fresh interpreter")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
