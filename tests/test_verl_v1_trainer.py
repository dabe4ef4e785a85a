"""The ``poise_sync`` trainer against verl 0.9.1's real V1 trainer and a real TransferQueue, on the CPU.

The trainer class is registered by the plugin (as in every verl process), looked up in verl's
``TRAINER_REGISTRY`` and built by verl's own ``PPOTrainer.__init__`` from the protocol's composed hydra
config (no workers are started: that happens in ``init()``, which needs GPUs). The rollout batch is
written the way verl's agent loop writes it (``AgentLoopOutput.as_dict`` -> ``list_of_dict_to_tensordict``
-> ``kv_batch_put``) into a TransferQueue running on a private local Ray instance; the advantage step is
verl's own ``_compute_advantage`` under the mixin, reading and writing the queue.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
tq = pytest.importorskip(
    "transfer_queue", reason="verl V1's data plane (pip install TransferQueue)"
)
ray = pytest.importorskip("ray")

from engine.archive.edit import prior_source  # noqa: E402
from trainer_template.interface import RolloutBatch  # noqa: E402
from trainer_template.loader import load_algorithm, make_config  # noqa: E402
from trainer_template.verl_backend.trainer import TRAINER_MODE, ExtrasRoutingMixin  # noqa: E402

NODE = (
    "v1vm"  # vm_av_grpo: invalid responses get invalid_advantage, statistics over the valid members
)
PLUGIN = "trainer_template.verl_backend.plugin"
# 2 prompts x 4 samples; per sample: (reward, format_valid, response length)
SAMPLES = [
    (1.0, 1, 5),
    (0.0, 1, 9),
    (0.0, 0, 3),
    (0.0, 1, 7),
    (1.0, 1, 4),
    (1.0, 1, 6),
    (0.0, 0, 8),
    (0.0, 1, 2),
]


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    """(verl config, trainer class): the node registered through the plugin as verl's workers do, and the
    protocol's overrides composed against verl's shipped ``ppo_trainer`` config."""
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.utils.import_utils import import_external_libs

    from engine.archive.store import Archive
    from engine.operators.verl_launch import node_launch

    root = tmp_path_factory.mktemp("v1")
    archive = Archive.init(root / "exp")
    archive.spawn("grpo", NODE, algorithm=prior_source("vm_av_grpo"))
    algo = root / "algorithm.py"
    algo.write_text(archive.algorithm(NODE))
    small_queue = [
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "transfer_queue.backend.SimpleStorage.total_storage_size=1000",
    ]
    launch = node_launch(archive, NODE, dry_run=True, extra=small_queue)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POISE_NODE_NAME", NODE)
        mp.setenv("POISE_ALGORITHM_FILE", str(algo))
        mp.delenv("POISE_HPARAMS", raising=False)
        mp.delitem(sys.modules, PLUGIN, raising=False)
        import_external_libs(PLUGIN)
        assert sys.modules[PLUGIN].REGISTERED == f"poise_{NODE}"
        mp.delitem(sys.modules, PLUGIN)  # later imports without the environment register nothing
    from verl.trainer.ppo.v1 import get_trainer_cls

    with initialize_config_dir(
        config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None
    ):
        cfg = compose("ppo_trainer", overrides=launch.overrides)
    OmegaConf.resolve(cfg)
    return cfg, get_trainer_cls(cfg.trainer.v1.trainer_mode)


def test_poise_sync_is_verls_sync_trainer(composed):
    """Registered in verl's registry as a PPOTrainerSync subclass; verl's constructor builds it with the
    synchronous replay buffer (verl's base trainer branches on ``trainer_mode == "sync"``: without the
    alias, a class registered under another name silently gets the asynchronous buffer)."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    cfg, cls = composed
    assert cfg.trainer.v1.trainer_mode == TRAINER_MODE and TRAINER_REGISTRY[TRAINER_MODE] is cls
    assert issubclass(cls, PPOTrainerSync) and issubclass(cls, ExtrasRoutingMixin)
    trainer = cls(config=cfg)
    assert trainer.trainer_mode == "sync" and trainer.registered_mode == TRAINER_MODE
    assert (
        type(trainer.replay_buffer) is ReplayBuffer and trainer.replay_buffer.trainer_mode == "sync"
    )
    unaliased = type("Unaliased", (ExtrasRoutingMixin, PPOTrainerSync), {})(config=cfg)
    assert type(unaliased.replay_buffer) is ReplayBufferAsync
    from trainer_template.verl_backend.trainer import register_trainer

    assert register_trainer() is cls  # idempotent


@pytest.fixture(scope="module")
def queue(composed):
    """verl's TransferQueue (controller + one SimpleStorage unit as Ray actors) on a private local Ray."""
    cfg, _ = composed
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tq.init(cfg.transfer_queue)  # as verl.trainer.main_ppo does
        yield tq
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()


def _put_rollouts(partition: str) -> tuple[list[str], object]:
    """Write SAMPLES as verl's agent loop does (``AgentLoopWorkerTQ._agent_loop_postprocess``)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys, fields = [], []
    for i, (reward, valid, length) in enumerate(SAMPLES):
        uid, session = f"prompt{i // 4}", i % 4
        extra = {
            "reward_extra_info": {"score": reward, "acc": reward, "format_valid": float(valid)}
        }
        out = AgentLoopOutput(
            prompt_ids=[1, 2, 3],
            response_ids=list(range(10, 10 + length)),
            response_mask=[1] * length,
            reward_score=reward,
            num_turns=2,
            metrics=AgentLoopMetrics(),
            extra_fields=extra,
        )
        field = out.as_dict()
        field.update(uid=uid, global_steps=3)
        keys.append(f"{uid}_{session}_0")
        fields.append(field)
    tags = [{"status": "success", "response_len": length} for _, _, length in SAMPLES]
    return keys, tq.kv_batch_put(
        keys=keys, partition_id=partition, fields=list_of_dict_to_tensordict(fields), tags=tags
    )


def _advantages(meta) -> torch.Tensor:
    data = tq.kv_batch_get(
        keys=meta.keys, partition_id=meta.partition_id, select_fields=["advantages"]
    )
    return data["advantages"].to_padded_tensor(0.0)


def _direct(valid: list[bool]) -> torch.Tensor:
    """The node's compute_advantages called directly, broadcast over each response's tokens."""
    mod = load_algorithm(prior_source("vm_av_grpo"), "direct")
    r = torch.tensor([s[0] for s in SAMPLES])
    lengths = torch.tensor([s[2] for s in SAMPLES])
    batch = RolloutBatch(
        rewards=r,
        group=torch.arange(8) // 4,
        valid=torch.tensor(valid),
        correct=r > 0,
        lengths=lengths,
    )
    adv = mod.compute_advantages(batch, make_config(mod))
    mask = torch.arange(int(lengths.max())).unsqueeze(0) < lengths.unsqueeze(1)
    return adv.unsqueeze(-1) * mask


@pytest.mark.slow  # a Ray start / real evaluations: tens of CPU-seconds
def test_poise_sync_routes_reward_extra_info_through_the_queue(composed, queue):
    """verl's own ``_compute_advantage`` under the mixin: the estimator receives ``format_valid`` / ``acc``
    from each sample's ``extra_fields.reward_extra_info`` in the queue. The same step without the mixin
    (verl's PPOTrainerSync method) treats every response as valid."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    cfg, cls = composed
    trainer = cls(config=cfg)
    trainer.global_steps, trainer.total_training_steps = (
        3,
        12,
    )  # set by verl's _init_dataloader in init()
    keys, meta = _put_rollouts("train")
    assert (
        type(meta).__name__ == "KVBatchMeta" and meta.keys == keys and "extra_fields" in meta.fields
    )

    metrics: dict = {}
    out = trainer._compute_advantage(meta, metrics)
    assert out.keys == keys and {"advantages", "returns"} <= set(out.fields)
    routed = _advantages(meta)
    valid = [bool(s[1]) for s in SAMPLES]
    assert torch.allclose(routed, _direct(valid), atol=1e-6)
    assert torch.all(routed[2, :3] == -1.0) and torch.all(
        routed[6, :8] == -1.0
    )  # invalid_advantage
    assert metrics["poise/valid_rate"] == pytest.approx(np.mean(valid))
    assert metrics["poise/correct_rate"] == pytest.approx(3 / 8)

    # the proxy's signal names, from the node's own sequence advantages
    direct = _direct(valid)[:, 0]
    assert metrics["train/adv_std"] == pytest.approx(float(direct.std()), abs=1e-5)
    assert metrics["train/adv_min"] == pytest.approx(float(direct.min()), abs=1e-5)
    assert "train/entropy" not in metrics  # no entropy in the queue yet (verl's old-log-prob pass)

    # with verl's per-token entropy in the queue, each response's mean reaches the estimator
    from tensordict import TensorDict
    from verl.workers.utils.padding import response_to_nested

    lengths = torch.tensor([s[2] for s in SAMPLES])
    ent = torch.arange(8 * 9, dtype=torch.float32).reshape(8, 9) / 10
    mask = torch.nested.as_nested_tensor([torch.ones(int(n)) for n in lengths], layout=torch.jagged)
    tq.kv_batch_put(
        keys=keys,
        partition_id="train",
        fields=TensorDict({"entropy": response_to_nested(ent, mask)}, batch_size=8),
    )
    from engine.archive.edit import apply_edit
    from trainer_template.verl_backend.adapter import register_node

    # a mechanism whose advantages are the routed entropies themselves
    edit = (
        "def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:\n"
        "    return batch.token_entropy\n"
    )
    name = register_node("v1ent", apply_edit(prior_source("grpo"), edit))
    per_response = torch.stack([ent[i, : int(n)].mean() for i, n in enumerate(lengths)])
    metrics = {}
    before = cfg.algorithm.adv_estimator
    cfg.algorithm.adv_estimator = name
    try:
        trainer._compute_advantage(meta, metrics)
    finally:
        cfg.algorithm.adv_estimator = before
    got = _advantages(meta)
    assert torch.allclose(got[:, 0], per_response, atol=1e-6)
    assert metrics["train/entropy"] == pytest.approx(float(per_response.mean()))
    assert trainer._poise_state["entropy"] == pytest.approx(float(per_response.mean()))
    assert trainer._poise_state["step"] == 2 and trainer._poise_state["total_steps"] == 12

    PPOTrainerSync._compute_advantage(
        trainer, meta, {}
    )  # verl's step alone: no extras reach the estimator
    unrouted = _advantages(meta)
    assert torch.allclose(unrouted, _direct([True] * 8), atol=1e-6)
    assert not torch.allclose(unrouted, routed)
    assert (
        unrouted[2, 0] != -1.0 and unrouted[6, 0] != -1.0
    )  # the invalid responses were scored as valid
    tq.kv_clear(keys=keys, partition_id="train")


def test_update_actor_gives_verls_update_the_nodes_entropy_weight(composed, monkeypatch):
    """VM-AV-GRPO's adaptive entropy control through verl's own ``_update_actor`` under the mixin: the
    worker's actor loss config holds the node's entropy_coefficient(cfg, state, state.entropy) when
    verl's update runs, verl's driver asks the update to compute the entropy (its rule:
    ``calculate_entropy or entropy_coeff != 0``, here with the launch's constant 0), and the weight is
    logged as ``train/entropy_coef``. The worker group stands in for verl's Ray workers
    (``__ray_call__.remote(fn, *args)`` runs ``fn(worker, *args)``); the driver's config is restored."""
    import functools
    from types import SimpleNamespace

    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss

    from trainer_template.interface import TrainingState
    from trainer_template.verl_backend.adapter import EntropyCoefficientError

    cfg, cls = composed
    trainer = cls(config=cfg)
    actor_cfg = cfg.actor_rollout_ref.actor
    assert actor_cfg.entropy_coeff == 0.0 and not actor_cfg.calculate_entropy  # the launch's
    config = omega_conf_to_dataclass(actor_cfg)  # the worker's own copy, as init_model builds it
    loss_fn = functools.partial(ppo_loss, config=config)
    worker = SimpleNamespace(loss_fn=loss_fn, actor=SimpleNamespace(loss_fn=loss_fn))
    updates: list[tuple[bool, float]] = []

    class Handle:
        __ray_call__ = SimpleNamespace(remote=lambda fn, *args: fn(worker, *args))

    class WorkerGroup:
        workers = [Handle(), Handle()]

        def update_actor(self, batch):
            updates.append((batch.extra_info["calculate_entropy"], config.entropy_coeff))
            return {"metrics": {"mfu": [0.0]}}

    trainer.actor_rollout_wg = WorkerGroup()
    monkeypatch.setattr(ray, "get", lambda refs: refs)
    mod = load_algorithm(prior_source("vm_av_grpo"), "direct")

    def step(entropy):
        trainer._poise_state = {"progress": 0.0, "step": 0, "total_steps": 12, "entropy": entropy}
        metrics: dict = {}
        trainer._update_actor(SimpleNamespace(extra_info={}), metrics)
        assert actor_cfg.entropy_coeff == 0.0  # the driver's constant is back
        return metrics

    want = mod.entropy_coefficient(
        make_config(mod), TrainingState(progress=0.0, step=0, total_steps=12, entropy=0.05), 0.05
    )
    assert want == pytest.approx(0.0075)  # 75% short of the 0.2-nat target
    assert step(0.05)["train/entropy_coef"] == want
    assert updates[-1] == (True, want)
    assert step(0.5)["train/entropy_coef"] == 0.0  # above the target: no bonus, no entropy pass
    assert updates[-1] == (False, 0.0)
    with pytest.raises(EntropyCoefficientError, match="poise_v1vm: .* verl measured none"):
        step(None)
    assert len(updates) == 2  # no update ran
