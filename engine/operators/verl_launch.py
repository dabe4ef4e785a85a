"""The archive side of a verl launch: read the node's source, have its settings read in a sandboxed
child (``engine.operators.verl_settings``: this process never executes the node's code), open its
MLflow run, and hand plain values (the settings, paths, the tracking URI, the run id) to
``trainer_template.verl_backend.launch``, which never sees the archive."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.archive.tracking import node_run, tracking_uri
from engine.errors import ConfigError
from engine.operators.verl_settings import verl_settings
from trainer_template.verl_backend.launch import (
    Launch,
    VerlConfigError,
    VerlProtocol,
    check_overrides,
    prepare_launch,
)

VERL_DIR = Path(".poise") / "verl"
"""the node's algorithm, hyperparameters, checkpoints and the parquet data, under the archive"""


def node_launch(
    archive,
    node: str,
    *,
    protocol: VerlProtocol = VerlProtocol(),
    hparams: Mapping[str, Any] | None = None,
    extra: Sequence[str] = (),
    dry_run: bool = False,
    run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> Launch:
    """Everything ``poise-git train NODE --backend verl`` runs. Unless ``dry_run`` (or ``run_id`` is
    given), opens the node's MLflow run, which verl's MLflow logger attaches to (``MLFLOW_RUN_ID``).
    A node whose settings cannot be read (a bad source or ``--hparam``) raises AlgorithmLoadError
    before any run is opened, and overrides verl's config refuses (an unknown ``--set`` key, a model
    path that does not exist) raise ConfigError, also before. ``tags``: more tags of that run (the
    loop's job's ``poise.run``)."""
    source = archive.algorithm(node)
    settings = verl_settings(source, node, hparams)  # a bad source or --hparam opens no run
    common = dict(
        work_dir=Path(archive.path).resolve() / VERL_DIR,
        tracking_uri=tracking_uri(archive.path),
        project=archive.config().experiment.name or "poise",
        protocol=protocol,
        hparams=hparams,
        extra=extra,
    )
    dry = prepare_launch(node, source, settings, run_id=run_id, dry_run=True, **common)
    try:  # nor does a config verl would refuse: checked on the dry launch, which writes nothing
        check_overrides(dry.overrides)
    except VerlConfigError as exc:
        raise ConfigError(str(exc)) from None
    if dry_run:
        return dry
    if run_id is None:
        with node_run(
            archive, node, run_name=f"{node}-verl", tags={"poise.backend": "verl", **(tags or {})}
        ) as run:
            run_id = run.info.run_id
    return prepare_launch(node, source, settings, run_id=run_id, dry_run=False, **common)
