"""Rendering of ``poise-git train|evaluate NODE --backend verl --smoke`` (shared by both verbs)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from engine.archive.store import Archive
from engine.cli import console, plain, shell_arg
from engine.errors import PoiseError
from engine.operators.train_verl import require_verl, train_smoke
from engine.operators.verify import refuse_unverified
from engine.operators.verl_smoke_result import check_objective, evaluate_checkpoint, record_smoke
from trainer_template.loader import AlgorithmLoadError
from trainer_template.verl_backend.smoke import SmokeProtocol

SUMMARY = (
    "train/reward_mean",
    "train/adv_mean",
    "train/adv_std",
    "train/entropy",
    "train/pg_loss",
    "train/grad_norm",
    "train/step_s",
)


def _open_or_init(path: Path):
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        arch = Archive.init(path)
        console.print(
            f"initialized archive [bold]{plain(arch.path)}[/] with root node [bold]grpo[/]"
        )
        return arch
    return Archive(path)


def _steps_table(steps: list[dict]) -> Table:
    table = Table(title="verl steps (the proxy's signal names)", show_lines=False)
    table.add_column("step", justify="right")
    for key in SUMMARY:
        table.add_column(key.split("/", 1)[1], justify="right")
    for row in steps:
        m = row.get("metrics", {})
        table.add_row(str(row.get("step")), *[f"{m[k]:.4g}" if k in m else "—" for k in SUMMARY])
    return table


def run_smoke(
    archive: Path,
    node: str,
    *,
    steps: int,
    timeout_s: float,
    seed: int = 0,
    hparams: Mapping[str, Any] | None = None,
    extra: Sequence[str] = (),
    evaluate: bool = False,
    limit: int = 2,
) -> None:
    """Train (and with ``evaluate`` score) ``node`` under the verl-smoke protocol, printing progress."""
    require_verl()
    arch = _open_or_init(archive)
    arch.node(node)  # unknown node: one clear error before anything starts
    refuse_unverified(arch, node, "evaluate" if evaluate else "train", unsandboxed=True)
    check_objective(arch)
    try:
        proto = SmokeProtocol(steps=steps, seed=seed)
    except ValueError as exc:
        raise PoiseError(str(exc)) from None
    with console.status(f"[bold]{node}[/]: verl smoke starting ...") as status:

        def on_event(msg: str) -> None:
            console.print(f"  {escape(msg)}", highlight=False)
            status.update(f"[bold]{node}[/]: {escape(msg)}")

        try:
            run = train_smoke(
                arch,
                node,
                proto=proto,
                hparams=hparams,
                extra=extra,
                timeout_s=timeout_s,
                on_event=on_event,
                ray_address=os.environ.get("RAY_ADDRESS") or None,  # a running Ray to join
            )
        except AlgorithmLoadError as exc:  # a bad --hparam or a broken algorithm.py
            raise PoiseError(str(exc)) from None
        evaluation = None
        if run.ok and evaluate:
            on_event(f"scoring the checkpoint on math6 ({limit} problems per benchmark)")
            evaluation = evaluate_checkpoint(run.checkpoint, limit=limit, seed=seed)
        result = record_smoke(arch, run, evaluation=evaluation)
    if run.steps:
        console.print(_steps_table(run.steps))
    times = run.step_times
    if run.ok:
        console.print(
            f"[bold green]{node}[/]: {len(run.steps)} verl steps in {run.wall_time_s:.0f} s "
            f"(last step {times[-1]:.1f} s); checkpoint [bold]{plain(run.checkpoint)}[/]"
        )
        if evaluation is not None:
            m = evaluation["metrics"]
            console.print(
                f"math6 smoke ({limit}/benchmark): overall {m.get('overall', float('nan')):.3g} pp, "
                f"valid rate {m.get('valid_rate', float('nan')):.3g} (a tiny random model: the "
                "numbers are meaningless, the pipeline is not)"
            )
        console.print(
            f"recorded [bold]{result.protocol.key}[/] on {node} (a pipeline check, never ranked "
            f"against proxy or paper results); MLflow run {run.run_id}: `poise-git ui -C {shell_arg(arch.path)}`"
        )
    else:
        console.print(f"[red]{node}: verl smoke failed:[/] {escape(run.reason)}", highlight=False)
        console.print(f"log: {plain(run.log)}; recorded as a failed {result.protocol.key} result")
        raise typer.Exit(2)
