"""The structure the project promises (docs/architecture.md), checked on the source:

- layers point one way: engine -> trainer_template -> evaluators; never back up;
- no import circle between the project's modules, nor at import time through the packages'
  ``__init__`` modules;
- the library never prints or draws: output goes through callbacks or ``logging``; only the CLI
  (engine/cli) renders, and only process entry points write to stdout/stderr.
"""

from __future__ import annotations

import ast

from project_ast import Module, imports, is_under, modules

# A process entry point: a module a process runs (``python -m MODULE``) whose stdout/stderr is its
# protocol with the parent. Only these (and any ``if __name__ == "__main__":`` block) may print.
ENTRY_POINTS = {
    "trainer_template/proxy/worker.py": "the proxy's seed worker: the warm start's path on stdout, "
    "its build log and a candidate's traceback on stderr",
    "engine/loop/executor.py": "the loop's evaluation worker: one result line on stdout",
    "engine/operators/verify_child.py": "verification's and fingerprinting's children: frames on "
    "the channel the engine owns (recordings, verdicts, fingerprints)",
    "engine/sandbox/launch.py": "the first code of every sandboxed child: limits, then the target",
    "engine/sandbox/exec_source.py": "raw code behind the boundary (its self-check, the corpus)",
}
RENDERERS = ("rich", "tqdm", "typer", "click")
"""drawing and CLI libraries: the CLI package alone imports them"""


def _layer(name: str) -> str:
    return name.split(".", 1)[0]


def test_layers_point_one_way():
    """engine may import trainer_template and evaluators; trainer_template may import evaluators;
    nothing imports upward (function-level imports included)."""
    allowed = {
        "engine": {"engine", "trainer_template", "evaluators"},
        "trainer_template": {"trainer_template", "evaluators"},
        "evaluators": {"evaluators"},
    }
    up = [
        f"{imp.module.rel}:{imp.line} imports {imp.target}"
        for m in modules()
        for imp in imports(m)
        if _layer(imp.target) in allowed and _layer(imp.target) not in allowed[_layer(m.name)]
    ]
    assert not up, "imports against the layers:\n" + "\n".join(up)


def _graph(top_level_only: bool) -> dict[str, set[str]]:
    names = {m.name for m in modules()}
    graph: dict[str, set[str]] = {n: set() for n in names}
    for m in modules():
        for imp in imports(m):
            if imp.type_checking or (top_level_only and not imp.top_level):
                continue
            if imp.target in names and imp.target != m.name:
                graph[m.name].add(imp.target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_circles_finds_a_loop_and_nothing_else():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(g) == [["a", "b", "c"]]


def test_no_import_circles():
    """No module reaches itself through imports, counting those inside functions too: a circle
    hidden in a function is still two modules that cannot be understood apart."""
    found = circles(_graph(top_level_only=False))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def _import_time_graph() -> dict[str, set[str]]:
    """Module -> the project modules importing it runs: its top-level imports and the packages
    above each (its own packages only when named: Python initialises those before the module)."""
    names = {m.name for m in modules()}
    graph: dict[str, set[str]] = {n: set() for n in names}
    for m in modules():
        own = {".".join(m.name.split(".")[:i]) for i in range(1, m.name.count(".") + 1)}
        for imp in imports(m):
            if not imp.top_level or imp.type_checking:
                continue
            parts = imp.target.split(".")
            above = {".".join(parts[:i]) for i in range(1, len(parts))} - own
            graph[m.name] |= ({imp.target} | above) & names - {m.name}
    return graph


def test_no_import_circles_at_import_time():
    """Importing any module never comes back to a module still initialising, counting the package
    ``__init__`` each import runs (tools/hoist_imports.py refuses a hoist that would)."""
    found = circles(_import_time_graph())
    assert not found, "import-time circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def _main_block_lines(mod: Module) -> set[int]:
    lines: set[int] = set()
    for node in mod.tree.body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def _writes(mod: Module) -> list[int]:
    """Lines that print or write to sys.stdout / sys.stderr."""
    out = []
    for node in ast.walk(mod.tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "print":
            out.append(node.lineno)
        elif isinstance(f, ast.Attribute) and f.attr in ("write", "print_exc", "print_exception"):
            text = ast.unparse(f.value)
            if text in ("sys.stdout", "sys.stderr", "traceback") or f.attr != "write":
                out.append(node.lineno)
    return out


def test_the_library_never_prints():
    """Outside engine/cli, output goes through callbacks or logging; entry points are the exception,
    each documented in ENTRY_POINTS with the protocol it speaks."""
    found = []
    for m in modules():
        if is_under(m.name, "engine.cli") or m.rel in ENTRY_POINTS:
            continue
        main = _main_block_lines(m)
        found += [f"{m.rel}:{line}" for line in _writes(m) if line not in main]
    assert not found, (
        "library code writes to stdout/stderr (use logging or a callback; a process entry point goes "
        "into ENTRY_POINTS with the protocol it speaks):\n" + "\n".join(found)
    )


def test_entry_points_are_entry_points():
    """Every listed entry point still exists and runs as a process (it has a __main__ block)."""
    by_rel = {m.rel: m for m in modules()}
    for rel in ENTRY_POINTS:
        assert rel in by_rel, f"{rel} is listed as an entry point but does not exist"
        assert _main_block_lines(by_rel[rel]), f"{rel} has no `if __name__ == '__main__':` block"


def test_only_the_cli_draws():
    found = [
        f"{imp.module.rel}:{imp.line} imports {imp.target}"
        for m in modules()
        if not is_under(m.name, "engine.cli")
        for imp in imports(m)
        if imp.target.split(".")[0] in RENDERERS
    ]
    assert not found, "rendering libraries outside engine/cli:\n" + "\n".join(found)


def test_the_import_time_graph_sees_packages():
    """The graph is not vacuous: an import runs its target and the packages above it, and a
    module's own package counts when it is named."""
    g = _import_time_graph()
    assert {"engine.archive.gitio", "engine.archive"} <= g["engine.cli"]
    assert "engine.cli" in g["engine.cli.run_cmds"]  # from engine.cli import ArchiveOpt, console
    assert not g["engine.cli.logs"] & {"engine", "engine.cli"}  # imports only logging and rich
