"""``poise-git demo``: the README's main command on the embedded defaults."""

from __future__ import annotations

from pathlib import Path

import typer

from engine.archive import Archive
from engine.cli import console

_EDIT = '''\
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Dr.GRPO-style centred advantage: the group mean is subtracted, no std scaling."""
    scores = batch.rewards.to(torch.float32)
    stats = group_stats(scores, batch.group)
    return scores - torch.where(stats.count < 2, torch.zeros_like(scores), stats.mean)
'''


def demo(directory: Path = typer.Argument(Path("demo"), help="Where to create the demo archive.")) -> None:
    """A tour of the archive: init, spawn a candidate with a LibCST edit, draw the lineage."""
    arch = Archive.init(directory)
    console.print(f"[bold]1.[/] init: archive at {arch.path}, root node grpo")
    node = arch.spawn("grpo", "dr-grpo", _EDIT, proposal="# Dr.GRPO\nRemove the std normalization (length/difficulty bias).\n")
    console.print(f"[bold]2.[/] spawn: node {node.name} from grpo")
    console.print(arch.diff("grpo", node.name, ["algorithm.py"]), highlight=False)
    from engine.cli.archive_cmds import log

    console.print("[bold]3.[/] log:")
    log(archive=arch.path, as_json=False)


def register(app: typer.Typer) -> None:
    app.command()(demo)
