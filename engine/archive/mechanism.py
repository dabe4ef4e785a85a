"""A mechanism's identity: the hash of its normalized ``algorithm.py``.

Normalized = the Python AST with docstrings removed (comments, blank lines, quoting and layout never
reach the AST), so two files that differ only in formatting or documentation have the same hash.
Each node commit that writes ``algorithm.py`` carries it as the trailer ``Poise-Mechanism``; nodes
written before that trailer existed are hashed from their file on demand.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Mapping
from typing import Any

TRAILER = "Poise-Mechanism"
HASH_CHARS = 16


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]


def normalized(source: str) -> str | None:
    """The AST dump of ``source`` without docstrings; None when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # a pushed 200k-term `1+1+...`
        return None
    _strip_docstrings(tree)
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def mechanism_hash(source: str) -> str | None:
    """16 hex digits of sha256 over the normalized source; None when it does not parse."""
    norm = normalized(source)
    if norm is None:
        return None
    return hashlib.sha256(norm.encode("utf-8")).hexdigest()[:HASH_CHARS]


def same_mechanism(archive: Any, source: str, nodes: Mapping[str, Any] | None = None) -> list[str]:
    """Names of the archive's nodes whose algorithm.py is the same mechanism as ``source``
    (oldest first). Without ``nodes``, from the archive's mechanism index (one look-up, whatever
    the archive's size: :meth:`Archive.mechanism_twins`); over a lineage already read, from its
    nodes' trailers, the files of nodes without the trailer read in one ``cat-file --batch``."""
    want = mechanism_hash(source)
    if want is None:
        return []
    if nodes is None:
        found = archive.mechanism_twins(want)
        if found is not None:
            return found
        nodes = archive.nodes()
    found, unknown = [], []
    for n in nodes.values():
        h = n.trailer(TRAILER)
        if h is None:
            unknown.append(n)
        elif h == want:
            found.append(n)
    if unknown:
        blobs = archive.git.cat_blobs([f"{n.commit}:algorithm.py" for n in unknown])
        for n, blob in zip(unknown, blobs):
            if blob is not None and mechanism_hash(blob.decode("utf-8", "replace")) == want:
                found.append(n)
    return [n.name for n in sorted(found, key=lambda n: (n.created, n.name))]
