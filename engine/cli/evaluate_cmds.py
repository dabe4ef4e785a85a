"""``poise-git evaluate``: the standardized protocol on a node (CPU proxy, or the math6 suite)."""

from __future__ import annotations

from pathlib import Path

import typer

from engine.cli import EXIT_FAILED, ArchiveOpt, console


def evaluate(
    node: str = typer.Argument(
        ..., help="The node to evaluate (its algorithm.py is read from its commit)."
    ),
    backend: str = typer.Option(
        "proxy",
        "--backend",
        help="proxy (embedded CPU RL proxy); verl (GPU; --smoke on the CPU); with --suite: vllm | "
        "openai | transformers.",
    ),
    seeds: int | None = typer.Option(
        None, "--seeds", help="Paired seeds, run as parallel processes (default: poise.toml)."
    ),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help="Protocol preset: default | smoke (default: poise.toml); with --suite: paper (default) | "
        "smoke (2 samples, 24 tokens: a CPU smoke run, not comparable).",
    ),
    suite: str | None = typer.Option(
        None, "--suite", help="Score a trained model on a benchmark suite instead (math6)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="With --suite: the model path / served model name."
    ),
    base_url: str | None = typer.Option(
        None, "--base-url", help="With --suite --backend openai: the server's URL."
    ),
    limit: int | None = typer.Option(
        None,
        "--limit",
        help="With --suite: at most this many problems per benchmark (a smoke run); with "
        "--backend verl --smoke: problems per benchmark scored after training (default 2).",
    ),
    smoke: bool = typer.Option(
        False,
        "--smoke",
        help="With --backend verl: train a few real verl steps of a tiny model on the CPU, then score "
        "the checkpoint on the six benchmarks (transformers); records a verl-smoke result.",
    ),
    archive: Path = ArchiveOpt,
) -> None:
    """Evaluate a node under one standardized protocol and record its result on its branch.

    Exit code 4 when the candidate fails (raises, NaN/inf, collapse); the reason is recorded."""
    from engine.archive.store import Archive

    if smoke:
        if backend != "verl" or suite is not None:
            raise typer.BadParameter(
                "--smoke goes with --backend verl (and no --suite); the GPU protocol is "
                "`poise-git train NODE --backend verl`"
            )
        from engine.cli.verl_smoke import run_smoke

        run_smoke(archive, node, steps=2, timeout_s=1800.0, evaluate=True, limit=limit or 2)
        return
    arch = Archive(archive)
    if suite:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        from engine.operators.evaluate_suite import evaluate_node_on_suite

        if not model:
            raise typer.BadParameter("--suite needs --model")
        cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        with Progress(*cols, console=console, transient=True) as bar:
            tasks: dict[str, int] = {}

            def on_progress(stage: str, advance: int, total: int) -> None:
                if stage not in tasks:
                    tasks[stage] = bar.add_task(stage, total=total)
                bar.advance(tasks[stage], advance)

            result = evaluate_node_on_suite(
                arch,
                node,
                suite=suite,
                backend=backend,
                model=model,
                base_url=base_url,
                limit=limit,
                preset=preset,
                on_progress=on_progress,
            )
    else:
        from engine.operators.evaluate import evaluate_node

        with console.status(f"evaluating [bold]{node}[/] on the {backend} backend ...") as status:

            def on_event(msg: str) -> None:
                console.print(f"  {msg}", highlight=False)
                status.update(f"evaluating [bold]{node}[/]: {msg}")

            result = evaluate_node(
                arch, node, backend=backend, seeds=seeds, preset=preset, on_event=on_event
            )
    if result.ok:
        console.print(f"[bold]{node}[/] evaluated  {result.describe()}", highlight=False)
    else:
        console.print(
            f"[bold]{node}[/] [red]failed[/] under {result.protocol.key}", highlight=False
        )
        console.print(f"[red]reason:[/] {result.reason}", highlight=False)
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    app.command()(evaluate)
