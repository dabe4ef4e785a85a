"""``poise-git select`` and ``poise-git retrospect``: parent selection and its retrospective check."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from engine.archive.store import Archive
from engine.cli import ArchiveOpt, console


def _f(v: float | None, nd: int = 3) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def _status_cell(row: dict) -> str:
    """The node's status, and for one that cannot be a parent why not, the status said once:
    ``failed (evidence, not a parent)``, not ``failed (failed: evidence, not a parent)``."""
    status, why = row["status"], row["why"]
    if row["eligible"] or not why:
        return status
    if why.startswith(f"{status}: "):
        why = why[len(status) + 2 :]
    return f"{status} [dim]({escape(why)})[/]"


def _last_run_hint(arch: Archive, ranked: str) -> str:
    """A pointer at the last run's protocol when it is not the one ``select`` ranked under (a run
    with ``--preset`` or ``--backend`` ranked its parents under its own), else ``""``."""
    from engine.loop.state import RunStateError  # lazy: imported with the report's modules below
    from engine.report.html import report_protocol  # lazy: numpy is heavy (only this path needs it)

    try:
        last = report_protocol(arch)
    except RunStateError:  # an unreadable run record names no protocol; the ranking stands
        return ""
    if last.key == ranked or (last.id == ranked.partition("@")[0] and not last.hash):
        return ""
    return (
        f"the last run ranked its parents under {last.key}, not {ranked}: "
        f"--protocol {last.id} shows that ranking"
    )


def select(
    k: int | None = typer.Option(
        None, "--k", help="Parents to pick (default: \\[select].k in poise.toml)."
    ),
    seed: int | None = typer.Option(
        None, "--seed", help="Seed of tie-breaks and GP subsampling (default: \\[select].seed)."
    ),
    explain: bool = typer.Option(
        False, "--explain", help="Also list nodes that cannot be parents, with the reason."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Machine-readable output: {chosen, rows, params}."
    ),
    protocol: str | None = typer.Option(
        None,
        "--protocol",
        help="Rank results under this protocol id (default: the experiment's, e.g. proxy/default); "
        "results under other protocols are never ranked together.",
    ),
    archive: Path = ArchiveOpt,
) -> None:
    """Score every node with s(d) = w_pareto*U_pareto + w_perf*U_perf + w_div*U_div + w_bayes*alpha_GP
    and pick the next parents (greedy, diversity-aware, without replacement).

    Columns: U = the node's utility (higher is better; unit under the table); layer = its Pareto
    layer (0 = the front); pareto, perf, div = U_pareto, U_perf (U min-max scaled over the ranked
    nodes), U_div, each in [0, 1]; gp_ucb = alpha_GP: the descendant gain where observed, else the
    GP's mean + kappa*std (it enters the score as clip((gp_ucb+1)/2, 0, 1)); desc. gain = the
    discounted top-K descendant gain y_d in [-1, 1] (— without an evaluated descendant); score = s(d),
    at most the sum of the weights. See docs/selection.md."""
    from engine.select import select_parents  # lazy: numpy is heavy (only this path needs it)

    arch = Archive(archive)
    sel = select_parents(arch, None, k=k, seed=seed, protocol=protocol)
    if as_json:
        typer.echo(json.dumps(sel.to_dict(), indent=2))
        return
    table = Table(title="parent selection  s(d)", show_lines=False)
    for col in (
        "rank",
        "node",
        "status",
        "U",
        "layer",
        "pareto",
        "perf",
        "div",
        "gp_ucb",
        "desc. gain",
        "score",
    ):
        table.add_column(
            col,
            justify="left" if col in ("node", "status") else "right",
            overflow="fold",
            min_width=len(col) if col != "status" else 9,
        )
    for r in sel.rows:
        if not r["eligible"] and not explain and r["rank"] is None:
            continue
        table.add_row(
            str(r["rank"] or ""),
            r["node"],
            _status_cell(r),
            _f(r["utility"], 4),
            "" if r["layer"] is None else str(r["layer"]),
            _f(r["pareto"]),
            _f(r["perf"]),
            _f(r["div"]),
            _f(r["gp_ucb"]),
            _f(r["descendant_gain"]),
            _f(r["score"]),
            style="bold green" if r["rank"] else None,
        )
    console.print(table)
    p = sel.params
    w = p["weights"]
    console.print(
        f"chosen: [bold]{', '.join(sel.chosen)}[/]  (results under {sel.params['protocol']})"
    )
    console.print(
        f"params: top_k={p['top_k']} gamma={p['gamma']} beta={p['beta']} kappa={p['kappa']} seed={p['seed']} "
        f"weights pareto={w['pareto']} perf={w['perf']} div={w['div']} bayes={w['bayes']}",
        highlight=False,
    )
    if "objectives" in p:
        dirs = p.get("directions") or [
            {"metric": o.lstrip("-"), "direction": "min" if o.startswith("-") else "max"}
            for o in p["objectives"]
        ]
        console.print(
            "objectives: "
            + ", ".join(f"{d['metric']} ({d['direction']})" for d in dirs)
            + f"   utility: {p['utility']}"
            + (f" ({p['unit']})" if p.get("unit") else "")
            + f"   mechanism: {p.get('mechanism', '—')}",
            highlight=False,
            markup=False,
        )
        if explain:
            for d in dirs:
                arrow = "higher is better" if d["direction"] == "max" else "lower is better"
                console.print(
                    f"  {d['metric']}: {d['direction']} ({arrow}; from {d.get('why', 'sign')})",
                    highlight=False,
                    markup=False,
                )
    if "gp" in p:
        console.print(
            f"GP: fitted on {p['gp']['train']} of {p['gp']['observed']} nodes with observed descendant gain",
            highlight=False,
        )
    if "fallback" in p:
        console.print(f"[yellow]{p['fallback']}[/]")
    if protocol is None:
        hint = _last_run_hint(arch, sel.params["protocol"])
        if hint:
            console.print(hint, style="dim", markup=False, highlight=False)
    if explain:
        console.print(
            "[dim]score = w_pareto*pareto + w_perf*perf + w_div*div + w_bayes*clip((gp_ucb+1)/2); "
            "gp_ucb = descendant gain where observed, else GP mean + kappa*std[/]"
        )


def retrospect(
    as_json: bool = typer.Option(
        False, "--json", help="Machine-readable output: {rounds, summary, assumptions}."
    ),
    protocol: str | None = typer.Option(
        None,
        "--protocol",
        help="Read utilities under this protocol id (default: the one the last run ranked under, "
        "else the experiment's).",
    ),
    archive: Path = ArchiveOpt,
) -> None:
    """Retrospective parent retention: per round, did the top-ranked selected parent produce the
    strongest descendant; gains parent -> best descendant; selected parents below the root that later
    led above it."""
    # lazy: numpy is heavy (only this path needs it)
    from engine.report.html import report_experiment, report_protocol
    from engine.select import retrospect as run  # lazy: numpy is heavy (only this path needs it)

    arch = Archive(archive)
    # the selection trailers were written under the run's protocol and objective (its --preset and
    # --objective may override poise.toml's), as the report reads them
    cfg = dataclasses.replace(arch.config(), experiment=report_experiment(arch))
    rep = run(arch, cfg, protocol or report_protocol(arch))
    if as_json:
        typer.echo(json.dumps(rep, indent=2))
        return
    s = rep["summary"]
    table = Table(title=f"parent retention by round (U: {s['utility']}, under {s['protocol']})")
    for col in ("round", "parent", "rank", "score", "U", "best descendant", "U best", "gain", ""):
        table.add_column(
            col,
            justify="left" if col in ("parent", "best descendant", "") else "right",
            overflow="fold",
        )
    for r in rep["rounds"]:
        for i, e in enumerate(r["parents"]):
            mark = ""
            if e["parent"] == r["best_parent"]:
                # hit is None when the round had a single parent: nothing was ranked against it
                mark = "[yellow]best (not top)[/]" if r["hit"] is False else "[green]best[/]"
            table.add_row(
                str(r["round"]) if i == 0 else "",
                e["parent"],
                str(e["rank"] or "—"),
                _f(e["score"]),
                _f(e["utility"], 4),
                e["best_descendant"] or "—",
                _f(e["best_utility"], 4),
                _f(e["gain"], 4),
                mark,
            )
    console.print(table)
    console.print(
        f"top-ranked parent produced the best descendant in {s['top_parent_best']} of {s['rounds_judged']} rounds "
        f"(not in {s['top_parent_not_best']})",
        highlight=False,
    )
    console.print(
        f"selected parents below the root ({s['root']}, U={_f(s['root_utility'], 4)}): {s['selected_below_root']}, "
        f"of which {s['below_root_led_above']} later led above it",
        highlight=False,
    )
    for e in s["below_root_led_above_list"]:
        console.print(
            f"  round {e['round']}: {e['parent']} ({_f(e['utility'], 4)}) -> "
            f"{e['best_descendant']} ({_f(e['best_utility'], 4)})",
            highlight=False,
        )
    console.print(
        f"gain parent -> best descendant: mean {_f(s['mean_gain'], 4)}, max {_f(s['max_gain'], 4)}",
        highlight=False,
    )
    for a in rep["assumptions"]:
        console.print(f"[yellow]assumed:[/] {a}")


def register(app: typer.Typer) -> None:
    app.command()(select)
    app.command()(retrospect)
