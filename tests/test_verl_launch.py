"""The verl launch from plain values: trainer_template builds it without the engine (no archive, no
MLflow); the engine's glue (engine.operators.verl_launch) opens the run and passes its id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_SCRIPT = """
import json, sys
from trainer_template import ALGORITHM_FILE
from trainer_template.verl_backend.launch import prepare_launch

launch = prepare_launch(
    "cand", ALGORITHM_FILE.read_text(), work_dir=sys.argv[1], tracking_uri="sqlite:////x/mlflow.db",
    run_id="r123", project="exp", hparams={"clip_ratio_high": 0.28}, dry_run=True,
)
engine = sorted(m for m in sys.modules if m == "engine" or m.startswith("engine."))
print(json.dumps({"env": launch.env, "overrides": launch.overrides, "files": launch.files,
                  "engine": engine}))
"""


def test_launch_is_built_from_plain_values_without_the_engine(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "verl")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["engine"] == []  # nothing of the engine was imported
    assert out["env"]["MLFLOW_TRACKING_URI"] == "sqlite:////x/mlflow.db"
    assert out["env"]["MLFLOW_RUN_ID"] == "r123"
    assert "actor_rollout_ref.actor.clip_ratio_high=0.28" in out["overrides"]
    assert "trainer.project_name=exp" in out["overrides"]
    assert out["files"]["algorithm"] == str(tmp_path / "verl" / "nodes" / "cand" / "algorithm.py")
    assert not (tmp_path / "verl").exists()  # a dry run writes nothing


def test_engine_glue_reads_the_node_and_refuses_bad_hparams_before_any_run(archive):
    import pytest

    from engine.operators.verl_launch import node_launch
    from trainer_template.loader import AlgorithmLoadError

    with pytest.raises(AlgorithmLoadError, match="unknown hyperparameters"):
        node_launch(archive, "grpo", hparams={"no_such_field": 1})
    assert not (archive.path / "mlflow.db").exists()  # no MLflow run was opened for it
    launch = node_launch(archive, "grpo", dry_run=True)
    assert launch.env["POISE_NODE_NAME"] == "grpo"
    assert launch.files["algorithm"].startswith(str(archive.path / ".poise" / "verl"))
    assert json.loads(json.dumps(launch.env))["MLFLOW_TRACKING_URI"].endswith("mlflow.db")
