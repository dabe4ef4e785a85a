"""The verl evaluation backend: refuses cleanly without a GPU; finds verl's final HF checkpoint."""

from __future__ import annotations

import subprocess

import pytest

from engine.errors import EvaluationError
from engine.operators.evaluate import evaluate_node
from engine.operators.evaluate_verl import final_checkpoint


def test_verl_backend_without_gpu_is_one_clear_error(archive, cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the refusal path does not apply")
    before = subprocess.run(
        ["git", "-C", str(archive.path), "for-each-ref"], capture_output=True, text=True
    ).stdout
    with pytest.raises(EvaluationError, match="needs a CUDA GPU"):
        evaluate_node(archive, "grpo", backend="verl")
    p = cli("evaluate", "grpo", "--backend", "verl", "-C", str(archive.path))
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        "error: the verl backend needs a CUDA GPU and none is visible here; use --backend proxy on the CPU"
    ]
    after = subprocess.run(
        ["git", "-C", str(archive.path), "for-each-ref"], capture_output=True, text=True
    ).stdout
    assert after == before and archive.node("grpo").status == "spawned"


def test_unknown_backend(archive):
    with pytest.raises(EvaluationError, match="unknown backend 'tpu'"):
        evaluate_node(archive, "grpo", backend="tpu")


def test_final_checkpoint_is_the_last_step_with_an_hf_copy(tmp_path):
    assert final_checkpoint(tmp_path) is None
    for step, hf in ((10, True), (20, True), (30, False)):
        d = tmp_path / f"global_step_{step}" / "actor" / "huggingface"
        d.mkdir(parents=True)
        if hf:
            (d / "config.json").write_text("{}")
    assert final_checkpoint(tmp_path) == tmp_path / "global_step_20" / "actor" / "huggingface"
