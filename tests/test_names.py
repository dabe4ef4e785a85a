"""Names are unique across the project: no two public top-level definitions share a name, so a name
says which thing it is (``grep`` finds one definition; an import cannot pick up the wrong one).

Intended duplicates, each with its reason:
- the mechanism interface every algorithm file defines (the template and each prior): the loader
  finds ``Hyperparameters``, ``compute_advantages`` and ``policy_loss`` by these names; and a prior is
  an edit over the root, whose same-named top-level definitions replace the root's (e.g. its
  ``entropy_coefficient``), so a prior may redefine any name the root algorithm.py defines;
- a CLI verb is the function typer names the command after (``poise-git evaluate`` is ``evaluate``),
  and ``register(app)`` is the hook every ``engine/cli/*_cmds.py`` module defines;
- ``main`` is a process entry point's conventional name; ``log`` a module's own logger
  (``logging.getLogger(__name__)``).
"""

from __future__ import annotations

from collections import defaultdict

from project_ast import modules, top_level_definitions

INTERFACE = {"Hyperparameters", "compute_advantages", "policy_loss"}
ALWAYS = {"main", "log"}
ROOT = "trainer_template/algorithm.py"


def _is_algorithm_file(rel: str) -> bool:
    return rel == ROOT or rel.startswith("trainer_template/priors/")


def _cli_verbs() -> set[str]:
    """The callbacks registered as commands (what typer names the verbs after)."""
    from engine.cli import _register, app

    _register()
    return {c.callback.__name__ for c in app.registered_commands if c.callback is not None}


def duplicates() -> dict[str, list[str]]:
    verbs = _cli_verbs() | {"register"}
    root = {n for m in modules() if m.rel == ROOT for n, _ in top_level_definitions(m)}
    seen: dict[str, list[str]] = defaultdict(list)
    for m in modules():
        for name, line in top_level_definitions(m):
            if name.startswith("_") or name in ALWAYS:
                continue
            if name in INTERFACE and _is_algorithm_file(m.rel):
                continue
            if name in root and _is_algorithm_file(m.rel) and m.rel != ROOT:
                continue  # an edit over the root replaces the root's definition of that name
            if name in verbs and m.rel.startswith("engine/cli/") and m.rel.endswith("_cmds.py"):
                continue
            seen[name].append(f"{m.rel}:{line}")
    return {k: v for k, v in sorted(seen.items()) if len(v) > 1}


def test_public_names_are_unique_across_the_project():
    dup = duplicates()
    assert not dup, "public names defined more than once:\n" + "\n".join(
        f"{name}: {', '.join(where)}" for name, where in dup.items()
    )


def test_the_interface_names_are_only_defined_by_algorithm_files():
    """The allowlist is narrow: an interface name anywhere else is a collision."""
    for m in modules():
        if _is_algorithm_file(m.rel):
            continue
        clash = [n for n, _ in top_level_definitions(m) if n in INTERFACE]
        assert not clash, f"{m.rel} defines {clash}, the names of the mechanism interface"
