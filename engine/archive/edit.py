"""LibCST edits of ``algorithm.py``: replace same-named top-level definitions, append new ones.

Every byte outside the replaced definitions is preserved. The edit is a Python module of top-level
definitions (functions, classes, assignments) and optionally imports; anything else is refused.
"""

from __future__ import annotations

import ast
import functools
import io
import tokenize

from engine.errors import EditError
from trainer_template import ALGORITHM_FILE, INTERFACE_FUNCTIONS


class _LazyLibCST:
    """``import libcst`` costs ~0.4 s: load it on first use so read-only commands start instantly."""

    def __getattr__(self, name: str):
        import libcst  # lazy: libcst is heavy (only this path needs it)

        return getattr(libcst, name)


cst = _LazyLibCST()

MAX_SOURCE_BYTES = 100_000
MAX_NESTING = 50
"""brackets and indented blocks inside one another (LibCST's native parser crashes on ~1,500)"""
MAX_OPERATORS = 200
"""operators (and attribute, call and subscript links) in one statement: each one nests the tree a
level deeper (a 350-term ``1+1+...`` exhausts LibCST's and ast's recursion)"""
_OPENERS, _CLOSERS = {"(", "[", "{"}, {")", "]", "}"}
_FLAT = {",", ":", "=", ";", "->"}
_WORD_OPS = {"and", "or", "not", "if", "else", "in", "is", "lambda", "await"}


def decode_source(data: bytes, what: str) -> str:
    """``data`` as UTF-8 text, or an EditError naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EditError(f"{what} is not valid UTF-8 (byte {exc.start})") from None


def check_bounds(src: str, what: str) -> None:
    """Refuse code a parser would crash or recurse on, before any parser sees it: size, NUL bytes,
    invalid text, nesting depth, operator chains."""
    if not isinstance(src, str):
        raise EditError(f"{what} is not text")
    try:
        size = len(src.encode("utf-8"))
    except UnicodeEncodeError:
        raise EditError(f"{what} is not valid UTF-8 (it holds unpaired surrogates)") from None
    if size > MAX_SOURCE_BYTES:
        raise EditError(f"{what} is larger than {MAX_SOURCE_BYTES // 1000} kB")
    if "\x00" in src:
        raise EditError(f"{what} contains a NUL byte")
    depth = indent = ops = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.OP:
                if tok.string in _OPENERS:
                    depth += 1
                    ops += 1
                elif tok.string in _CLOSERS:
                    depth = max(0, depth - 1)
                elif tok.string not in _FLAT:
                    ops += 1
            elif tok.type == tokenize.NAME and tok.string in _WORD_OPS:
                ops += 1
            elif tok.type == tokenize.INDENT:
                indent += 1
            elif tok.type == tokenize.DEDENT:
                indent = max(0, indent - 1)
            elif tok.type == tokenize.NEWLINE:
                ops = 0
            if depth + indent > MAX_NESTING:
                raise EditError(
                    f"{what} nests brackets / blocks deeper than {MAX_NESTING} (line {tok.start[0]})"
                )
            if ops > MAX_OPERATORS:
                raise EditError(
                    f"{what} has more than {MAX_OPERATORS} operators in one statement "
                    f"(line {tok.start[0]}); split the expression"
                )
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return  # a syntax error: the parser reports it with its position


def parse_ast(src: str | bytes, what: str) -> ast.Module:
    """The syntax tree of code read back from an archive, within the bounds a new ``algorithm.py``
    gets (:func:`check_bounds`): a pushed branch's file is as hostile as an LLM's edit. One-line
    EditError naming ``what`` (say, ``node b's algorithm.py``) where it is out of bounds or does not
    parse — never a RecursionError. Bytes (a git blob) must be UTF-8."""
    if isinstance(src, bytes):
        src = decode_source(src, what)
    check_bounds(src, what)
    try:
        return ast.parse(src)
    except SyntaxError as exc:
        raise EditError(f"{what} does not parse: line {exc.lineno}: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise EditError(f"{what} cannot be parsed ({type(exc).__name__})") from None


@functools.lru_cache(maxsize=64)
def _parse_cached(src: str) -> cst.Module:
    # LibCST trees are immutable, so a parsed parent is safely shared by all of its children's edits.
    return cst.parse_module(src)


def _parse(src: str, what: str) -> cst.Module:
    check_bounds(src, what)
    try:
        return _parse_cached(src)
    except cst.ParserSyntaxError as exc:
        raise EditError(
            f"{what} has a syntax error at line {exc.raw_line}, column {exc.raw_column}: {exc.message}"
        ) from None
    except (RecursionError, MemoryError) as exc:
        raise EditError(f"{what} is too deeply nested to parse ({type(exc).__name__})") from None


def defined_names(stmt: cst.CSTNode) -> list[str]:
    """The names a top-level statement defines: a function's or class's, or an assignment's targets."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return [stmt.name.value]
    if isinstance(stmt, cst.SimpleStatementLine):
        names = []
        for small in stmt.body:
            targets = []
            if isinstance(small, cst.Assign):
                targets = [t.target for t in small.targets]
            elif isinstance(small, cst.AnnAssign):
                targets = [small.target]
            for t in targets:
                if isinstance(t, cst.Name):
                    names.append(t.value)
        return names
    return []


def _is_import(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
    )


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _has_comment(lines) -> bool:
    return any(line.comment is not None for line in lines)


def _lead(old_lines, new: cst.CSTNode) -> list:
    """The lines above a replaced definition: the parent's, or, when the edit's definition carries
    comments, the parent's blank separator lines followed by the edit's comments (the blank lines
    between two definitions are the parent's formatting, not part of the definition)."""
    lines = list(new.leading_lines)
    if not _has_comment(lines):
        return list(old_lines)
    first = next(i for i, ln in enumerate(lines) if ln.comment is not None)
    blanks = []
    for ln in old_lines:
        if ln.comment is not None:
            break
        blanks.append(ln)
    return [*blanks, *lines[first:]]


def apply_edit(parent_src: str, edit_src: str) -> str:
    """Return ``parent_src`` with the edit's top-level definitions replaced or appended."""
    parent = _parse(parent_src, "the parent's algorithm.py")
    edit = _parse(edit_src, "the edit")
    edit_body = list(edit.body)
    if edit_body and _has_comment(edit.header):
        # LibCST puts the first statement's leading comment in the module header: keep it with the def.
        edit_body[0] = edit_body[0].with_changes(
            leading_lines=[*edit.header, *edit_body[0].leading_lines]
        )
    replacements: dict[str, cst.CSTNode] = {}
    imports: list[cst.CSTNode] = []
    order: list[str] = []
    for stmt in edit_body:
        if _is_docstring(stmt):
            continue
        if _is_import(stmt):
            imports.append(stmt)
            continue
        names = defined_names(stmt)
        if not names or (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) != 1):
            code = edit.code_for_node(stmt).strip().splitlines()[0]
            raise EditError(
                f"the edit may only hold top-level definitions, imports and assignments; found: {code}"
            )
        if len(names) != 1:
            raise EditError(f"one assignment per line in the edit, please: {', '.join(names)}")
        if names[0] in replacements:
            raise EditError(f"the edit defines {names[0]!r} twice")
        replacements[names[0]] = stmt
        order.append(names[0])

    existing_imports = {parent.code_for_node(s).strip() for s in parent.body if _is_import(s)}
    new_body = []
    used: set[str] = set()
    last_import = -1
    for stmt in parent.body:
        names = defined_names(stmt)
        if len(names) == 1 and names[0] in replacements and names[0] not in used:
            new = replacements[names[0]]
            new_body.append(new.with_changes(leading_lines=_lead(stmt.leading_lines, new)))
            used.add(names[0])
        else:
            new_body.append(stmt)
        if _is_import(stmt):
            last_import = len(new_body) - 1
    added_imports = [i for i in imports if edit.code_for_node(i).strip() not in existing_imports]
    if added_imports:
        at = last_import + 1
        new_body[at:at] = [i.with_changes(leading_lines=[]) for i in added_imports]
    blank2 = [cst.EmptyLine(), cst.EmptyLine()]
    for name in order:
        if name not in used:
            stmt = replacements[name]
            lead = stmt.leading_lines if _has_comment(stmt.leading_lines) else []
            comments = [ln for ln in lead if ln.comment is not None]
            new_body.append(stmt.with_changes(leading_lines=[*blank2, *comments]))
    return parent.with_changes(body=new_body).code


def _signature(fn: ast.FunctionDef) -> tuple:
    a = fn.args
    pos = [p.arg for p in a.posonlyargs] + [p.arg for p in a.args]
    n_def = len(a.defaults)
    return (
        tuple(p.arg for p in a.posonlyargs),
        tuple(p.arg for p in a.args),
        tuple(pos[len(pos) - n_def :]) if n_def else (),
        a.vararg.arg if a.vararg else None,
        tuple(p.arg for p in a.kwonlyargs),
        tuple(p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None),
        a.kwarg.arg if a.kwarg else None,
    )


def interface_signatures(src: str, what: str = "algorithm.py") -> dict[str, tuple]:
    return dict(_interface_signatures(src, what))


@functools.lru_cache(maxsize=64)
def _interface_signatures(src: str, what: str) -> tuple:
    """The signatures (parameter names, kinds, which have defaults) of the interface functions."""
    check_bounds(src, what)
    try:
        tree = ast.parse(src)
    except SyntaxError as exc:
        raise EditError(f"{what} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    except (RecursionError, MemoryError) as exc:
        raise EditError(f"{what} is too deeply nested to parse ({type(exc).__name__})") from None
    found: dict[str, tuple] = {}
    for stmt in tree.body:
        if (
            isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
            and stmt.name in INTERFACE_FUNCTIONS
        ):
            if isinstance(stmt, ast.AsyncFunctionDef):
                raise EditError(f"{what}: {stmt.name} must not be async")
            found[stmt.name] = _signature(stmt)
    return tuple(found.items())


def check_interface(parent_src: str, new_src: str, subject: str = "") -> None:
    """Raise EditError unless ``new_src`` compiles and keeps every interface function's signature.

    ``subject`` names ``new_src`` in the message when it is not an edit of ``parent_src`` (a root of
    the user's own code, checked against the template)."""
    what = subject or "the edited algorithm.py"
    before = interface_signatures(parent_src, "the parent's algorithm.py")
    after = interface_signatures(new_src, what)
    change = subject or "the edit"
    for name in INTERFACE_FUNCTIONS:
        if name not in after:
            raise EditError(f"{change} drops the interface function {name}()")
        if name in before and before[name] != after[name]:
            raise EditError(f"{change} changes the signature of the interface function {name}()")
    try:
        compile(new_src, "algorithm.py", "exec")
    except SyntaxError as exc:
        raise EditError(f"{what} does not compile: line {exc.lineno}: {exc.msg}") from None
    except (RecursionError, MemoryError) as exc:
        raise EditError(f"{what} is too deeply nested ({type(exc).__name__})") from None


@functools.lru_cache(maxsize=32)
def _materialize(name: str, root_src: str, edit_src: str) -> str:
    out = apply_edit(root_src, edit_src)
    try:
        check_interface(root_src, out)
    except EditError as exc:
        raise EditError(f"prior {name!r}: {exc}") from None
    return out


def prior_source(name: str, root_src: str | None = None) -> str:
    """The complete algorithm.py of the published mechanism ``name``: its edit
    (``trainer_template.priors.prior_edit``) applied to the root (``trainer_template/algorithm.py``,
    or ``root_src``) by :func:`apply_edit`, the edit ``poise-git spawn --edit`` makes."""
    from trainer_template.priors import prior_edit  # lazy: keeps `poise-git --help` fast

    edit_src = prior_edit(name)
    root = root_src if root_src is not None else ALGORITHM_FILE.read_text(encoding="utf-8")
    return _materialize(name, root, edit_src)
