"""Static checks of candidate code: the fast first filter before any of it executes.

The source must be within the parser's bounds, parse, keep the interface signatures, import only from
an allowlist and use no file, network, process, introspection or dynamic-code facility — also not
through an allowed module's attributes (``torch.os``), a name bound to ``getattr``, ``str.format``
field traversal, frames of generators, ``match`` class patterns or monkeypatching. Code that would
run at import time (module and class bodies, default arguments, decorators, annotations) may only
compute constants. This is a filter with clear messages, not the security boundary: that is the OS
sandbox (``engine.sandbox``), which holds also when this filter misses something.
"""

from __future__ import annotations

import ast
import re

from engine.archive.edit import check_bounds, check_interface
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
_MODULES = {
    # modules an allowed module exposes as an attribute (torch.os, typing.sys, enum.bltns ...)
    "os", "sys", "builtins", "bltns", "importlib", "ctypes", "subprocess", "socket", "io",
    "pathlib", "shutil", "pickle", "marshal", "signal", "threading", "multiprocessing", "asyncio",
    "inspect", "types", "gc", "platform", "tempfile", "glob", "runpy", "codeop", "pty", "mmap",
    "fcntl", "resource", "urllib", "http", "requests", "weakref", "copyreg", "operator",
    "linecache", "traceback", "atexit", "sysconfig", "site", "zipimport", "pkgutil", "posix",
    "nt", "numpy", "np", "ctypeslib", "f2py", "serialization", "overrides", "typing_extensions",
}  # fmt: skip
BANNED_NAMES = frozenset(
    _MODULES
    | {
        "open", "eval", "exec", "compile", "__import__", "setattr", "delattr", "globals", "locals",
        "vars", "input", "breakpoint", "exit", "quit", "help", "memoryview", "copyright",
        "credits", "license", "__builtins__", "BaseException", "SystemExit", "KeyboardInterrupt",
        "GeneratorExit", "select", "code",
    }
)  # fmt: skip
BANNED_ATTRS = frozenset(
    _MODULES
    | {
        # files, processes, compiled or serialized code, global state (torch, numpy, typing)
        "load", "save", "hub", "from_file", "load_library", "cpp_extension", "distributed", "ops",
        "classes", "compile", "jit", "package", "utils", "set_default_dtype",
        "set_default_device", "set_default_tensor_type", "set_grad_enabled", "set_num_threads",
        "set_num_interop_threads", "manual_seed", "seed", "system", "popen", "storage",
        "untyped_storage", "data_ptr", "share_memory_", "backends", "fx", "export", "library",
        "cuda_path", "tofile", "fromfile", "dump", "dumps", "memmap", "savetxt", "loadtxt",
        "savez", "savez_compressed", "genfromtxt", "fromregex", "UntypedStorage", "TypedStorage",
        "Storage", "get_type_hints", "ForwardRef", "make_dataclass", "singledispatch",
        "singledispatchmethod", "format", "format_map", "mro",
        # frames and code objects (generator / coroutine / traceback introspection)
        "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame",
        "ag_code", "ag_await", "f_globals", "f_locals", "f_builtins", "f_back", "f_code",
        "f_trace", "tb_frame", "tb_next", "co_code", "co_consts", "co_names", "func_globals",
        "func_code",
    }
)  # fmt: skip
ALLOWED_DECORATORS = (
    "dataclass",
    "dataclasses.dataclass",
    "torch.no_grad",
    "staticmethod",
    "property",
)
ALLOWED_DUNDER_METHODS = ("__init__", "__post_init__", "__call__", "__repr__")
SAFE_CALLS = (
    "float", "int", "bool", "str", "tuple", "list", "dict", "set", "frozenset", "range", "len",
    "min", "max", "abs", "round", "field", "dataclasses.field",
)  # fmt: skip
FACTORIES = ("list", "dict", "set", "tuple", "frozenset")
_DUNDER_TEXT = re.compile(r"__\w+__")
_BANNED_EXC = ("BaseException", "SystemExit", "KeyboardInterrupt", "GeneratorExit")


class StaticCheckError(EditError):
    """Generated (or hand-written) code fails the static checks."""


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    if isinstance(node, ast.Constant):
        return repr(node.value)[:24]
    return "(...)"


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node


def static_check(source: str, parent_source: str | None = None) -> None:
    """Raise StaticCheckError (one line: what and where) unless ``source`` is safe to execute."""
    try:
        check_bounds(source, "algorithm.py")
        tree = ast.parse(source)
    except EditError as exc:
        raise StaticCheckError(str(exc)) from None
    except SyntaxError as exc:
        raise StaticCheckError(
            f"algorithm.py does not parse: line {exc.lineno}: {exc.msg}"
        ) from None
    except (RecursionError, MemoryError) as exc:
        raise StaticCheckError(
            f"algorithm.py is too deeply nested ({type(exc).__name__})"
        ) from None
    try:
        check_interface(parent_source if parent_source is not None else source, source)
    except EditError as exc:
        raise StaticCheckError(str(exc)) from None
    _Checker(tree).run()


class _Checker:
    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.imported: set[str] = set()
        self.docstrings: set[int] = set()
        self.callees: set[int] = set()
        self.own_attrs: set[int] = set()
        """attribute targets ``self.NAME`` of a constructor (``__init__`` / ``__post_init__``)"""
        self.methods = {
            id(s) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for s in c.body
        }

    def bad(self, node: ast.AST, what: str) -> StaticCheckError:
        return StaticCheckError(f"line {getattr(node, 'lineno', '?')}: {what}")

    def run(self) -> None:
        for node in ast.walk(self.tree):
            body = getattr(node, "body", None)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and body:
                first = body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    self.docstrings.add(id(first.value))
            if isinstance(node, ast.ClassDef):  # field docstrings after each field
                for stmt in node.body:
                    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                        self.docstrings.add(id(stmt.value))
            if isinstance(node, ast.Call):
                self.callees.add(id(node.func))
            self.self_binding(node)
            if isinstance(node, ast.ClassDef):
                for fn in node.body:
                    if isinstance(fn, ast.FunctionDef) and _is_constructor(fn):
                        self.own_attrs.update(
                            id(t)
                            for t in _walk_local(fn)
                            if isinstance(t, ast.Attribute)
                            and isinstance(t.value, ast.Name)
                            and t.value.id == "self"
                        )
        self.module_level()
        for node in ast.walk(self.tree):
            self.visit(node)

    # -- what runs at import time ---------------------------------------------------------------
    def module_level(self) -> None:
        for stmt in self.tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(stmt, ast.Expr) and id(stmt.value) in self.docstrings:
                continue
            if isinstance(stmt, ast.FunctionDef):
                self.definition(stmt)
            elif isinstance(stmt, ast.ClassDef):
                self.class_def(stmt)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                self.pure(stmt.value, "a module-level value")
                if isinstance(stmt, ast.AnnAssign):
                    self.pure(stmt.annotation, "an annotation", calls=False)
            else:
                raise self.bad(
                    stmt,
                    "only imports, definitions and assignments are allowed at module level, "
                    f"not {type(stmt).__name__}",
                )

    def definition(self, fn: ast.FunctionDef) -> None:
        """What a ``def`` evaluates when it runs: decorators, defaults, annotations."""
        if fn.name.startswith("__") and fn.name not in ALLOWED_DUNDER_METHODS:
            raise self.bad(fn, f"defining {fn.name} is not allowed (it runs outside the interface)")
        self.decorators(fn)
        a = fn.args
        for d in [*a.defaults, *[d for d in a.kw_defaults if d is not None]]:
            self.pure(d, "a default argument")
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            if arg is not None and arg.annotation is not None:
                self.pure(arg.annotation, "an annotation", calls=False)
        if fn.returns is not None:
            self.pure(fn.returns, "an annotation", calls=False)

    def class_def(self, cls: ast.ClassDef) -> None:
        if cls.keywords:
            raise self.bad(cls, "class keywords (metaclass=...) are not allowed")
        for base in cls.bases:
            if not isinstance(base, (ast.Name, ast.Attribute)):
                raise self.bad(base, "a class base must be a plain name")
        self.decorators(cls)
        for stmt in cls.body:
            if isinstance(stmt, ast.Expr) and id(stmt.value) in self.docstrings:
                continue
            if isinstance(stmt, ast.FunctionDef):
                self.definition(stmt)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                if stmt.value is not None:
                    self.pure(stmt.value, "a class attribute")
                if isinstance(stmt, ast.AnnAssign):
                    self.pure(stmt.annotation, "an annotation", calls=False)
            elif not isinstance(stmt, ast.Pass):
                raise self.bad(
                    stmt,
                    f"a class body may hold fields, methods and docstrings, not {type(stmt).__name__}",
                )

    def decorators(self, node: ast.FunctionDef | ast.ClassDef) -> None:
        for dec in node.decorator_list:
            name = _dotted(dec)
            if name not in ALLOWED_DECORATORS:
                raise self.bad(
                    dec,
                    f"decorator {name!r} is not allowed (allowed: {', '.join(ALLOWED_DECORATORS)})",
                )
            if isinstance(dec, ast.Call):
                if dec.args or any(not isinstance(k.value, ast.Constant) for k in dec.keywords):
                    raise self.bad(dec, f"decorator {name!r} takes constant keywords only")

    def pure(self, expr: ast.AST | None, what: str, calls: bool = True) -> None:
        """``expr`` runs at import time: no calls but constructors, math and field(...)."""
        if expr is None:
            return
        stack = [expr]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Lambda):
                continue  # its body runs later, inside the interface's calls
            if isinstance(node, ast.Call):
                name = _dotted(node.func)
                ok = calls and (name in SAFE_CALLS or name.startswith("math."))
                if not ok:
                    raise self.bad(node, f"{what} may not call {name}() (it would run at import)")
                for k in node.keywords:
                    if k.arg == "default_factory" and not (
                        isinstance(k.value, ast.Lambda)
                        or (isinstance(k.value, ast.Name) and k.value.id in FACTORIES)
                    ):
                        raise self.bad(
                            k.value, f"default_factory must be one of {', '.join(FACTORIES)}"
                        )
            elif isinstance(node, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)):
                raise self.bad(node, f"{what} may only compute a constant")
            stack.extend(ast.iter_child_nodes(node))

    # -- every node -----------------------------------------------------------------------------
    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name not in ALLOWED_IMPORTS:
                    raise self.bad(
                        node,
                        f"import of {alias.name!r} is not allowed (allowed: {', '.join(ALLOWED_IMPORTS)})",
                    )
                self.imported.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            mod = "." * node.level + (node.module or "")
            if node.level or mod not in ALLOWED_IMPORTS:
                raise self.bad(
                    node,
                    f"import from {mod!r} is not allowed (allowed: {', '.join(ALLOWED_IMPORTS)})",
                )
            for alias in node.names:
                n = alias.name
                if n == "*" or (n.startswith("_") and mod != "__future__"):
                    raise self.bad(node, f"'from {mod} import {n}' is not allowed")
                if n in BANNED_ATTRS or n in BANNED_NAMES:
                    raise self.bad(
                        node,
                        f"'from {mod} import {n}' is not allowed (file, process or code access)",
                    )
                self.imported.add(alias.asname or n)
        elif isinstance(node, ast.Name):
            self.name(node)
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                raise self.bad(
                    node, f"access to the private/dunder attribute {node.attr!r} is not allowed"
                )
            if node.attr in BANNED_ATTRS:
                raise self.bad(
                    node,
                    f"{_dotted(node)} is not allowed (file, process, code, frame or global-state access)",
                )
        elif isinstance(node, ast.Call):
            self.call(node)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                self.target(t)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            raise self.bad(node, "global / nonlocal statements are not allowed")
        elif isinstance(node, (ast.AsyncFunctionDef, ast.Await, ast.AsyncFor, ast.AsyncWith)):
            raise self.bad(node, "async code is not allowed")
        elif isinstance(node, ast.Match):
            raise self.bad(node, "match statements are not allowed")
        elif isinstance(node, ast.ExceptHandler):
            self.handler(node)
        elif isinstance(node, ast.Try | ast.TryStar):
            for stmt in node.finalbody:
                for sub in _walk_local(stmt):
                    if isinstance(sub, (ast.Return, ast.Break, ast.Continue)):
                        raise self.bad(
                            sub,
                            "return / break / continue inside 'finally' is not allowed "
                            "(it would swallow any exception)",
                        )
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            if isinstance(node, ast.FunctionDef):
                self.definition(node)
            else:
                self.class_def(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            if len(node.value) > 20_000:
                raise self.bad(node, "string constants longer than 20 kB are not allowed")
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            if id(node) not in self.docstrings and _DUNDER_TEXT.search(text):
                raise self.bad(node, "strings naming dunder attributes are not allowed")

    def name(self, node: ast.Name) -> None:
        if node.id in BANNED_NAMES:
            raise self.bad(
                node,
                f"use of {node.id!r} is not allowed (no file, network, process or dynamic-code access)",
            )
        if node.id.startswith("__") and node.id != "__name__":
            raise self.bad(node, f"use of {node.id!r} is not allowed")
        if node.id in ("getattr", "hasattr", "type") and id(node) not in self.callees:
            raise self.bad(node, f"{node.id} may only be called directly, not used as a value")

    def call(self, node: ast.Call) -> None:
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id in ("getattr", "hasattr"):
            name = node.args[1] if len(node.args) > 1 else None
            if (
                len(node.args) not in (2, 3)
                or node.keywords
                or not (isinstance(name, ast.Constant) and isinstance(name.value, str))
                or name.value.startswith("_")
                or name.value in BANNED_ATTRS
            ):
                raise self.bad(
                    node, f"{fn.id}() needs a constant, non-underscore, allowed attribute name"
                )
        elif (
            isinstance(fn, ast.Name) and fn.id == "type" and (len(node.args) != 1 or node.keywords)
        ):
            raise self.bad(node, "type() may only be called with one argument")

    def target(self, t: ast.AST) -> None:
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self.target(e)
            return
        if isinstance(t, (ast.Attribute, ast.Subscript)):
            root = _root(t)
            if id(t) in self.own_attrs:
                return
            if isinstance(t, ast.Subscript) and not (
                isinstance(root, ast.Name) and root.id in self.imported
            ):
                return  # item assignment into a local tensor / dict
            raise self.bad(
                t,
                f"assignment to {_dotted(t) if isinstance(t, ast.Attribute) else 'an item of ' + _dotted(root)}"
                " is not allowed (no monkeypatching: only self.NAME in a class's __init__ or"
                " __post_init__ may be assigned)",
            )

    def self_binding(self, node: ast.AST) -> None:
        """``self`` names the instance a method is called on, nothing else: rebinding it (``self =
        torch``), or a parameter of that name anywhere but first in a method, would make
        ``self.NAME = ...`` a monkeypatch."""
        why = "'self' may only name the first parameter of a method (no monkeypatching)"
        if isinstance(node, ast.Name) and node.id == "self" and not isinstance(node.ctx, ast.Load):
            raise self.bad(node, why)
        if isinstance(node, ast.alias) and (node.asname or node.name) == "self":
            raise self.bad(node, why)
        if isinstance(node, ast.ExceptHandler) and node.name == "self":
            raise self.bad(node, why)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
            first_ok = isinstance(node, ast.FunctionDef) and id(node) in self.methods
            if "self" in names[int(first_ok and names[:1] == ["self"]) :]:
                raise self.bad(node, why)

    def handler(self, node: ast.ExceptHandler) -> None:
        if node.type is None:
            raise self.bad(node, "'except:' is not allowed (it would swallow the sandbox's limits)")
        kinds = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        for k in kinds:
            if not isinstance(k, (ast.Name, ast.Attribute)):
                raise self.bad(k, "an except clause must name exception classes")
            if _dotted(k).split(".")[-1] in _BANNED_EXC:
                raise self.bad(
                    k,
                    f"'except {_dotted(k)}' is not allowed (it would swallow the sandbox's limits)",
                )


def _is_constructor(fn: ast.FunctionDef) -> bool:
    """A method that only construction calls (dunder attributes cannot be named): its first
    parameter is the new instance."""
    a = fn.args
    first = (a.posonlyargs + a.args)[:1]
    return fn.name in ("__init__", "__post_init__") and [x.arg for x in first] == ["self"]


def _walk_local(node: ast.AST):
    """ast.walk that does not enter nested function or class definitions."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        for child in ast.iter_child_nodes(n):
            if not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
            ):
                stack.append(child)
