"""Imported inside every verl process (``VERL_USE_EXTERNAL_MODULES`` / ``model.external_lib``).

Registers the node named by ``$POISE_NODE_NAME`` whose ``algorithm.py`` is ``$POISE_ALGORITHM_FILE``
(hyperparameter overrides in ``$POISE_HPARAMS``: JSON, or the path of a JSON file) as a verl
estimator and policy loss, and the ``poise_sync`` trainer. With ``VERL_PLATFORM=cpu`` it first
registers the CPU platform and the ``poise_hf`` rollout (:mod:`cpu_platform`, :mod:`cpu_rollout`), so
verl resolves its device before anything asks for it. Importing it without those variables registers
nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainer_template.verl_backend import (
    ENV_ALGORITHM_FILE,
    ENV_HPARAMS,
    ENV_NODE,
    cpu_platform,
    cpu_rollout,
)
from trainer_template.verl_backend.adapter import register_node
from trainer_template.verl_backend.trainer import register_trainer


def register_cpu_shims() -> bool:
    """Register the CPU platform and rollout when ``VERL_PLATFORM=cpu``; True when it did."""
    if not cpu_platform.active():
        return False
    cpu_platform.register_cpu_platform()

    cpu_rollout.register_hf_rollout()
    return True


def register_from_env() -> str | None:
    """Register the node the environment names; returns its verl name (None when none is named)."""
    node, path = os.environ.get(ENV_NODE), os.environ.get(ENV_ALGORITHM_FILE)
    if not node or not path:
        return None

    raw = (os.environ.get(ENV_HPARAMS) or "").strip()
    if raw and not raw.startswith("{"):
        raw = Path(raw).read_text(encoding="utf-8")  # a path to a JSON file
    hparams = json.loads(raw or "{}")
    name = register_node(node, Path(path).read_text(encoding="utf-8"), hparams)
    register_trainer()
    return name


CPU = register_cpu_shims()
REGISTERED = register_from_env()
