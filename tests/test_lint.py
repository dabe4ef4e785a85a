"""The project's own style gate: `ruff check` and `ruff format --check` (settings in pyproject.toml),
and the rule that an import inside a function says why it is not at the top (`# lazy: reason`)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.is_file():
        return [str(exe)]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.skip("ruff is not installed (it comes with the dev extra)")


@pytest.mark.parametrize("args", [["check", "--no-cache"], ["format", "--check", "--no-cache"]])
def test_ruff(args):
    proc = subprocess.run([*_ruff(), *args, "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


LAZY_PACKAGES = ("engine", "evaluators", "trainer_template")
"""where an import inside a function must say why it is there (tools/hoist_imports.py)"""


def unexplained_lazy_imports(source: str) -> list[int]:
    """Lines of imports inside functions with no ``# lazy: <reason>`` comment on the line or above."""
    lines = source.splitlines()
    out = []

    def reason(line: str) -> str:
        return line.split("# lazy:", 1)[1].strip() if "# lazy:" in line else ""

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                above = lines[child.lineno - 2].strip() if child.lineno > 1 else ""
                here = reason(lines[child.lineno - 1])
                if not here and not (above.startswith("# lazy:") and reason(above)):
                    out.append(child.lineno)
            walk(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    walk(ast.parse(source), False)
    return out


def test_the_lazy_import_check_reads_comments():
    source = (
        "import os\n"
        "def f():\n"
        "    import json  # lazy: torch is heavy (only this path needs it)\n"
        "    # lazy: optional dependency (verl extra)\n"
        "    from a import (\n"
        "        b,\n"
        "    )\n"
        "    import sys\n"
        "    class C:\n"
        "        def g(self):\n"
        "            import re  # lazy:\n"
        "            import re  # because\n"
    )
    assert unexplained_lazy_imports(source) == [8, 11, 12]


def test_function_level_imports_say_why():
    """Imports sit at the top of a module; one inside a function carries ``# lazy: reason`` (an
    optional or heavy dependency, `poise-git --help` start-up, an import circle).
    ``python tools/hoist_imports.py`` hoists the rest and writes the reasons."""
    found = []
    for pkg in LAZY_PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if {"checkpoints", "data"} & set(path.relative_to(ROOT).parts):
                continue
            lines = unexplained_lazy_imports(path.read_text(encoding="utf-8"))
            found += [f"{path.relative_to(ROOT)}:{n}" for n in lines]
    assert not found, (
        f"{len(found)} imports inside functions without a `# lazy: reason` comment (hoist them with "
        "`python tools/hoist_imports.py`, or say why they stay):\n" + "\n".join(found)
    )
