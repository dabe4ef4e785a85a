"""Imports sit at the top of a module. One inside a function is kept only for an optional or heavy
dependency (the CLI must start fast, an extra may be missing) and says so: either its package is in
LAZY below (one reason per dependency) or the import line carries a one-line ``# lazy: why`` comment.

``python tests/test_imports.py`` prints the function-level imports that do not qualify, by file.
"""

from __future__ import annotations

import sys
from collections import Counter

import pytest
from project_ast import imports, modules

LAZY = {
    "torch": "2 s to import; the archive, selection and the CLI never need it",
    "mlflow": "2-3 s to import; only evaluation, reflection and the UI log to it",
    "transformers": "the CPU generation backend only; seconds to import",
    "vllm": "the [vllm] extra, GPU machines only",
    "verl": "the [verl] extra",
    "ray": "the [ray] extra",
    "hydra": "comes with the [verl] extra",
    "omegaconf": "comes with the [verl] extra",
    "transfer_queue": "comes with the [verl] extra",
    "pandas": "comes with the [verl] extra (parquet data)",
    "pyarrow": "comes with the [verl] extra (parquet data)",
    "optuna": "1 s to import; the offline proposer only",
    "sklearn": "1 s to import; the GP of the selection only",
    "scipy": "pulled in with scikit-learn",
    "matplotlib": "1 s to import; the report's figures only",
    "math_verify": "imports sympy (seconds); grading only",
    "openai": "0.5 s to import; the LLM client and the openai generator only",
}


def offenders() -> list[tuple[str, int, str]]:
    """(file, line, imported module) of every function-level import statement without a reason."""
    out: dict[tuple[str, int], str] = {}
    for m in modules():
        lines = m.path.read_text(encoding="utf-8").splitlines()
        for imp in imports(m):
            if imp.top_level or imp.type_checking:
                continue
            if imp.target.split(".")[0] in LAZY:
                continue
            line = lines[imp.line - 1]
            if "# lazy:" in line or lines[imp.line - 2].strip().startswith("# lazy:"):
                continue
            out.setdefault((m.rel, imp.line), imp.target)
    return [(rel, line, target) for (rel, line), target in out.items()]


@pytest.mark.xfail(
    reason="function-level imports are swept once the parallel branches have landed; until then "
    "this lists them (python tests/test_imports.py)",
    strict=False,
)
def test_function_level_imports_have_a_reason():
    found = offenders()
    assert not found, f"{len(found)} function-level imports without a reason:\n" + "\n".join(
        f"{f}:{line} {target}" for f, line, target in found
    )


def test_the_checker_sees_function_level_imports():
    """The inventory is not vacuous: it reads imports inside functions and honours the reasons."""
    seen = [
        (imp.module.rel, imp.target)
        for m in modules()
        for imp in imports(m)
        if not imp.top_level and not imp.type_checking
    ]
    assert ("engine/archive/tracking.py", "mlflow") in seen  # lazy for a listed reason
    assert all(t.split(".")[0] not in LAZY for _, _, t in offenders())


if __name__ == "__main__":
    found = offenders()
    for rel, n in sorted(Counter(f for f, _, _ in found).items(), key=lambda x: (-x[1], x[0])):
        print(f"{n:4d}  {rel}")
    print(f"{len(found):4d}  function-level imports without a reason", file=sys.stderr)
