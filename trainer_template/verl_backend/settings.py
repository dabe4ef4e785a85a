"""The loss-side settings verl shares with a node (aggregation, clip ratios, KL, entropy), read from the
node's ``Hyperparameters``, and the process that reads them where candidate code may run:

    python -m trainer_template.verl_backend.settings NODE ALGORITHM.py HPARAMS.json

It executes the node's ``algorithm.py``, instantiates its ``Hyperparameters`` with the overrides of
HPARAMS.json (a JSON object) and sends one frame over the engine's channel (``trainer_template.channel``):
``{"type": "settings", "settings": {name: value}}``, or ``{"type": "error", "message": one line}`` when
the source, an override or the dataclass fails. The engine runs it behind its sandbox and checks the
frame as untrusted data before any of it reaches verl's command line; it never executes the node's
code itself.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer_template.channel import Channel
from trainer_template.loader import AlgorithmLoadError, load_algorithm, make_config

NUMBER_SETTINGS = ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "kl_coef", "entropy_coef")
"""settings verl takes as numbers (``kl_coef`` may also be null: the protocol's coefficient)"""
TEXT_SETTINGS = ("loss_agg_mode", "kl_type")
"""settings verl takes as names"""


def node_settings(cfg: Any) -> dict[str, Any]:
    """The settings a node's ``cfg`` defines (a dataclass instance or a namespace), by name."""
    d = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(vars(cfg))
    return {k: d[k] for k in (*TEXT_SETTINGS, *NUMBER_SETTINGS) if k in d}


def settings_frame(node: str, source: str, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The frame the child sends for ``node`` whose algorithm.py is ``source`` (runs that code)."""
    try:
        settings = node_settings(make_config(load_algorithm(source, node), overrides))
        json.dumps(settings)  # plain data, or the error below names what is not
    except AlgorithmLoadError as exc:
        return {"type": "error", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the node's Hyperparameters may raise anything
        return {
            "type": "error",
            "message": f"{node}/algorithm.py: its Hyperparameters failed: {type(exc).__name__}: {exc}",
        }
    return {"type": "settings", "settings": settings}


def main(argv: list[str]) -> None:
    node, algorithm, hparams = argv
    channel = Channel.from_env()
    if channel is None:
        raise SystemExit("this child reports over the engine's channel ($POISE_CHANNEL_FD)")
    overrides = json.loads(Path(hparams).read_text(encoding="utf-8"))
    channel.send(settings_frame(node, Path(algorithm).read_text(encoding="utf-8"), overrides))


if __name__ == "__main__":
    main(sys.argv[1:])
