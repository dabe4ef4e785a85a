"""verl 0.9.1's real ``main_ppo`` end to end on the CPU, through the CLI, for two nodes on one Ray.

``grpo`` runs ``poise-git train --backend verl --smoke``; ``centred`` (an edit of it: group-centred
advantages without the std, that refuse to run without ``RolloutBatch.token_entropy``, a loss that
refuses to run without a :class:`TrainingState` and reports what it received, and an entropy weight
that follows the measured entropy and the progress) runs ``poise-git evaluate --backend verl --smoke``,
which also scores the checkpoint on the six benchmarks. Both have the same
seed, so verl samples the same first-step responses for both: equal first-step rewards, different
advantage statistics show each node's own mechanism computed them inside verl. Both runs join one Ray
started by :func:`engine.operators.train_verl.shared_ray` (one Ray start for the two).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
pytest.importorskip("ray")

pytestmark = pytest.mark.slow

CENTRED = '''
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Group-centred rewards (no std); needs the harness's per-response entropy."""
    if batch.token_entropy is None:
        raise ValueError("RolloutBatch.token_entropy was not filled")
    scores = batch.rewards.to(torch.float32)
    return scores - group_stats(scores, batch.group).mean


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cfg: Hyperparameters,
    ref_log_prob: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    state: TrainingState | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip loss that needs the harness's TrainingState and reports it."""
    if state is None or state.entropy is None:
        raise ValueError("no TrainingState (with entropy) reached the loss")
    pg_losses, _ = ppo_clip_loss(
        log_prob, old_log_prob, advantages, cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.clip_ratio_c
    )
    loss = agg_loss(pg_losses, response_mask, cfg.loss_agg_mode)
    return loss, {
        "pg_loss": float(loss.detach()),
        "seen_progress": float(state.progress),
        "seen_total_steps": float(state.total_steps),
        "seen_entropy": float(state.entropy),
    }


def entropy_coefficient(
    cfg: Hyperparameters, state: TrainingState | None, measured_entropy: float
) -> float:
    """An adaptive entropy weight: 1e-4 per nat of measured entropy, doubled by the end of training."""
    return cfg.entropy_coef + 1e-4 * measured_entropy * (1.0 + state.progress)
'''


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Both smokes, run once: (archive, {node: CompletedProcess}, seconds spent, verl's lock files
    that appeared in the machine's temporary directory meanwhile)."""
    from conftest import mark_verified, run_cli

    from engine.archive.store import Archive
    from engine.operators.train_verl import shared_ray

    archive = Archive.init(tmp_path_factory.mktemp("verl_smoke") / "exp")
    archive.spawn("grpo", "centred", CENTRED)
    mark_verified(archive, "centred")  # verl runs only verified (or template) code
    t0 = time.monotonic()
    done, locks_before = {}, _verl_locks()
    with shared_ray() as address:
        env = {"RAY_ADDRESS": address, "RAY_AUTH_MODE": "token"}
        done["grpo"] = run_cli(
            "train",
            "grpo",
            "--backend",
            "verl",
            "--smoke",
            "-C",
            str(archive.path),
            env=env,
            timeout=1500,
        )
        done["centred"] = run_cli(
            "evaluate",
            "centred",
            "--backend",
            "verl",
            "--smoke",
            "--limit",
            "1",
            "-C",
            str(archive.path),
            env=env,
            timeout=1500,
        )
    return archive, done, time.monotonic() - t0, _verl_locks() - locks_before


def _verl_locks() -> set[str]:
    """The ``ckpt_<hash>.lock`` files verl's ``local_mkdir_safe`` leaves in a temporary directory."""
    return {p.name for p in Path(tempfile.gettempdir()).glob("ckpt_*.lock")}


def _history(archive, node: str) -> dict[str, list[tuple[int, float]]]:
    import mlflow

    from engine.archive.tracking import find_runs, set_uri, tracking_uri

    runs = [
        r for r in find_runs(archive, node) if r.data.tags.get("poise.protocol") == "verl-smoke"
    ]
    assert len(runs) == 1, f"{node}: {len(runs)} verl-smoke runs"
    set_uri(tracking_uri(archive.path))
    client = mlflow.MlflowClient()
    rid = runs[0].info.run_id
    return {
        k: sorted((m.step, m.value) for m in client.get_metric_history(rid, k))
        for k in runs[0].data.metrics
    }


def test_both_smokes_finish_and_print_progress(smoke):
    _, done, seconds, _ = smoke
    print(f"two verl smokes on one Ray: {seconds:.0f} s")
    for node, proc in done.items():
        assert proc.returncode == 0, f"{node}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert "step 1/2" in proc.stdout and "step 2/2" in proc.stdout, proc.stdout[-2000:]
        assert "verl-smoke" in proc.stdout


def test_mlflow_has_two_verl_steps_with_the_project_metrics(smoke):
    archive, _, _, _ = smoke
    for node in ("grpo", "centred"):
        h = _history(archive, node)
        for key in (
            "train/reward_mean",
            "train/adv_std",
            "train/entropy",
            "train/pg_loss",
            "train/grad_norm",
            "actor/pg_loss",
            "critic/score/mean",
        ):
            assert [s for s, _ in h.get(key, [])] == [1, 2], f"{node}: {key} {h.get(key)}"
        # the TrainingState the harness installed in the actor worker: step / (total - 1)
        assert [v for _, v in h["actor/poise_state_progress"]] == [0.0, 1.0]


def test_each_mechanism_ran_inside_verl(smoke):
    archive, _, _, _ = smoke
    g, c = _history(archive, "grpo"), _history(archive, "centred")
    # same seed, same first-step responses: the rewards agree ...
    assert g["train/reward_mean"][0] == pytest.approx(c["train/reward_mean"][0], abs=1e-6)
    assert g["train/reward_mean"][0][1] > 0  # a reward with variance (partial credit)
    # ... while the advantages are each node's own: GRPO's std-normalised, the edit's centred only
    g_std, c_std = g["train/adv_std"][0][1], c["train/adv_std"][0][1]
    assert g_std > 0.5 and 0 < c_std < 0.5 * g_std, (g_std, c_std)
    # the edit's loss ran in verl's worker with the state it requires, and said what it saw
    assert [v for _, v in c["actor/seen_total_steps"]] == [2.0, 2.0]
    assert [v for _, v in c["actor/seen_progress"]] == [0.0, 1.0]
    ent = c["train/entropy"][0][1]
    assert c["actor/seen_entropy"][0][1] == pytest.approx(ent, rel=1e-5) and ent > 0


def test_verls_update_applies_each_nodes_entropy_weight(smoke):
    """``centred``'s adaptive weight, computed in verl's actor worker from each step's TrainingState, is
    the weight verl's actor loss applied (the policy loss reads it from the worker's actor config), and
    verl computed the entropy in the update for it; GRPO keeps its constant 0 and verl's update
    computes no entropy, as before."""
    archive, _, _, _ = smoke
    g, c = _history(archive, "grpo"), _history(archive, "centred")
    assert [v for _, v in g["train/entropy_coef"]] == [0.0, 0.0]
    assert [v for _, v in g["actor/poise_entropy_coeff"]] == [0.0, 0.0]
    assert "actor/entropy_loss" not in g
    ent = [v for _, v in c["train/entropy"]]
    want = [1e-4 * ent[0] * 1.0, 1e-4 * ent[1] * 2.0]  # progress 0, then 1
    assert [v for _, v in c["train/entropy_coef"]] == pytest.approx(want, rel=1e-6)
    assert [v for _, v in c["actor/poise_entropy_coeff"]] == pytest.approx(want, rel=1e-6)
    assert [s for s, _ in c["actor/entropy_loss"]] == [1, 2]


def test_results_carry_the_protocol_and_the_checkpoint(smoke):
    archive, _, _, _ = smoke
    nodes = archive.nodes()
    keys = set()
    for node, before in (("grpo", "spawned"), ("centred", "verified")):
        n = nodes[node]
        assert set(n.results) == {"verl-smoke"} and n.result is None  # never the compared protocol
        assert n.status == before  # a smoke is no evaluation under the experiment's protocol
        res = n.results["verl-smoke"]
        assert res.ok and res.protocol.backend == "verl" and res.seeds == (0,)
        assert res.protocol.hash.startswith("sha256:") and res.protocol.settings["steps"] == 2
        assert res.trajectory["step"] == [1, 2] and len(res.trajectory["train/adv_std"]) == 2
        assert res.mlflow_run_ids and res.node_commit
        ckpt = res.details["checkpoint"]
        assert os.path.isfile(os.path.join(ckpt, "config.json"))
        assert os.path.isfile(os.path.join(ckpt, "model.safetensors"))
        keys.add(res.protocol.key)
    assert len(keys) == 2  # train-only and train+score smokes are different protocol versions
    train = nodes["grpo"].results["verl-smoke"]
    assert train.unit("overall") == "fraction"
    assert train.value == pytest.approx(train.metrics["train/reward_mean"])
    scored = nodes["centred"].results["verl-smoke"]
    assert scored.unit("overall") == "percent" and 0.0 <= scored.value <= 100.0
    for bench in ("aime24", "aime25", "amc", "math500", "minerva", "olympiadbench"):
        assert f"math6/{bench}" in scored.metrics
        assert scored.details["evaluation"]["counts"][bench]["problems"] == 1
    assert scored.protocol.settings["evaluation"]["suite"] == "math6"
    assert _history(archive, "centred")["eval/overall"]


def test_verl_leaves_no_lock_file_in_the_machines_temporary_directory(smoke):
    """verl's workers take the node's own ``tmp`` as ``TMPDIR``: the lock files its checkpoints
    make stay with the node (each run of the suite left six in ``/tmp``)."""
    archive, _, _, left = smoke
    assert left == set()
    kept = {p.name for p in (archive.path / ".poise").glob("**/tmp/ckpt_*.lock")}
    assert kept, "verl's lock files are neither in /tmp nor with the nodes: did verl take any?"
    assert list((archive.path / ".poise").rglob("tmp/ckpt_*.lock"))
