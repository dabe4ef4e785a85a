"""``poise-git ablate``: which of a node's changes to the root carry its gain (registered beside
``confirm``, the other re-measure of what a search found)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from engine.archive.store import Archive
from engine.cli import EXIT_FAILED, EXIT_REJECTED, ArchiveOpt, console, plain

VERDICT_STYLES = {"carries gain": "green", "costs": "red", "failed": "red", "rejected": "red"}


def _pair(pair, digits: int = 4) -> tuple[str, str]:
    if pair is None:
        return "-", "-"
    mean, iv, _ = pair
    return f"{mean:+.{digits}f}", (f"[{iv[0]:+.{digits}f}, {iv[1]:+.{digits}f}]" if iv else "-")


def child_note(row, node: str) -> str:
    """Where a row's child comes from, beside its name: nothing for one this ablation spawned; for
    another, whether an earlier ablation of ``node`` spawned it (one that was interrupted before the
    child had a result, which this one resumed) or it is another node with that mechanism, and
    whether this ablation evaluated it or read the result it already had."""
    # lazy: torch is heavy (the operator module imports it)
    from engine.operators.ablate import EARLIER, EXISTING, INTERRUPTED

    where = {
        EXISTING: "an existing node",
        EARLIER: f"spawned by an earlier ablation of {node}",
        INTERRUPTED: f"spawned by an earlier, interrupted ablation of {node}",
    }.get(row.origin)
    if where is None:
        return ""
    if row.evaluated_now:
        where += "; evaluated now"
    elif row.status == "evaluated":
        where += "; already evaluated"
    return f" ({where})"


def ablation_table(ab) -> Table:
    """One row per change: the child without it, its objective, and what the node loses without it."""
    t = Table(
        title=f"{ab.node}: its changes to {ab.root}, each reverted ({ab.protocol}, seeds "
        f"{', '.join(map(str, ab.seeds))})",
        title_justify="left",
    )
    for col in ("change", "node without it", ab.objective, "node minus it", "95% interval"):
        t.add_column(col, overflow="fold")
    t.add_column("verdict")
    for r in ab.rows:
        mean, iv = _pair(r.contribution)
        value = f"{r.value:.4f}" if r.value is not None else "-"
        child = escape((r.child or "-") + child_note(r, ab.node))
        style = VERDICT_STYLES.get(r.verdict)
        verdict = f"[{style}]{r.verdict}[/]" if style else r.verdict
        t.add_row(escape(r.change.describe()), child, value, mean, iv, verdict)
    return t


def ablate(
    node: str = typer.Argument(..., help="The node to ablate (evaluated under the protocol)."),
    root: str | None = typer.Option(
        None, "--root", help="The node whose code a change reverts to (default: the root)."
    ),
    preset: str | None = typer.Option(
        None, "--preset", help="Proxy protocol preset (default: poise.toml's)."
    ),
    objective: str | None = typer.Option(
        None,
        "--objective",
        help="Override the objective (default: the last run's, else poise.toml's).",
    ),
    json_out: Path | None = typer.Option(
        None, "--json", help="Also write the table, with every interval and seed, to this file."
    ),
    archive: Path = ArchiveOpt,
) -> None:
    """Revert NODE's changes to the root one at a time and measure what each carries.

    For each change (a Hyperparameters default, a rewritten or added definition) a child of NODE with
    that one change set back to the root's is spawned, verified and evaluated at NODE's own seeds
    under the protocol; the paired difference NODE minus child is that change's part of NODE's gain.
    A child whose mechanism already exists (the root, where NODE made one change) is that node, so a
    second ablation trains nothing. Exit code 4 when a child fails its evaluation, 3 when verification
    rejects one (the table says which, and why)."""
    # lazy: torch is heavy (only this path needs it)
    from engine.operators.ablate import ablate_node

    # lazy: numpy is heavy (only this path needs it)
    from engine.report.html import report_experiment

    # lazy: numpy is heavy (only this path needs it)
    from engine.select.objective import with_objective

    arch = Archive(archive)
    exp = report_experiment(arch)
    if objective:
        exp = with_objective(exp, objective)
    with console.status(f"ablating [bold]{node}[/] ...") as status:

        def on_event(msg: str) -> None:
            console.print(f"  {escape(msg)}", highlight=False)
            status.update(f"ablating [bold]{node}[/]: {escape(msg)}")

        ab = ablate_node(
            arch, node, exp, preset=preset, root=root or arch.root(), on_event=on_event
        )
    if ab.gain is None:
        console.print(f"{ab.node} vs {ab.root}: no paired seeds recorded under {ab.protocol}")
    else:
        mean, iv = _pair(ab.gain)
        console.print(f"{ab.node} vs {ab.root}: {mean} {iv} over {ab.gain[2]} paired seed(s)")
    console.print(ablation_table(ab))
    for r in ab.rows:
        if r.status in ("failed", "rejected"):
            console.print(f"[red]{r.child} {r.status}:[/] {escape(r.reason)}", highlight=False)
    if json_out is not None:
        json_out.write_text(json.dumps(ab.to_json(), indent=1) + "\n", encoding="utf-8")
        console.print(f"wrote {plain(json_out)}", highlight=False)
    if any(r.status == "failed" for r in ab.rows):
        raise typer.Exit(EXIT_FAILED)
    if any(r.status == "rejected" for r in ab.rows):
        raise typer.Exit(EXIT_REJECTED)
