"""``poise-git evaluate``: the standardized protocol on a node (CPU proxy, or the math6 suite)."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.markup import escape

from engine.archive.store import Archive
from engine.cli import EXIT_FAILED, ArchiveOpt, console
from engine.errors import PoiseError


def evaluate(
    node: str = typer.Argument(
        ..., help="The node to evaluate (its algorithm.py is read from its commit)."
    ),
    backend: str | None = typer.Option(
        None,
        "--backend",
        help="The trainer: proxy (embedded CPU RL proxy, the default) | verl (GPU scale; --smoke on "
        "the CPU).",
    ),
    generator: str | None = typer.Option(
        None,
        "--generator",
        help="With --suite: what samples the answers, vllm | openai | transformers.",
    ),
    seeds: int | None = typer.Option(
        None, "--seeds", help="Paired seeds, run as parallel processes (default: poise.toml)."
    ),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help="Protocol preset: default | large (a GPU when torch sees one) | smoke | tiny (default: "
        "poise.toml); with --suite: paper (default) | "
        "smoke (2 samples, 24 tokens: a CPU smoke run, not comparable).",
    ),
    suite: str | None = typer.Option(
        None, "--suite", help="Score a trained model on a benchmark suite instead (math6)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="With --suite: the model path / served model name."
    ),
    base_url: str | None = typer.Option(
        None, "--base-url", help="With --suite --generator openai: the server's URL."
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
    eval_timeout: float | None = typer.Option(
        None,
        "--eval-timeout",
        help="Hard wall-clock limit of one evaluation, seconds (default: \\[evaluation].timeout_s; "
        "with --smoke: 1800).",
    ),
    archive: Path = ArchiveOpt,
) -> None:
    """Evaluate a node under one standardized protocol and record its result on its branch.

    Exit code 4 when the candidate fails (raises, NaN/inf, collapse); the reason is recorded."""
    if eval_timeout is not None:
        if suite is not None:
            raise PoiseError("--eval-timeout applies to training a node, not to --suite")
        if not 0 < eval_timeout < math.inf:  # as `run`'s (engine.loop.plan); 0 reads as "not given"
            raise PoiseError(f"--eval-timeout must be > 0 and finite, got {eval_timeout}")
    if smoke:
        if backend != "verl" or suite is not None:
            raise typer.BadParameter(
                "--smoke goes with --backend verl (and no --suite); the GPU protocol is "
                "`poise-git train NODE --backend verl`"
            )
        from engine.cli.verl_smoke import run_smoke  # lazy: keeps `poise-git --help` fast

        run_smoke(
            archive,
            node,
            steps=2,
            timeout_s=eval_timeout or 1800.0,
            evaluate=True,
            limit=limit or 2,
        )
        return
    arch = Archive(archive)
    if suite:
        # lazy: keeps `poise-git --help` fast
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        # lazy: keeps `poise-git --help` fast
        from engine.operators.evaluate_suite import evaluate_node_on_suite

        # lazy: keeps `poise-git --help` fast
        from evaluators.generation import BACKENDS as GENERATORS

        if backend in GENERATORS:
            raise PoiseError(
                f"--backend names the trainer (proxy | verl); the suite's generator is "
                f"--generator {backend}"
            )
        if backend is not None:
            raise PoiseError("--suite scores a trained --model; --backend does not apply to it")
        if generator is None:
            raise PoiseError("--suite needs --generator vllm | openai | transformers")
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
                generator=generator,
                model=model,
                base_url=base_url,
                limit=limit,
                preset=preset,
                on_progress=on_progress,
                on_event=lambda msg: console.print(f"  {escape(msg)}", highlight=False),
            )
        if result.details.get("mlflow_error"):  # recorded in git all the same: said, as the proxy's
            console.print(
                f"  MLflow logging skipped: {escape(str(result.details['mlflow_error']))}",
                highlight=False,
            )
    else:
        from engine.operators.evaluate import evaluate_node  # lazy: keeps `poise-git --help` fast

        if generator is not None:
            raise PoiseError("--generator applies with --suite only")
        backend = backend or "proxy"

        with console.status(f"evaluating [bold]{node}[/] on the {backend} backend ...") as status:

            def on_event(msg: str) -> None:
                console.print(f"  {escape(msg)}", highlight=False)
                status.update(f"evaluating [bold]{node}[/]: {escape(msg)}")

            result = evaluate_node(
                arch,
                node,
                backend=backend,
                seeds=seeds,
                preset=preset,
                timeout_s=eval_timeout,
                on_event=on_event,
            )
    if result.ok:
        console.print(f"[bold]{node}[/] evaluated  {result.describe()}", highlight=False)
    else:
        console.print(
            f"[bold]{node}[/] [red]failed[/] under {result.protocol.key}", highlight=False
        )
        console.print(f"[red]reason:[/] {escape(result.reason)}", highlight=False)
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    app.command()(evaluate)
