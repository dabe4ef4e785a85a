"""``poise-git train``: train a node with verl, under the paper's protocol on GPUs or as the CPU smoke
(``--smoke``: a few real verl steps of a tiny model, the ``verl-smoke`` protocol)."""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
from pathlib import Path

import typer

from engine.archive.store import Archive
from engine.cli import ArchiveOpt, console
from engine.errors import ConfigError, PoiseError


def _parse_hparams(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--hparam expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def train(
    node: str = typer.Argument(
        ..., help="The node to train (its algorithm.py is read from its commit)."
    ),
    backend: str = typer.Option(
        "verl",
        "--backend",
        help="Training backend: verl (GPU; `poise-git evaluate` runs the CPU proxy).",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the environment and the verl command; write and run nothing.",
    ),
    model: str = typer.Option(
        "Qwen/Qwen2.5-Math-1.5B", "--model", help="Policy model path or hub id."
    ),
    gpus: int = typer.Option(8, "--gpus", min=1, help="GPUs per node (trainer.n_gpus_per_node)."),
    seed: int = typer.Option(
        0, "--seed", help="Seed of the 5,000-problem MATH L3-5 subset and the data loader."
    ),
    hparam: list[str] = typer.Option(
        [],
        "--hparam",
        help="Override a field of the node's Hyperparameters, KEY=VALUE (JSON value); repeatable.",
    ),
    override: list[str] = typer.Option(
        [],
        "--set",
        help="Extra hydra override appended last, e.g. trainer.total_epochs=1; repeatable.",
    ),
    smoke: bool = typer.Option(
        False,
        "--smoke",
        help="CPU smoke: a few real verl steps of a tiny random Qwen2 (no GPU, no download); "
        "records a verl-smoke result that is never ranked.",
    ),
    steps: int = typer.Option(2, "--steps", help="With --smoke: verl training steps."),
    timeout: float = typer.Option(
        1800.0, "--timeout", help="With --smoke: seconds before verl is stopped."
    ),
    archive: Path = ArchiveOpt,
) -> None:
    """Train NODE with verl (lr 1e-6, batch 256 x 8 samples, 8 epochs, prompt 1024 / response 3000,
    KL loss, vLLM rollout), logging into the node's MLflow run; --smoke runs verl on the CPU."""
    from engine.archive.tracking import shown_uri  # lazy: keeps `poise-git --help` fast
    from engine.operators.verify import refuse_unverified  # lazy: keeps `poise-git --help` fast
    from engine.operators.verl_launch import node_launch  # lazy: keeps `poise-git --help` fast
    from engine.sandbox.env import without_secrets  # lazy: keeps `poise-git --help` fast
    from trainer_template.loader import AlgorithmLoadError  # lazy: keeps `poise-git --help` fast

    # lazy: keeps `poise-git --help` fast
    from trainer_template.verl_backend.launch import VerlProtocol, carries_credentials

    if backend != "verl":
        raise ConfigError(
            f"unknown training backend {backend!r}: only 'verl' (use `poise-git evaluate` for the CPU proxy)"
        )
    if smoke:
        from engine.cli.verl_smoke import run_smoke  # lazy: keeps `poise-git --help` fast

        if dry_run:
            raise ConfigError("--dry-run prints the GPU protocol's command; drop --smoke")
        run_smoke(
            archive,
            node,
            steps=steps,
            timeout_s=timeout,
            seed=seed,
            hparams=_parse_hparams(hparam),
            extra=override,
            evaluate=False,
        )
        return
    if importlib.util.find_spec("verl") is None:
        raise PoiseError(
            "verl is not installed: install the project's `verl` extra (pip install 'poise-git[verl]')"
        )
    arch = Archive(archive)
    arch.node(node)  # unknown node: one clear error
    refuse_unverified(arch, node, "train", unsandboxed=True)  # runs unsandboxed, here too
    if not dry_run:
        import torch  # lazy: torch is heavy (only this path needs it)

        if not torch.cuda.is_available():
            raise PoiseError(
                "verl training needs CUDA GPUs and vLLM; none is visible here (use --dry-run to inspect the command)"
            )
    try:
        launch = node_launch(
            arch,
            node,
            protocol=VerlProtocol(model=model, n_gpus=gpus, seed=seed),
            hparams=_parse_hparams(hparam),
            extra=override,
            dry_run=dry_run,
        )
    except AlgorithmLoadError as exc:
        raise ConfigError(str(exc)) from exc
    if dry_run:
        lines = [  # a tracking URI's user and password are not shown
            f"{k}={shlex.quote(shown_uri(v) if carries_credentials(v) else v)}"
            for k, v in launch.env.items()
        ]
        lines.append(shlex.join(launch.cmd[:3]))
        lines += [f"    {shlex.quote(o)}" for o in launch.overrides]
        typer.echo(" \\\n".join(lines))
        return
    console.print(f"[bold]{node}[/]: verl training, MLflow run {launch.env['MLFLOW_RUN_ID']}")
    proc = subprocess.run(launch.cmd, env=without_secrets(launch.env))
    if proc.returncode != 0:
        raise PoiseError(f"verl exited with status {proc.returncode}")


def register(app: typer.Typer) -> None:
    app.command()(train)
