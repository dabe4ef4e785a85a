"""``poise-git compare``: nodes × metrics with intervals, protocol, parent and gain (like ``dvc exp show``)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from engine.archive.results import configured_protocol, describe_elsewhere, protocols_with_results
from engine.archive.store import Archive
from engine.cli import ArchiveOpt, console


def _f(v, nd: int = 4) -> str:
    return "—" if v is None else f"{v:.{nd}g}"


def _gain_text(g: dict | None, compact: bool) -> Text:
    if not g or g.get("delta") is None:
        return Text("" if compact else "", style="dim")
    style = "dim"
    if g.get("significant") and g.get("better") is not None:
        style = "green" if g["better"] else "red"
    return Text(f"Δ{g['delta']:+.3g}", style=style)


def _cell(c: dict | None, g: dict | None, compact: bool, unit: bool = False) -> Text:
    if not c:
        return Text("—", style="dim")
    iv = ""
    if c.get("lo") is not None and c.get("hi") is not None:
        iv = f"[{_f(c['lo'], 3)}, {_f(c['hi'], 3)}]"
    t = Text(_f(c.get("value")) + (f" {c['unit']}" if unit and c.get("unit") else ""))
    if iv:
        t.append(("\n" if compact else " ") + iv, style="dim")
    gain = _gain_text(g, compact)
    if gain.plain:
        t.append("\n" if compact else " ")
        t.append(gain)
    return t


def render_table(cmp, compact: bool) -> Table:
    arrows = {"max": " ↑", "min": " ↓", "none": ""}
    table = Table(
        show_lines=compact,
        caption=Text(
            "[lo, hi]: 95% interval; Δ: gain over the parent (same protocol only; ≠ marks a parent "
            "measured under another protocol), green / red when its interval clears the parent's "
            "in the metric's direction (↑ max, ↓ min)"
        ),
        caption_justify="left",
    )
    for col in ("node", "status", "protocol", "parent"):
        table.add_column(col, overflow="fold", no_wrap=not compact)
    units: dict[str, set] = {}
    for r in cmp.rows:
        for m, c in r["metrics"].items():
            units.setdefault(m, set()).add(c.get("unit"))
    mixed = {m for m, us in units.items() if len(us) > 1}  # each cell then names its unit
    for m in cmp.metrics:
        head = f"{m}{arrows[cmp.directions[m]]}" + (" ▼" if cmp.sort == m else "")
        unit = "units differ" if m in mixed else next(iter(units.get(m) or {None}))
        if unit not in (None, "fraction", "value"):
            head += f" ({unit})"
        table.add_column(head, justify="right", no_wrap=not compact)
    for r in cmp.rows:
        cells = [
            Text(r["node"], style="bold"),
            Text(
                r["status"]
                if r["result"] in (None, r["status"])
                else f"{r['result']} (node: {r['status']})",  # this protocol's result first
                style="red" if r["result"] == "failed" else "",
            ),
            Text(r["protocol_key"] or "—"),
            Text((r["parent"] or "—") + ("" if r["parent_same_protocol"] is not False else " ≠")),
        ]
        cells += [
            _cell(r["metrics"].get(m), r["gain"].get(m), compact, m in mixed) for m in cmp.metrics
        ]
        table.add_row(*cells)
    return table


def compare(
    nodes: list[str] | None = typer.Argument(
        None, help="Nodes to compare (default: every evaluated node)."
    ),
    sort: str | None = typer.Option(
        None, "--sort", help="Order by this metric, best first in its direction."
    ),
    status: list[str] | None = typer.Option(
        None,
        "--status",
        help="Keep nodes with this status (repeatable; 'all' for any). Default: evaluated.",
    ),
    protocol: str | None = typer.Option(
        None,
        "--protocol",
        help="Results under this protocol: an id (proxy/smoke), ID@HASH, a family (proxy) or 'all' "
        "(one row per node and protocol). Default: the experiment's protocol.",
    ),
    metrics: str | None = typer.Option(
        None, "--metrics", help="Metric columns to keep: globs, comma-separated ('hard/*')."
    ),
    as_json: bool = typer.Option(False, "--json", help="Every column as JSON."),
    as_csv: bool = typer.Option(False, "--csv", help="Every column as CSV."),
    no_pager: bool = typer.Option(False, "--no-pager", help="Do not page long output."),
    archive: Path = ArchiveOpt,
) -> None:
    """Compare nodes: Overall and every split metric with its 95% interval, the protocol, the parent
    and the gain over it.

    On a terminal the table pages like git when it is taller or wider than the screen ($POISE_PAGER,
    $PAGER, less); piped, it is written whole, one line per node."""
    from engine.report.compare import compare as build  # lazy: keeps `poise-git --help` fast
    from engine.report.compare import (  # lazy: keeps `poise-git --help` fast
        compared_protocol,
        compared_protocol_id,
        to_csv_rows,
    )

    # lazy: numpy is heavy (only this path needs it)
    from engine.report.html import report_experiment

    if as_json and as_csv:
        raise typer.BadParameter("choose one of --json and --csv")

    arch = Archive(archive)
    all_nodes = arch.nodes()
    configured = configured_protocol(arch.config())
    cmp = build(
        all_nodes,
        report_experiment(arch),
        nodes or None,
        configured=configured,
        statuses=status or None,
        protocol=protocol,
        metrics=metrics,
        sort=sort,
    )
    if as_json:
        typer.echo(json.dumps(cmp.to_dict(), indent=2))
        return
    if as_csv:
        header, rows = to_csv_rows(cmp)
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
        return
    if not cmp.rows:
        console.print("no nodes to compare (see --status, --protocol)")
        # the protocols with results that the compared one (the experiment's or --protocol's)
        # leaves out, and the --protocol that shows them
        elsewhere = protocols_with_results(
            all_nodes, besides=compared_protocol(protocol, configured)
        )
        if elsewhere:
            console.print(
                f"results under {describe_elsewhere(elsewhere, compared_protocol_id(protocol, configured))}; "
                f"pass --protocol {next(iter(elsewhere))} or --protocol all",
                markup=False,
                highlight=False,
            )
        return
    from engine.cli.pager import show  # lazy: keeps `poise-git --help` fast

    show(render_table(cmp, compact=console.is_terminal), no_pager=no_pager)


def register(app: typer.Typer) -> None:
    app.command()(compare)
