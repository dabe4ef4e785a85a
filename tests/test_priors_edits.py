"""Priors are stored as edits over the root and materialized by the archive's LibCST edit; their cards
state the equation as implemented, the readings chosen and the paper's reported Overall."""

from __future__ import annotations

import ast
import re
import subprocess

import pytest
import torch

from engine.archive.edit import apply_edit, prior_source
from trainer_template import ALGORITHM_FILE
from trainer_template.loader import load_algorithm, make_config
from trainer_template.priors import list_priors, prior_card, prior_edit

ROOT = ALGORITHM_FILE.read_text(encoding="utf-8")
EDITED = [n for n in list_priors() if n != "grpo"]
LOSS_FIELDS = (
    "clip_ratio_low",
    "clip_ratio_high",
    "clip_ratio_c",
    "loss_agg_mode",
    "kl_coef",
    "kl_type",
    "entropy_coef",
)
# loss-side defaults a prior changes on purpose (each stated on its card)
LOSS_OVERRIDES = {
    ("dapo", "clip_ratio_high"): 0.28,
    ("dapo", "kl_coef"): 0.0,
    ("dr_grpo", "loss_agg_mode"): "seq-mean-token-sum-norm",
    ("bn_grpo", "entropy_coef"): 0.001,
    ("sa_grpo", "entropy_coef"): 0.001,
}


def definitions(src: str) -> dict[str, str]:
    """Top-level definitions {name: source text}."""
    lines = src.splitlines()
    out = {}
    for node in ast.parse(src).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out[node.name] = "\n".join(lines[start - 1 : node.end_lineno])
    return out


def without(src: str, names) -> str:
    """``src`` with the named top-level definitions cut out."""
    lines = src.splitlines()
    drop = set()
    for node in ast.parse(src).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            drop.update(range(start - 1, node.end_lineno))
    return "\n".join(ln for i, ln in enumerate(lines) if i not in drop)


@pytest.mark.parametrize("name", EDITED)
def test_edit_holds_only_the_changed_definitions(name):
    edit = prior_edit(name)
    body = ast.parse(edit).body
    assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)  # a docstring
    assert all(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in body[1:]), name
    assert "policy_loss" not in definitions(edit), "the root's loss is inherited, not copied"
    full = prior_source(name)
    ours, root = definitions(full), definitions(ROOT)
    changed = {n for n in root if ours.get(n) != root[n]}
    assert changed == set(definitions(edit)), (name, changed)  # each definition changes something
    assert without(full, changed) == without(ROOT, changed)  # every other byte is the root's


def test_materialized_by_the_same_edit_as_spawn():
    for name in list_priors():
        assert prior_source(name) == apply_edit(ROOT, prior_edit(name))
    assert prior_source("grpo") == ROOT


def test_one_change_to_the_roots_loss_reaches_every_prior():
    marker = '    metrics["reached"] = 1.0\n    return loss, metrics\n'
    changed_root = ROOT.replace("    return loss, metrics\n", marker)
    assert changed_root != ROOT
    for name in list_priors():
        src = prior_source(name, root_src=changed_root)
        assert marker in src, name
        mod = load_algorithm(src, f"reach_{name}")
        x = torch.zeros(2, 3)
        _, metrics = mod.policy_loss(x, x, x, torch.ones(2, 3), make_config(mod))
        assert metrics["reached"] == 1.0


@pytest.mark.parametrize("name", EDITED)
def test_loss_fields_are_the_roots(name):
    cfg = make_config(load_algorithm(prior_source(name), name))
    root = make_config(load_algorithm(ROOT, "root"))
    for field in LOSS_FIELDS:
        want = LOSS_OVERRIDES.get((name, field), getattr(root, field))
        assert getattr(cfg, field) == want, (name, field)


# -- seeding a prior into an archive ----------------------------------------------------------------
def diff_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]


def test_spawn_prior_diff_shows_only_the_mechanism(cli, tmp_path):
    arch = tmp_path / "exp"
    assert cli("init", str(arch)).returncode == 0
    out = cli("spawn", "grpo", "--prior", "vm_av_grpo", "--no-verify", "-C", str(arch))
    assert out.returncode == 0, out.stderr
    diff = cli("diff", "grpo", "vm_av_grpo", "-C", str(arch))
    assert diff.returncode == 0, diff.stderr
    git = subprocess.run(
        ["git", "-C", str(arch), "diff", "poise/grpo", "poise/vm_av_grpo", "--", "algorithm.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    edit_defs = definitions(prior_edit("vm_av_grpo"))
    inside = {ln for text in edit_defs.values() for ln in text.splitlines()}
    inside |= {ln for n in edit_defs for ln in definitions(ROOT)[n].splitlines()}
    for text in (diff.stdout, git):
        changed = diff_lines(text)
        assert changed and "mu_valid" in text
        assert all(ln[1:] in inside for ln in changed), [
            ln for ln in changed if ln[1:] not in inside
        ]
    src = subprocess.run(
        ["git", "-C", str(arch), "show", "poise/vm_av_grpo:algorithm.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert src == prior_source("vm_av_grpo")
    card = subprocess.run(
        ["git", "-C", str(arch), "show", "poise/vm_av_grpo:PROPOSAL.md"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert card == prior_card("vm_av_grpo")
    log = subprocess.run(
        ["git", "-C", str(arch), "log", "-1", "--format=%B", "poise/vm_av_grpo"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Poise-Prior: vm_av_grpo" in log


@pytest.mark.slow  # a dozen CLI processes
def test_spawn_prior_bad_input(cli, tmp_path):
    arch = tmp_path / "exp"
    cli("init", str(arch))
    bad = cli("spawn", "grpo", "--prior", "no_such", "-C", str(arch))
    assert bad.returncode != 0 and "unknown prior 'no_such'" in (bad.stdout + bad.stderr)
    edit = tmp_path / "e.py"
    edit.write_text("X = 1\n")
    both = cli("spawn", "grpo", "--prior", "rloo", "--edit", str(edit), "-C", str(arch))
    assert both.returncode != 0 and "--prior and --edit" in (both.stdout + both.stderr)
    named = cli(
        "spawn", "grpo", "--prior", "rloo", "--name", "my-rloo", "--no-verify", "-C", str(arch)
    )
    assert named.returncode == 0, named.stderr
    assert "spawned my-rloo" in named.stdout


def test_every_prior_spawns_as_a_node(archive):
    for name in EDITED:
        node = archive.spawn("grpo", name, prior_edit(name))
        assert node.parents == ("grpo",)
        assert archive.algorithm(name) == prior_source(name)


# -- cards -------------------------------------------------------------------------------------------
OVERALL = {
    "grpo": "47.8",
    "av_grpo": "50.9",
    "vm_av_grpo": "52.5",
    "msa_grpo": "50.7",
    "fa_grpo": "49.9",
    "bn_grpo": "44.2",
    "sa_grpo": "34.5",
    "dfr_grpo": "49.0",
    "dace_grpo": "51.7",
    "cag_grpo": "49.5",
    "dcbe_grpo": "27.8",
}


@pytest.mark.parametrize("name", list_priors())
def test_card_sections(name):
    card = prior_card(name)
    for section in (
        "**Motivation.**",
        "**Equation as implemented.**",
        "**Interpretation choices.**",
        "**Hyperparameters.**",
        "**Reported results.**",
        "**Stored as.**",
    ):
        assert section in card, (name, section)
    if name in OVERALL:
        results = card.split("**Reported results.**")[1]
        assert f"Overall {OVERALL[name]}" in results and "arXiv:2603.23951" in results


@pytest.mark.parametrize("name", EDITED)
def test_card_matches_the_code(name):
    """Every Hyperparameters field the prior adds or changes is on its card with its default, and the
    card names the definitions the edit replaces."""
    card = prior_card(name)
    cfg = make_config(load_algorithm(prior_source(name), name))
    root = make_config(load_algorithm(ROOT, "root"))
    for field, value in vars(cfg).items():
        if hasattr(root, field) and getattr(root, field) == value:
            continue
        shown = f'"{value}"' if isinstance(value, str) else repr(value)
        assert f"`{field}` = {shown}" in card, (name, field, shown)
    stored = card.split("**Stored as.**")[1]
    for definition in definitions(prior_edit(name)):
        assert f"`{definition}`" in stored, (name, definition)
    assert re.search(r"\*\*Stored as\.\*\* An edit of", card), name
