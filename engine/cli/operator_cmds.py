"""Operator verbs: propose, verify, reflect (the agent half of the loop)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import typer
from rich.markdown import Markdown
from rich.markup import escape
from rich.table import Table

from engine.archive.store import Archive
from engine.cli import EXIT_REJECTED, ArchiveOpt, console, err_console
from engine.untrusted import visible

ProposerOpt = typer.Option(
    None,
    "--proposer",
    help="offline (no API key) | llm (default: \\[propose].proposer in poise.toml).",
)
ReplayOpt = typer.Option(
    False,
    "--replay",
    help="Answer every LLM call from the archive's records (refs/poise-llm/*); no endpoint needed.",
)


def proposal_labels(kept: list, dropped: list) -> dict[int, str]:
    """Each proposal's label in ``propose``'s output, by ``id``: its name, and where another
    proposal of the call has the same name (two draws of one component's hyperparameters), its
    hyperparameters too, so that the kept one and the dropped one are told apart."""
    every = [*kept, *dropped]
    counts = Counter(prop.name for prop in every)
    labels = {}
    for prop in every:
        label = prop.name
        if counts[prop.name] > 1 and prop.hyperparameters:
            values = ", ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in sorted(prop.hyperparameters.items())
            )
            label = f"{prop.name} ({values})"
        labels[id(prop)] = label
    return labels


def make_llm(arch, cfg, proposer: str | None, replay: bool):
    """An LLM client when the llm proposer is in use, else None."""
    if (proposer or cfg.propose.proposer) != "llm":
        return None
    from engine.operators.llm import make_client  # lazy: keeps `poise-git --help` fast

    return make_client(cfg, arch, replay=replay)


def print_usage(llm) -> None:
    if llm is not None and llm.usage.calls:
        u = llm.usage.as_dict()
        console.print(
            f"[dim]LLM: {u['calls']} calls ({u['replayed']} replayed), {u['prompt_tokens']} prompt + "
            f"{u['completion_tokens']} completion tokens, ${u['cost_usd']:.4f}[/]"
        )


def propose(
    parent: str = typer.Argument(..., help="The parent node to propose children of."),
    n: int | None = typer.Option(
        None, "--n", help="How many screened proposals to return (default: \\[propose].population)."
    ),
    proposer: str | None = ProposerOpt,
    replay: bool = ReplayOpt,
    seed: int | None = typer.Option(
        None, "--seed", help="Seed of the proposer's sampling (default: from the archive size)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Machine-readable output (kept and dropped proposals)."
    ),
    archive: Path = ArchiveOpt,
) -> None:
    """Propose N candidate mechanisms for PARENT, screened for consistency, feasibility, novelty and expected gain.

    Exit code 3 when no proposal survives screening."""
    from engine.operators.propose import propose_all  # lazy: keeps `poise-git --help` fast

    arch = Archive(archive)
    cfg = arch.config()
    llm = make_llm(arch, cfg, proposer, replay)
    with console.status(f"proposing children of {parent}…"):
        kept, dropped = propose_all(arch, parent, cfg, n, proposer, seed, llm=llm, replay=replay)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "kept": [p.to_record() for p in kept],
                    "dropped": [p.to_record() for p in dropped],
                },
                indent=1,
            )
        )
        return
    labels = proposal_labels(kept, dropped)
    table = Table(title=f"proposals for {parent}")
    for col in ("#", "name", "score", "novelty", "gain", "mechanism"):
        table.add_column(col, overflow="fold")
    for i, p in enumerate(kept, 1):
        nov = p.screening.get("novelty")
        table.add_row(
            str(i),
            escape(labels[id(p)]),
            f"{p.score:.3f}",
            "—" if nov is None else f"{nov:.3g}",
            f"{p.expected_gain:.2f}",
            escape(p.mechanism[:160]),  # the proposer's text, not markup
        )
    console.print(table)
    for p in dropped:
        console.print(
            f"[dim]dropped {escape(labels[id(p)])}: "
            f"{escape(p.screening.get('reason', 'ranked below the top N'))}[/]"
        )
    print_usage(llm)
    if not kept:
        err_console.print("[red]no proposal survived screening[/]")
        raise typer.Exit(EXIT_REJECTED)


def verify(
    node: str = typer.Argument(..., help="The node to verify."),
    archive: Path = ArchiveOpt,
) -> None:
    """Static checks + the generated test suite (sandboxed); records verification.json and tests/.

    Exit code 3 when the node is rejected."""
    from engine.operators.verify import verify_node  # lazy: keeps `poise-git --help` fast

    arch = Archive(archive)
    with console.status(f"verifying {node}…"):
        res = verify_node(arch, node, arch.config())
    report_verification(node, res)


def report_verification(node: str, res, seconds: float | None = None) -> None:
    """The verdict in one line (``seconds``: the verification's time, said where given)."""
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    if res.ok:
        console.print(
            f"[bold]{node}[/] [cyan]verified[/]{took} ({res.report.get('passed', 0)} tests passed)"
        )
        return
    console.print(f"[bold]{node}[/] [red]rejected[/]{took}: {escape(res.reason)}")
    raise typer.Exit(EXIT_REJECTED)


def reflect(
    node: str = typer.Argument(..., help="The evaluated node to reflect on."),
    use_llm: bool | None = typer.Option(
        None,
        "--llm/--no-llm",
        help="Add an LLM narrative (default: when \\[propose].proposer is llm and a key or base URL is set).",
    ),
    replay: bool = ReplayOpt,
    archive: Path = ArchiveOpt,
) -> None:
    """Diagnose NODE against its parent (entropy, KL, plateau, length, validity, metric intervals);
    commit REFLECTION.md."""
    from engine.operators.reflect import reflect_node  # lazy: keeps `poise-git --help` fast

    arch = Archive(archive)
    cfg = arch.config()
    if use_llm is None:
        use_llm = cfg.propose.proposer == "llm" and (
            replay
            or bool(
                os.environ.get(cfg.llm.api_key_env)
                or cfg.llm.base_url
                or os.environ.get("OPENAI_BASE_URL")
            )
        )
    llm = make_llm(arch, cfg, "llm", replay) if use_llm else None
    text = reflect_node(arch, node, cfg, llm=llm)
    if console.is_terminal:
        console.print(Markdown(text))
    else:  # piped: the Markdown itself, unwrapped
        typer.echo(visible(text.rstrip("\n")))
    print_usage(llm)


def register(app: typer.Typer) -> None:
    for fn in (propose, verify, reflect):
        app.command()(fn)
