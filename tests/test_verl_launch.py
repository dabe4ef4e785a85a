"""The verl launch from plain values: trainer_template builds it without an archive or MLflow (the
layering itself is checked on the source by test_layers.py); the engine's glue
(engine.operators.verl_launch) reads the node, opens the run and passes its id."""

from __future__ import annotations

import pytest

from trainer_template import ALGORITHM_FILE
from trainer_template.verl_backend.launch import prepare_launch


def test_launch_is_built_from_plain_values(tmp_path):
    launch = prepare_launch(
        "cand",
        ALGORITHM_FILE.read_text(),
        work_dir=tmp_path / "verl",
        tracking_uri="sqlite:////x/mlflow.db",
        run_id="r123",
        project="exp",
        hparams={"clip_ratio_high": 0.28},
        dry_run=True,
    )
    assert launch.env["MLFLOW_TRACKING_URI"] == "sqlite:////x/mlflow.db"
    assert launch.env["MLFLOW_RUN_ID"] == "r123"
    assert "actor_rollout_ref.actor.clip_ratio_high=0.28" in launch.overrides
    assert "trainer.project_name=exp" in launch.overrides
    assert launch.files["algorithm"] == str(tmp_path / "verl" / "nodes" / "cand" / "algorithm.py")
    assert not (tmp_path / "verl").exists()  # a dry run writes nothing


def test_engine_glue_reads_the_node_and_refuses_bad_hparams_before_any_run(archive):
    from engine.operators.verl_launch import node_launch
    from trainer_template.loader import AlgorithmLoadError

    with pytest.raises(AlgorithmLoadError, match="unknown hyperparameters"):
        node_launch(archive, "grpo", hparams={"no_such_field": 1})
    assert not (archive.path / "mlflow.db").exists()  # no MLflow run was opened for it
    launch = node_launch(archive, "grpo", dry_run=True)
    assert launch.env["POISE_NODE_NAME"] == "grpo"
    assert launch.files["algorithm"].startswith(str(archive.path / ".poise" / "verl"))
    assert launch.env["MLFLOW_TRACKING_URI"].endswith("mlflow.db")
