"""Clean-up verbs: ``drop`` (restorable), ``restore``, ``gc``."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from engine.archive.store import Archive
from engine.cli import ArchiveOpt, console, shell_arg


def drop(
    nodes: list[str] = typer.Argument(..., help="The node(s) to drop."),
    with_descendants: bool = typer.Option(
        False, "--with-descendants", help="Also drop every node below them (one batch)."
    ),
    undo: bool = typer.Option(
        False, "--undo", help="Bring NODE back instead (the same as `poise-git restore NODE`)."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Say what would be dropped; change nothing."
    ),
    archive: Path = ArchiveOpt,
) -> None:
    """Remove nodes from the lineage, keeping them restorable.

    The branch poise/NODE moves to the hidden ref refs/poise-dropped/NODE/BATCH: every object stays
    reachable (git fsck stays clean) and `poise-git restore NODE` brings it back. A node with
    descendants is refused unless --with-descendants; the root cannot be dropped."""
    from engine.archive.cleanup import drop as run_drop  # lazy: keeps `poise-git --help` fast
    from engine.archive.cleanup import restore  # lazy: keeps `poise-git --help` fast

    arch = Archive(archive)
    if undo:
        if len(nodes) != 1:
            raise typer.BadParameter("--undo takes exactly one node")
        back = restore(arch, nodes[0])
        console.print(f"restored {', '.join(back)}", highlight=False)
        return
    gone = run_drop(arch, nodes, with_descendants=with_descendants, dry_run=dry_run)
    verb = "would drop" if dry_run else "dropped"
    console.print(f"{verb} {len(gone)} node(s): {', '.join(gone)}", highlight=False)
    if not dry_run:
        console.print(
            f"undo with: poise-git restore {nodes[0]} -C {shell_arg(arch.path)}", highlight=False
        )


def restore(
    node: str | None = typer.Argument(None, help="The dropped node to bring back."),
    batch: str | None = typer.Option(
        None, "--batch", help="Which drop of NODE (default: the latest); see --list."
    ),
    list_: bool = typer.Option(False, "--list", help="List the dropped nodes and exit."),
    as_json: bool = typer.Option(False, "--json", help="With --list: machine-readable output."),
    archive: Path = ArchiveOpt,
) -> None:
    """Bring a dropped node back, with every node dropped together with it."""
    from engine.archive.cleanup import dropped  # lazy: keeps `poise-git --help` fast
    from engine.archive.cleanup import restore as run_restore  # lazy: keeps `poise-git --help` fast

    arch = Archive(archive)
    if list_ or node is None:
        gone = dropped(arch)
        if as_json:
            rows = [
                {
                    "node": d.name,
                    "batch": d.batch,
                    "dropped_at": d.dropped_at,
                    "status": d.status,
                    "parents": list(d.parents),
                    "commit": d.commit,
                }
                for d in gone
            ]
            typer.echo(json.dumps(rows, indent=2))
            return
        if not gone:
            console.print("no dropped nodes")
            return
        table = Table(title="dropped nodes (newest first)")
        for col in ("node", "batch", "status", "parents", "commit"):
            table.add_column(col, overflow="fold")
        for d in gone:
            table.add_row(d.name, d.batch, d.status, ", ".join(d.parents), d.commit[:10])
        console.print(table)
        return
    back = run_restore(arch, node, batch)
    console.print(f"restored {', '.join(back)}", highlight=False)


def gc(
    older_than: float = typer.Option(
        14.0, "--older-than", min=0, help="Only what is older than this many days."
    ),
    keep_failed: bool = typer.Option(
        False, "--keep-failed", help="Do not drop failed / rejected leaf nodes."
    ),
    prune: bool = typer.Option(
        False, "--prune", help="Also delete dropped nodes for good (not restorable afterwards)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go; change nothing."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    archive: Path = ArchiveOpt,
) -> None:
    """Collect stale data older than N days: temporary directories that killed verification or
    evaluation runs left behind, verl data of nodes no longer in the archive, and failed or
    rejected leaf nodes (dropped, so `poise-git restore` can bring them back); --prune deletes
    dropped nodes for good."""
    from engine.archive.cleanup import gc as run_gc  # lazy: keeps `poise-git --help` fast

    arch = Archive(archive)
    rep = run_gc(arch, older_than, dry_run=dry_run, drop_failed=not keep_failed, prune=prune)
    if as_json:
        typer.echo(json.dumps(rep.__dict__, indent=2))
        return
    verb = "would remove" if dry_run else "removed"
    mb = rep.scratch_bytes / 1e6
    console.print(f"{verb} {len(rep.scratch)} scratch director(ies), {mb:.1f} MB", highlight=False)
    for p in rep.scratch:
        console.print(f"  {p}", highlight=False, markup=False)
    verb = "would drop" if dry_run else "dropped"
    console.print(
        f"{verb} {len(rep.failed)} failed / rejected node(s)"
        + (f": {', '.join(rep.failed)}" if rep.failed else ""),
        highlight=False,
        markup=False,
    )
    if prune:
        verb = "would delete" if dry_run else "deleted"
        console.print(
            f"{verb} {len(rep.pruned)} dropped node(s) for good"
            + (f": {', '.join(rep.pruned)}" if rep.pruned else ""),
            highlight=False,
            markup=False,
        )


def register(app: typer.Typer) -> None:
    app.command()(drop)
    app.command()(restore)
    app.command()(gc)
