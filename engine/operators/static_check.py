"""Static checks of candidate code: the fast first filter before any of it executes.

The source must parse, keep the interface signatures, import only from an allowlist and touch no file,
network, process or dynamic-code facility. This is a filter with clear messages, not the security
boundary (that is the OS sandbox, ``engine.sandbox``).
"""

from __future__ import annotations

import ast

from engine.archive.edit import check_interface
from engine.errors import EditError

ALLOWED_IMPORTS = (
    "__future__",
    "math",
    "dataclasses",
    "typing",
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "trainer_template.interface",
    "functools",
    "itertools",
    "numbers",
    "enum",
)
BANNED_NAMES = frozenset(
    {
        "open",
        "eval",
        "exec",
        "compile",
        "__import__",
        "setattr",
        "delattr",
        "globals",
        "locals",
        "vars",
        "input",
        "breakpoint",
        "exit",
        "quit",
        "help",
        "memoryview",
        "__builtins__",
        "builtins",
        "os",
        "sys",
        "subprocess",
        "socket",
        "importlib",
        "signal",
        "ctypes",
        "pickle",
        "shutil",
        "pathlib",
        "io",
        "threading",
        "multiprocessing",
        "asyncio",
        "urllib",
        "http",
        "requests",
        "resource",
        "gc",
        "inspect",
        "marshal",
        "types",
        "code",
        "codeop",
        "runpy",
        "pty",
        "select",
        "mmap",
        "tempfile",
        "glob",
        "fcntl",
    }
)
BANNED_ATTRS = frozenset(
    {
        "load",
        "save",
        "hub",
        "from_file",
        "load_library",
        "cpp_extension",
        "multiprocessing",
        "distributed",
        "ops",
        "classes",
        "compile",
        "jit",
        "package",
        "utils",
        "set_default_dtype",
        "set_default_device",
        "set_default_tensor_type",
        "set_grad_enabled",
        "set_num_threads",
        "set_num_interop_threads",
        "manual_seed",
        "seed",
        "system",
        "popen",
        "storage",
        "untyped_storage",
        "data_ptr",
        "share_memory_",
        "backends",
        "fx",
        "export",
        "library",
        "cuda_path",
    }
)
ALLOWED_DECORATORS = (
    "dataclass",
    "dataclasses.dataclass",
    "torch.no_grad",
    "staticmethod",
    "property",
)
MAX_SOURCE_BYTES = 100_000


class StaticCheckError(EditError):
    """Generated (or hand-written) code fails the static checks."""


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    return "?"


def static_check(source: str, parent_source: str | None = None) -> None:
    """Raise StaticCheckError (one line: what and where) unless ``source`` is safe to execute."""
    if len(source.encode("utf-8")) > MAX_SOURCE_BYTES:
        raise StaticCheckError(f"algorithm.py is larger than {MAX_SOURCE_BYTES // 1000} kB")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise StaticCheckError(
            f"algorithm.py does not parse: line {exc.lineno}: {exc.msg}"
        ) from None
    try:
        check_interface(parent_source if parent_source is not None else source, source)
    except EditError as exc:
        raise StaticCheckError(str(exc)) from None

    def bad(node: ast.AST, what: str) -> StaticCheckError:
        return StaticCheckError(f"line {getattr(node, 'lineno', '?')}: {what}")

    for stmt in tree.body:
        ok = isinstance(
            stmt,
            (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign),
        )
        ok = ok or (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        )
        if not ok:
            raise bad(
                stmt,
                f"only imports, definitions and assignments are allowed at module level, not {type(stmt).__name__}",
            )
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name not in ALLOWED_IMPORTS:
                    raise bad(
                        node,
                        f"import of {alias.name!r} is not allowed (allowed: {', '.join(ALLOWED_IMPORTS)})",
                    )
        elif isinstance(node, ast.ImportFrom):
            mod = "." * node.level + (node.module or "")
            if node.level or mod not in ALLOWED_IMPORTS:
                raise bad(
                    node,
                    f"import from {mod!r} is not allowed (allowed: {', '.join(ALLOWED_IMPORTS)})",
                )
            for alias in node.names:
                if alias.name == "*" or alias.name.startswith("_") and mod != "__future__":
                    raise bad(node, f"'from {mod} import {alias.name}' is not allowed")
        elif isinstance(node, ast.Name):
            if node.id in BANNED_NAMES:
                raise bad(
                    node,
                    f"use of {node.id!r} is not allowed (no file, network, process or dynamic-code access)",
                )
            if node.id.startswith("__") and node.id not in ("__name__",):
                raise bad(node, f"use of {node.id!r} is not allowed")
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                raise bad(
                    node, f"access to the private/dunder attribute {node.attr!r} is not allowed"
                )
            if node.attr in BANNED_ATTRS:
                raise bad(
                    node,
                    f"{_dotted(node)} is not allowed (file, process, compilation or global-state access)",
                )
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
        ):
            name = node.args[1] if len(node.args) > 1 else None
            if not (
                isinstance(name, ast.Constant)
                and isinstance(name.value, str)
                and not name.value.startswith("_")
            ):
                raise bad(node, f"{node.func.id}() needs a constant, non-underscore attribute name")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            raise bad(node, "global / nonlocal statements are not allowed")
        elif isinstance(node, (ast.AsyncFunctionDef, ast.Await, ast.AsyncFor, ast.AsyncWith)):
            raise bad(node, "async code is not allowed")
        elif isinstance(node, ast.ExceptHandler):
            caught = _dotted(node.type) if node.type is not None else ""
            if node.type is None or caught in (
                "BaseException",
                "SystemExit",
                "KeyboardInterrupt",
                "GeneratorExit",
            ):
                raise bad(
                    node,
                    f"'except {caught or ':'}' is not allowed (it would swallow the sandbox's limits)",
                )
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            for dec in node.decorator_list:
                if _dotted(dec) not in ALLOWED_DECORATORS:
                    raise bad(
                        dec,
                        f"decorator {_dotted(dec)!r} is not allowed (allowed: {', '.join(ALLOWED_DECORATORS)})",
                    )
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, (str, bytes))
            and len(node.value) > 20_000
        ):
            raise bad(node, "string constants longer than 20 kB are not allowed")
