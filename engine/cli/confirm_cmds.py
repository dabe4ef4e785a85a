"""``poise-git confirm``: re-measure a node against the root on seeds the search never saw."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.markup import escape

from engine.archive.confirmation import CONFIRMED, FAILED, NOT_CONFIRMED, REVERSED
from engine.archive.store import Archive
from engine.cli import EXIT_FAILED, ArchiveOpt, console
from engine.cli.ablate import ablate
from engine.stats import SEEDS_LIMIT, sd_upper90, seeds_to_resolve, t95

VERDICT_COLOURS = {CONFIRMED: "green", REVERSED: "red", FAILED: "red"}
"""The colour of a confirmation's verdict wherever the CLI prints it; a verdict not here takes the
caller's default."""


def resolve_hint(mean: float, iv: tuple[float, float], n: int) -> str:
    """For a positive paired difference whose 95% interval over ``n`` seeds holds zero: how many
    paired seeds would show a real difference of that size in 4 evaluations of 5, at the SD these
    seeds show and at that SD's one-sided 90% upper bound (a few seeds' SD is rough)."""
    sd = (iv[1] - iv[0]) / 2 * math.sqrt(n) / t95(n - 1)  # the SD these seeds show
    high = sd_upper90(sd, n)

    def seeds(at: float) -> str:
        need = seeds_to_resolve(mean, at)
        return f"{need}" if need else f"over {SEEDS_LIMIT:,}"

    return (
        f"were {mean:+.4f} real, {seeds(sd)} paired seeds would show it in 4 evaluations "
        f"of 5 at the paired SD these {n} show ({sd:.4f}), {seeds(high)} at that SD's 90% "
        f"upper bound ({high:.4f})"
    )


def confirmation_line(conf) -> str:
    """The closing line of a confirmation, as ``run`` and ``confirm`` print it: green when confirmed,
    red when the held-out seeds reverse the difference or a node failed there; a positive difference
    the held-out seeds do not resolve is told how many seeds would (:func:`resolve_hint`)."""
    colour = VERDICT_COLOURS.get(conf.verdict)
    head = "held-out confirmation:"
    line = f"[bold {colour}]{head}[/]" if colour else f"[bold]{head}[/]"
    line += f" {escape(conf.describe(with_protocol=True))}"  # names, a reason: text, not markup
    if conf.verdict == NOT_CONFIRMED and conf.difference > 0:
        line += "; " + resolve_hint(conf.difference, conf.interval, len(conf.seeds))
    return line


def run_confirmation(arch, node: str, against: str, seeds: int, first_seed, preset, objective):
    """Measure, record and return the confirmation, with a spinner and one line per seed."""
    # lazy: keeps `poise-git --help` fast
    from engine.operators.confirm import confirm_node

    # lazy: numpy is heavy (only this path needs it)
    from engine.report.html import report_experiment

    # lazy: numpy is heavy (only this path needs it)
    from engine.select.objective import with_objective

    exp = report_experiment(arch)
    if objective:
        exp = with_objective(exp, objective)
    with console.status(f"confirming [bold]{node}[/] against [bold]{against}[/] ...") as status:

        def on_event(msg: str) -> None:
            console.print(f"  {escape(msg)}", highlight=False)
            status.update(f"confirming [bold]{node}[/]: {escape(msg)}")

        return confirm_node(
            arch,
            node,
            against,
            exp,
            seeds=seeds,
            first_seed=first_seed,
            preset=preset,
            on_event=on_event,
        )


def confirm(
    node: str = typer.Argument(
        ..., help="The node whose comparison to confirm (e.g. a run's best)."
    ),
    against: str | None = typer.Option(
        None, "--against", help="The node it is compared with (default: the root)."
    ),
    seeds: int = typer.Option(
        2, "--seeds", "-s", min=1, help="Held-out paired seeds to measure both nodes at."
    ),
    first_seed: int | None = typer.Option(
        None,
        "--first-seed",
        min=0,
        help="The first held-out seed (default: one past the largest seed the search used under "
        "the protocol); seeds the search used are refused.",
    ),
    preset: str | None = typer.Option(
        None, "--preset", help="Proxy protocol preset (default: poise.toml's)."
    ),
    objective: str | None = typer.Option(
        None,
        "--objective",
        help="Override the objective (default: the last run's, else poise.toml's).",
    ),
    archive: Path = ArchiveOpt,
) -> None:
    """Confirm NODE against the root on held-out seeds, and record it on NODE's branch.

    The search picks its best node on the seeds it evaluated every node at, so the difference it reads
    there leans optimistic. This trains and scores both nodes again, as an evaluation does, at seeds
    the search never used under the protocol, and records the paired difference there as
    confirmations/<protocol>.json; the selection never reads it. Exit code 4 when a node fails at a
    held-out seed."""
    arch = Archive(archive)
    conf = run_confirmation(
        arch, node, against or arch.root(), seeds, first_seed, preset, objective
    )
    console.print(confirmation_line(conf), highlight=False)
    if conf.verdict == FAILED:
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    app.command()(confirm)
    app.command()(ablate)
