"""The verl adapter on the CPU: registration, verl's own compute_advantage, extras routing, reward,
data, and the protocol's hydra overrides composed against verl's shipped config."""

from __future__ import annotations

import hashlib
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from engine.archive.edit import prior_source  # noqa: E402
from trainer_template.interface import RolloutBatch  # noqa: E402
from trainer_template.loader import load_algorithm, make_config  # noqa: E402
from trainer_template.priors import list_priors  # noqa: E402
from trainer_template.verl_backend import registered_name  # noqa: E402
from trainer_template.verl_backend.adapter import (  # noqa: E402
    VerlRegistrationError,
    compute_advantage_with_extras,
    extras_from_records,
    register_node,
)
from trainer_template.verl_backend.trainer import ExtrasRoutingMixin  # noqa: E402


def _data(scores, groups, t=5, extras=None) -> DataProto:
    n = len(scores)
    mask = torch.ones(n, t)
    mask[::3, -2:] = 0.0
    tok = torch.zeros(n, t)
    tok[:, 0] = torch.tensor(scores, dtype=torch.float32)
    non_tensors = {"uid": np.array([f"p{g}" for g in groups], dtype=object)}
    non_tensors.update({k: np.array(v) for k, v in (extras or {}).items()})
    return DataProto.from_dict(
        tensors={"token_level_rewards": tok, "response_mask": mask}, non_tensors=non_tensors
    )


SCORES = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
GROUPS = [0] * 8 + [1] * 3 + [2]
VALID = [True, True, True, True, True, True, False, False, True, True, False, True]


def test_grpo_node_through_verls_compute_advantage():
    name = register_node("vb_grpo", prior_source("grpo"))
    assert name == registered_name("vb_grpo") == "poise_vb_grpo"
    ours = compute_advantage(_data(SCORES, GROUPS), adv_estimator=name, config=None)
    ref = compute_advantage(_data(SCORES, GROUPS), adv_estimator="grpo")
    assert torch.equal(ours.batch["advantages"], ref.batch["advantages"])  # bit-equal
    assert torch.equal(ours.batch["advantages"], ours.batch["returns"])


def test_extras_routing_delivers_valid_and_correct():
    """vm_av_grpo depends on `valid`: routed through verl's compute_advantage it must equal the module
    called directly with those flags, and differ from the unrouted default (all valid)."""
    name = register_node("vb_vm", prior_source("vm_av_grpo"))
    extras = {"format_valid": [float(v) for v in VALID], "acc": SCORES}
    routed = compute_advantage_with_extras(
        _data(SCORES, GROUPS, extras=extras), adv_estimator=name, config=None
    )
    unrouted = compute_advantage(_data(SCORES, GROUPS), adv_estimator=name, config=None)
    mod = load_algorithm(prior_source("vm_av_grpo"), "vm")
    data = _data(SCORES, GROUPS)
    direct = mod.compute_advantages(
        RolloutBatch(
            rewards=torch.tensor(SCORES),
            group=torch.tensor(GROUPS),
            valid=torch.tensor(VALID),
            correct=torch.tensor(SCORES) > 0,
            lengths=data.batch["response_mask"].sum(-1).long(),
        ),
        make_config(mod),
    )
    mask = data.batch["response_mask"]
    assert torch.allclose(routed.batch["advantages"], direct.unsqueeze(-1) * mask, atol=1e-6)
    assert routed.batch["advantages"][6, 0] == pytest.approx(
        -1.0
    )  # invalid_advantage reached the sample
    assert not torch.allclose(routed.batch["advantages"], unrouted.batch["advantages"])


def _ragged(n=16, t=40, mask_dtype=torch.int64, seed=0) -> tuple[DataProto, torch.Tensor]:
    """A batch of 2 groups with response lengths 1..t (verl's response_mask is int64 in the trainer)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    tok = torch.zeros(n, t)
    tok[torch.arange(n), lengths - 1] = torch.randint(0, 2, (n,), generator=gen).float()
    uids = np.array([f"p{i // 8}" for i in range(n)], dtype=object)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": tok, "response_mask": mask.to(mask_dtype)},
        non_tensors={"uid": uids},
    )
    return data, lengths


@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.float32, torch.bool])
def test_adapter_counts_lengths_only_when_the_mechanism_reads_them(mask_dtype):
    """The adapter hands RolloutBatch a function for the lengths: a mechanism that never reads them costs
    no pass over the [B, T] mask; one that does gets the exact token counts [B] long."""
    from types import SimpleNamespace

    from trainer_template.verl_backend.adapter import make_estimator

    seen = []

    def no_lengths(batch, cfg):
        seen.append(batch)
        return batch.rewards - 0.5

    def reads_lengths(batch, cfg):
        seen.append(batch)
        return batch.lengths.to(torch.float32) / 100.0

    for fn in (no_lengths, reads_lengths):
        core_algos.register_adv_est(f"poise_test_{fn.__name__}_{str(mask_dtype)[6:]}")(
            make_estimator(SimpleNamespace(compute_advantages=fn), None)
        )
    data, lengths = _ragged(mask_dtype=mask_dtype)
    mask = data.batch["response_mask"].to(torch.float32)
    out = compute_advantage(
        data, adv_estimator=f"poise_test_no_lengths_{str(mask_dtype)[6:]}", config=None
    )
    assert "lengths" not in vars(seen[0])  # never counted
    assert torch.equal(
        out.batch["advantages"],
        (data.batch["token_level_rewards"].sum(-1) - 0.5).unsqueeze(-1) * mask,
    )
    assert seen[0].lengths.dtype == torch.long and torch.equal(
        seen[0].lengths, lengths
    )  # exact when read late
    data, lengths = _ragged(mask_dtype=mask_dtype, seed=1)
    mask = data.batch["response_mask"].to(torch.float32)
    out = compute_advantage(
        data, adv_estimator=f"poise_test_reads_lengths_{str(mask_dtype)[6:]}", config=None
    )
    assert torch.equal(seen[1].lengths, lengths)
    assert torch.allclose(
        out.batch["advantages"], (lengths.float() / 100.0).unsqueeze(-1) * mask, atol=1e-7
    )


@pytest.mark.parametrize("prior", ["dace_grpo", "cag_grpo", "msa_grpo"])
def test_length_priors_through_verl_equal_the_eager_batch(prior):
    """A prior that reads lengths, through verl's compute_advantage, equals the module called directly on
    a batch built with the eager token counts."""
    name = register_node(f"vb_len_{prior}", prior_source(prior))
    data, lengths = _ragged(n=24, t=60, seed=2)
    out = compute_advantage(data, adv_estimator=name, config=None)
    mod = load_algorithm(prior_source(prior), prior)
    scores = data.batch["token_level_rewards"].sum(-1)
    groups = torch.arange(24) // 8
    direct = mod.compute_advantages(
        RolloutBatch(
            rewards=scores,
            group=groups,
            valid=torch.ones(24, dtype=torch.bool),
            correct=scores > 0,
            lengths=lengths,
        ),
        make_config(mod),
    )
    mask = data.batch["response_mask"].to(torch.float32)
    assert torch.allclose(out.batch["advantages"], direct.unsqueeze(-1) * mask, atol=1e-6)
    assert out.batch["advantages"].dtype == torch.float32


def test_adapter_rejects_mismatched_mask():
    name = register_node("vb_mismatch", prior_source("grpo"))
    data, _ = _ragged()
    fn = core_algos.get_adv_estimator_fn(name)
    with pytest.raises(ValueError, match="same shape"):
        fn(
            data.batch["token_level_rewards"],
            data.batch["response_mask"][:1],
            np.asarray(data.non_tensor_batch["uid"]),
        )


def test_adapter_refuses_a_batch_without_uids():
    """Without uids every response was its own group of one: GRPO gave r/(1+eps), silently."""
    name = register_node("vb_no_uid", prior_source("grpo"))
    data, _ = _ragged()
    fn = core_algos.get_adv_estimator_fn(name)
    with pytest.raises(ValueError, match="no uid"):
        fn(data.batch["token_level_rewards"], data.batch["response_mask"], None)


def test_trainer_mixin_routes_reward_extra_info():
    """The trainer override reads per-sample reward_extra_info records (as V1 stores them) and runs the
    base trainer's own advantage step with valid / correct delivered."""
    seen = {}

    def spy(token_level_rewards, response_mask, index=None, config=None, **kw):
        from trainer_template.verl_backend import adapter

        seen.update(adapter._EXTRAS.get() or {})
        z = torch.zeros_like(token_level_rewards)
        return z, z

    core_algos.register_adv_est("poise_test_spy")(spy)

    class Base:  # the V1 trainer's contract: _compute_advantage(batch, metrics) on the same batch order
        global_steps, total_training_steps = 3, 12

        def _compute_advantage(self, batch, metrics):
            return compute_advantage(batch, adv_estimator="poise_test_spy", config=None)

    records = [{"format_valid": float(v), "acc": s, "score": s} for v, s in zip(VALID, SCORES)]
    records[2] = None  # a sample whose reward produced no extras counts as invalid / wrong

    class Trainer(ExtrasRoutingMixin, Base):
        def _poise_reward_extras(self, batch):
            return extras_from_records(records)

    metrics = {}
    Trainer()._compute_advantage(_data(SCORES, GROUPS), metrics)
    expect_valid = np.array(VALID)
    expect_valid[2] = False
    assert seen["valid"].tolist() == expect_valid.tolist()
    assert seen["correct"].tolist() == [bool(s) for s in SCORES]
    assert seen["progress"] == pytest.approx(2 / 11)  # 0-based step 2 of 12: step / (total - 1)
    assert metrics["poise/valid_rate"] == pytest.approx(expect_valid.mean())


ENTROPY_EDIT = '''
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Centred per-response entropy (needs the harness's token_entropy)."""
    if batch.token_entropy is None:
        raise ValueError("no token_entropy")
    return batch.token_entropy - batch.token_entropy.mean()


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
    """Mean surrogate; reports the state it was given."""
    loss = -(advantages * torch.exp(log_prob - old_log_prob) * response_mask).sum() / response_mask.sum()
    seen = {"seen_state": 0.0 if state is None else 1.0}
    if state is not None:
        seen.update(seen_progress=state.progress, seen_step=float(state.step))
        seen["seen_entropy"] = -1.0 if state.entropy is None else state.entropy
    return loss, seen
'''


def test_token_entropy_and_training_state_reach_the_mechanism():
    """The trainer mixin routes per-response entropy as RolloutBatch.token_entropy, logs the node's
    sequence advantages under the proxy's names, and the TrainingState it builds (installed in the
    actor worker before the update) is what the node's policy_loss receives."""
    from engine.archive.edit import apply_edit
    from trainer_template.verl_backend.adapter import install_training_state

    name = register_node("vb_ent", apply_edit(prior_source("grpo"), ENTROPY_EDIT))
    ent = torch.tensor([0.5, 1.5, 1.0, 2.0, 3.0, 0.0])

    class Base:
        global_steps, total_training_steps = 2, 5

        def _compute_advantage(self, batch, metrics):
            return compute_advantage(batch, adv_estimator=name, config=None)

    class Trainer(ExtrasRoutingMixin, Base):
        def _poise_reward_extras(self, batch):
            return {}

        def _poise_signals(self, batch, n):
            return {"token_entropy": ent, "train/entropy": float(ent.mean())}

    trainer, metrics = Trainer(), {}
    out = trainer._compute_advantage(_data([0.0] * 6, [0, 0, 0, 1, 1, 1]), metrics)
    centred = ent - ent.mean()
    assert torch.allclose(out.batch["advantages"][:, 0], centred)
    assert metrics["train/adv_std"] == pytest.approx(float(centred.std()))
    assert metrics["train/adv_max"] == pytest.approx(float(centred.max()))
    assert metrics["train/entropy"] == pytest.approx(float(ent.mean()))
    state = trainer._poise_state
    assert state == {"progress": 0.25, "step": 1, "total_steps": 5, "entropy": float(ent.mean())}
    loss_fn = core_algos.get_policy_loss_fn(name)
    args = (torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3))
    try:
        _, m = loss_fn(*args, loss_agg_mode="token-mean", config=None)
        assert m["actor/seen_state"] == 0.0 and "actor/poise_state_progress" not in m
        install_training_state(state)  # what the trainer runs in each actor worker
        _, m = loss_fn(*args, loss_agg_mode="token-mean", config=None)
    finally:
        install_training_state(None)
    assert m["actor/seen_progress"] == 0.25 and m["actor/seen_step"] == 1.0
    assert m["actor/seen_entropy"] == pytest.approx(float(ent.mean()))
    assert m["actor/poise_state_progress"] == 0.25 and m["actor/poise_state_step"] == 1.0


def _actor_worker(node: str, source: str, hparams=None):
    """(fake engine actor worker, verl ActorConfig, registered name): ``node`` registered as verl's
    workers register it, and the actor config built from the protocol's launch overrides as verl's
    ``ActorRolloutRefWorker.init_model`` builds it (``omega_conf_to_dataclass``), bound to verl's own
    ``ppo_loss`` the way the worker binds it (``actor.loss_fn = partial(ppo_loss, config=...)``)."""
    import functools
    from types import SimpleNamespace

    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss

    from trainer_template.verl_backend.launch import build_overrides
    from trainer_template.verl_backend.settings import node_settings

    name = register_node(node, source, hparams)
    settings = node_settings(make_config(load_algorithm(source, node), hparams))
    overrides = build_overrides(
        node,
        settings,
        train_file="/x/t.parquet",
        val_file="/x/v.parquet",
        ckpt_dir="/x/ckpt",
        project="p",
        env_for_workers={},
    )
    with initialize_config_dir(
        config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None
    ):
        cfg = compose("ppo_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert config.policy_loss.loss_mode == name
    loss_fn = functools.partial(ppo_loss, config=config)
    return SimpleNamespace(loss_fn=loss_fn, actor=SimpleNamespace(loss_fn=loss_fn)), config, name


def _verl_update_loss(worker) -> tuple[float, dict]:
    """verl's ``ppo_loss`` as the worker's update calls it on one micro-batch with the entropy computed
    (3 responses of 4 tokens after 2-token prompts, a reference policy): (loss, {metric: value})."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    gen = torch.Generator().manual_seed(0)
    b, p, t = 3, 2, 4
    data = TensorDict(
        {
            "prompts": torch.ones(b, p, dtype=torch.long),
            "responses": torch.ones(b, t, dtype=torch.long),
            "attention_mask": torch.ones(b, p + t, dtype=torch.long),
            "response_mask": torch.ones(b, t),
            "old_log_probs": -torch.rand(b, t, generator=gen),
            "ref_log_prob": -torch.rand(b, t, generator=gen),  # the protocol's KL loss is on
            "advantages": torch.randn(b, 1, generator=gen).expand(b, t).contiguous(),
        },
        batch_size=b,
    )
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    output = {
        "log_probs": -torch.rand(b * (p + t), generator=gen),
        "entropy": torch.rand(b * (p + t), generator=gen) + 0.5,
    }
    loss, metrics = worker.actor.loss_fn(model_output=output, data=data)
    return float(loss), {
        k: float(v.aggregate() if hasattr(v, "aggregate") else v) for k, v in metrics.items()
    }


def test_the_nodes_adaptive_entropy_weight_is_what_verls_actor_loss_applies():
    """DACE-GRPO's annealed controller with entropy short of its target: the weight the actor worker's
    loss (verl's own ppo_loss) applies in the update is the node's entropy_coefficient(cfg, state,
    state.entropy), not the launch's constant (DACE-GRPO's entropy_coef, 0)."""
    from types import SimpleNamespace

    from trainer_template.interface import TrainingState
    from trainer_template.verl_backend.adapter import install_training_state_in_actor

    source = prior_source("dace_grpo")
    worker, config, name = _actor_worker("vb_dace", source)
    constant = config.entropy_coeff
    assert constant == 0.0  # the launch's actor.entropy_coeff: DACE-GRPO's entropy_coef
    base_loss, base = _verl_update_loss(worker)
    assert base["actor/poise_entropy_coeff"] == 0.0

    mod = load_algorithm(source, "dace")
    state = TrainingState(progress=0.5, step=3, total_steps=7, entropy=0.05)
    want = mod.entropy_coefficient(make_config(mod), state, 0.05)
    assert want == pytest.approx(0.0075) and want != constant  # target 0.2 at half-way, 75% short
    # the Ray actor verl's trainer reaches is the colocated WorkerDict holding the worker by role
    colocated = SimpleNamespace(worker_dict={"actor_rollout": worker})
    try:
        got = install_training_state_in_actor(colocated, vars(state), name)
        assert got == want and config.entropy_coeff == want
        loss, m = _verl_update_loss(worker)
    finally:
        install_training_state_in_actor(worker, None)
    assert m["actor/poise_entropy_coeff"] == want  # what the node's loss saw in verl's config
    assert m["actor/pg_loss"] == pytest.approx(base["actor/pg_loss"])
    assert loss == pytest.approx(base_loss - want * m["actor/entropy_loss"], abs=1e-7)

    # above the annealed target (late, entropy 0.5 nats): the controller adds nothing
    late = TrainingState(progress=1.0, step=6, total_steps=7, entropy=0.5)
    assert install_training_state_in_actor(worker, vars(late), name) == 0.0
    assert config.entropy_coeff == 0.0


def test_grpos_constant_entropy_weight_is_unchanged_on_verl():
    """The root's entropy_coefficient is its constant entropy_coef (here 0.002): the worker's weight
    stays the launch's actor.entropy_coeff whatever the entropy, and with a state that carries none."""
    from trainer_template.interface import TrainingState
    from trainer_template.verl_backend.adapter import install_training_state_in_actor

    worker, config, name = _actor_worker(
        "vb_grpo_ent", prior_source("grpo"), {"entropy_coef": 0.002}
    )
    assert config.entropy_coeff == 0.002
    base_loss, _ = _verl_update_loss(worker)
    try:
        for entropy in (0.01, 5.0, None):
            state = TrainingState(progress=0.3, step=1, total_steps=4, entropy=entropy)
            assert install_training_state_in_actor(worker, vars(state), name) == 0.002
            assert config.entropy_coeff == 0.002
        loss, m = _verl_update_loss(worker)
    finally:
        install_training_state_in_actor(worker, None)
    assert loss == base_loss and m["actor/poise_entropy_coeff"] == 0.002


NAN_ENTROPY_EDIT = """
def entropy_coefficient(
    cfg: Hyperparameters, state: TrainingState | None, measured_entropy: float
) -> float:
    return cfg.entropy_coef + (float("nan") if measured_entropy < 1.0 else 0.0)
"""


def test_an_unusable_entropy_weight_stops_the_step_with_one_error():
    """Not finite, raising, needing an entropy verl did not measure, or no loss config to set it on:
    EntropyCoefficientError naming the node, before verl's update. A negative weight (DCBE-GRPO's
    two-sided controller above its target) is an entropy penalty, applied as on the proxy."""
    from types import SimpleNamespace

    from engine.archive.edit import apply_edit
    from trainer_template.interface import TrainingState
    from trainer_template.verl_backend.adapter import (
        EntropyCoefficientError,
        install_training_state_in_actor,
    )

    low = TrainingState(progress=0.0, step=0, total_steps=2, entropy=0.05)
    worker, config, name = _actor_worker(
        "vb_nan", apply_edit(prior_source("grpo"), NAN_ENTROPY_EDIT)
    )
    with pytest.raises(
        EntropyCoefficientError,
        match=r"poise_vb_nan: entropy_coefficient at step 0 .* returned nan; .* finite",
    ):
        install_training_state_in_actor(worker, vars(low), name)
    assert config.entropy_coeff == 0.0  # left as it was
    raising = "def entropy_coefficient(cfg, state, measured_entropy):\n    return 1 / 0\n"
    worker, _, name = _actor_worker("vb_raise", apply_edit(prior_source("grpo"), raising))
    with pytest.raises(EntropyCoefficientError, match="failed: ZeroDivisionError"):
        install_training_state_in_actor(worker, vars(low), name)

    worker, config, name = _actor_worker("vb_dace_err", prior_source("dace_grpo"))
    unmeasured = TrainingState(progress=0.0, step=0, total_steps=2, entropy=None)
    with pytest.raises(
        EntropyCoefficientError, match="depends on the measured entropy, and verl measured none"
    ):
        install_training_state_in_actor(worker, vars(unmeasured), name)
    with pytest.raises(EntropyCoefficientError, match="no actor loss config in SimpleNamespace"):
        install_training_state_in_actor(SimpleNamespace(), vars(low), name)
    install_training_state_in_actor(worker, None)

    worker, config, name = _actor_worker("vb_dcbe", prior_source("dcbe_grpo"))
    high = TrainingState(progress=0.5, step=1, total_steps=3, entropy=0.3)
    try:
        assert install_training_state_in_actor(worker, vars(high), name) == pytest.approx(-0.005)
        assert config.entropy_coeff == pytest.approx(-0.005)  # 0.01 * (0.2 - 0.3) / 0.2
        _, m = _verl_update_loss(worker)
    finally:
        install_training_state_in_actor(worker, None)
    assert m["actor/poise_entropy_coeff"] == pytest.approx(-0.005)


def test_registration_rejects_clashes():
    src = prior_source("rloo")
    assert register_node("vb_rloo", src) == register_node("vb_rloo", src)  # idempotent
    with pytest.raises(VerlRegistrationError, match="different mechanism"):
        register_node("vb_rloo", prior_source("grpo"))
    core_algos.register_policy_loss("poise_vb_taken")(lambda *a, **k: None)
    with pytest.raises(VerlRegistrationError, match="already has"):
        register_node("vb_taken", src)
    with pytest.raises(VerlRegistrationError):
        register_node("vb_broken", "def compute_advantages(:\n")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_policy_loss_equals_vanilla_with_global_batch_info(mode):
    from omegaconf import OmegaConf

    name = register_node("vb_loss", prior_source("grpo"))
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 8, generator=gen) * 2
    logp = old + torch.randn(6, 8, generator=gen) * 0.5
    adv = torch.randn(6, 1, generator=gen).expand(6, 8).contiguous()
    mask = (torch.rand(6, 8, generator=gen) > 0.3).float()
    info = {
        "dp_size": 2,
        "batch_num_tokens": 70,
        "global_batch_size": 13,
        "loss_scale_factor": None,
    }
    cfg = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "clip_ratio_c": 3.0,
            "global_batch_info": info,
        }
    )
    ref, ref_m = core_algos.compute_policy_loss_vanilla(
        old, logp, adv, mask, loss_agg_mode=mode, config=cfg
    )
    lp = logp.clone().requires_grad_(True)
    ours, m = core_algos.get_policy_loss_fn(name)(
        old, lp, adv, mask, loss_agg_mode=mode, config=cfg
    )
    assert torch.allclose(ours, ref, atol=1e-6)
    assert m["actor/pg_clipfrac"] == pytest.approx(ref_m["actor/pg_clipfrac"], abs=1e-6)
    assert m["actor/ppo_kl"] == pytest.approx(ref_m["actor/ppo_kl"], abs=1e-6)
    ours.backward()
    assert torch.isfinite(lp.grad).all()


def test_plugin_registers_when_verl_imports_it(tmp_path, monkeypatch):
    """verl imports external modules (VERL_USE_EXTERNAL_MODULES at `import verl`, model.external_lib in
    the workers) with import_external_libs; the plugin then registers the node the environment names."""
    from verl.utils.import_utils import import_external_libs

    algo = tmp_path / "algorithm.py"
    algo.write_text(prior_source("dr_grpo"))
    hp = tmp_path / "hparams.json"
    hp.write_text('{"eps": 0.001}')
    monkeypatch.setenv("POISE_NODE_NAME", "vb_plug")
    monkeypatch.setenv("POISE_ALGORITHM_FILE", str(algo))
    monkeypatch.setenv("POISE_HPARAMS", str(hp))
    monkeypatch.delitem(sys.modules, "trainer_template.verl_backend.plugin", raising=False)
    import_external_libs("trainer_template.verl_backend.plugin")
    assert sys.modules["trainer_template.verl_backend.plugin"].REGISTERED == "poise_vb_plug"
    assert (
        "poise_vb_plug" in core_algos.ADV_ESTIMATOR_REGISTRY
        and "poise_vb_plug" in core_algos.POLICY_LOSS_REGISTRY
    )
    monkeypatch.delenv("POISE_NODE_NAME")
    monkeypatch.delitem(sys.modules, "trainer_template.verl_backend.plugin")
    import_external_libs("trainer_template.verl_backend.plugin")  # nothing named: registers nothing
    assert sys.modules["trainer_template.verl_backend.plugin"].REGISTERED is None


def test_compute_score():
    from trainer_template.verl_backend.reward import compute_score

    assert compute_score("math", r"so the answer is $\boxed{\frac{1}{2}}$", "0.5", {}) == {
        "score": 1.0,
        "acc": 1.0,
        "format_valid": 1.0,
    }
    assert compute_score("math", r"\boxed{3}", "4", None) == {
        "score": 0.0,
        "acc": 0.0,
        "format_valid": 1.0,
    }
    assert compute_score("math", "I think it is 4", "4", None) == {
        "score": 0.0,
        "acc": 0.0,
        "format_valid": 0.0,
    }
    assert compute_score("math", r"first \boxed{1} then \boxed{4}", "4", None)["acc"] == 1.0
    result = {}
    th = threading.Thread(
        target=lambda: result.update(compute_score("math", r"\boxed{2\sqrt{2}}", r"\sqrt{8}", None))
    )
    th.start()
    th.join()
    assert result["acc"] == 1.0  # outside the main thread (no SIGALRM) grading still works


def test_data_subset_is_seeded_and_shipped_with_provenance(tmp_path):
    from trainer_template.verl_backend import data_prep

    raw = data_prep.SOURCE.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == data_prep.SOURCE_SHA256
    prov = (data_prep.SOURCE.parent / "PROVENANCE.md").read_text()
    assert data_prep.SOURCE_SHA256 in prov and "e8c4e3c2d19739d3dff59e577d1c97090cc15f59" in prov
    train, val = data_prep.sample_subset(5000, seed=0)
    again, _ = data_prep.sample_subset(5000, seed=0)
    other, _ = data_prep.sample_subset(5000, seed=1)
    assert len(train) == 5000 and train == again and train != other
    tr_ids = {r["extra_info"]["source_index"] for r in train}
    assert len(tr_ids) == 5000 and not tr_ids & {r["extra_info"]["source_index"] for r in val}
    assert {r["extra_info"]["level"] for r in train} == {"Level 3", "Level 4", "Level 5"}
    row = train[0]
    assert row["prompt"][0] == {"role": "system", "content": data_prep.SYSTEM_PROMPT}
    assert data_prep.boxed_gold(r"a \boxed{1} b \boxed{\frac{2}{3}}") == r"\frac{2}{3}"
    import pandas as pd

    tp, vp = data_prep.write_parquet(tmp_path, n=50, seed=0)
    df = pd.read_parquet(tp)
    assert len(df) == 50 and set(df.columns) >= {
        "data_source",
        "prompt",
        "reward_model",
        "extra_info",
    }
    assert (
        df.iloc[0]["reward_model"]["ground_truth"]
        == data_prep.sample_subset(50, 0)[0][0]["reward_model"]["ground_truth"]
    )


@pytest.mark.slow
def test_overrides_compose_against_verls_config(archive):
    import verl
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from engine.operators.verl_launch import node_launch
    from trainer_template.loader import AlgorithmLoadError

    archive.spawn("grpo", "dr", algorithm=prior_source("dr_grpo"))
    with pytest.raises(AlgorithmLoadError, match="unknown hyperparameters"):
        node_launch(archive, "dr", hparams={"no_such_field": 1}, dry_run=True)
    launch = node_launch(archive, "dr", dry_run=True)
    assert launch.cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    with initialize_config_dir(
        config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None
    ):
        cfg = compose("ppo_trainer", overrides=launch.overrides)
    validate_config(
        config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg)
    )
    a, r = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert cfg.algorithm.adv_estimator == a.policy_loss.loss_mode == "poise_dr"
    assert (
        a.optim.lr == 1e-6
        and cfg.data.train_batch_size == 256
        and r.n == 8
        and cfg.trainer.total_epochs == 8
    )
    assert cfg.data.max_prompt_length == 1024 and cfg.data.max_response_length == 3000
    assert a.use_kl_loss and a.kl_loss_type == "low_var_kl" and r.name == "vllm"
    assert a.loss_agg_mode == "seq-mean-token-sum-norm"  # the node's own aggregation reaches verl
    assert (
        list(cfg.trainer.logger) == ["console", "mlflow"]
        and cfg.trainer.v1.trainer_mode == "poise_sync"
    )
    assert cfg.actor_rollout_ref.model.external_lib == "trainer_template.verl_backend.plugin"
    env_vars = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert (
        env_vars.MLFLOW_TRACKING_URI == launch.env["MLFLOW_TRACKING_URI"]
        and env_vars.POISE_NODE_NAME == "dr"
    )


@pytest.mark.slow
def test_the_nodes_kl_coefficient_reaches_verl(archive):
    """The root's KL (0.001, low_var_kl) is verl's KL loss; DAPO's kl_coef = 0 turns it off."""
    from engine.operators.verl_launch import node_launch

    root = node_launch(archive, "grpo", dry_run=True).overrides
    assert "actor_rollout_ref.actor.use_kl_loss=true" in root
    assert "actor_rollout_ref.actor.kl_loss_coef=0.001" in root
    archive.spawn("grpo", "dapo", algorithm=prior_source("dapo"))
    dapo = node_launch(archive, "dapo", dry_run=True).overrides
    assert "actor_rollout_ref.actor.use_kl_loss=false" in dapo
    assert "actor_rollout_ref.actor.kl_loss_coef=0.0" in dapo


@pytest.mark.slow
def test_launch_opens_the_nodes_mlflow_run(archive):
    import mlflow

    from engine.archive.tracking import find_runs, set_uri
    from engine.operators.verl_launch import node_launch

    launch = node_launch(archive, "grpo", dry_run=False)
    assert Path(launch.files["algorithm"]).read_text() == archive.algorithm("grpo")
    assert Path(launch.files["train"]).is_file() and Path(launch.files["val"]).is_file()
    runs = find_runs(archive, "grpo")
    assert [r.info.run_id for r in runs] == [launch.env["MLFLOW_RUN_ID"]]
    # what verl's MLflow logger does with these variables: attach to the run and log into it
    set_uri(launch.env["MLFLOW_TRACKING_URI"])
    with mlflow.start_run(run_id=launch.env["MLFLOW_RUN_ID"]):
        mlflow.log_metric("critic/score/mean", 0.5, step=1)
    assert find_runs(archive, "grpo")[0].data.metrics["critic/score/mean"] == 0.5


@pytest.mark.slow
def test_cli_train_dry_run(cli, archive):
    out = cli(
        "train",
        "grpo",
        "--backend",
        "verl",
        "--dry-run",
        "--hparam",
        "clip_ratio_high=0.28",
        "--set",
        "trainer.total_epochs=1",
        "--archive",
        str(archive.path),
    )
    assert out.returncode == 0, out.stderr
    assert "actor_rollout_ref.actor.clip_ratio_high=0.28" in out.stdout
    assert (
        "trainer.total_epochs=1" in out.stdout and "trainer.total_epochs=8" not in out.stdout
    )  # --set replaces
    assert "-m verl.trainer.main_ppo" in out.stdout and "MLFLOW_RUN_ID=" in out.stdout
    assert (
        "algorithm.adv_estimator=poise_grpo" in out.stdout
        and "actor_rollout_ref.rollout.n=8" in out.stdout
    )
    assert not (Path(archive.path) / ".poise" / "verl").exists()  # a dry run writes nothing
    bad = cli("train", "grpo", "--backend", "proxy", "--archive", str(archive.path))
    assert bad.returncode == 1 and "unknown training backend" in bad.stderr


def test_cli_smoke_refuses_bad_input_before_starting_verl(cli, archive):
    """One clear line and no verl run, no MLflow run, no result for input that cannot work."""
    a = str(archive.path)
    bad_hparam = cli(
        "train", "grpo", "--backend", "verl", "--smoke", "--hparam", "nosuch=1", "-C", a
    )
    assert bad_hparam.returncode == 1 and "unknown hyperparameters" in bad_hparam.stderr
    dry = cli("train", "grpo", "--backend", "verl", "--smoke", "--dry-run", "-C", a)
    assert dry.returncode == 1 and "drop --smoke" in dry.stderr
    proxy = cli("evaluate", "grpo", "--smoke", "-C", a)
    assert proxy.returncode == 2 and "--backend verl" in proxy.stderr
    assert not archive.nodes()["grpo"].results
    assert not (Path(a) / ".poise" / "verl" / "smoke" / "nodes").exists()


def test_verl_runs_the_static_check_whatever_the_verification_record_says(cli, archive, tmp_path):
    """verification.json is a file in the archive: a pushed branch can carry one made for its own
    algorithm.py. verl runs the code outside the sandbox, so the gate runs the static check again:
    code that would run at import never does."""
    from conftest import mark_verified

    from trainer_template import ALGORITHM_FILE

    marker = tmp_path / "ran-in-the-engine"
    head = f"RAN = open({str(marker)!r}, 'w').write('x')\n\n# ALGO LOGIC"
    src = ALGORITHM_FILE.read_text().replace("# ALGO LOGIC", head, 1)
    archive.spawn("grpo", "forged", algorithm=src)
    mark_verified(archive, "forged")  # the record a pushed branch can forge
    a = str(archive.path)
    for args in (
        ("train", "forged", "--backend", "verl", "--dry-run"),
        ("train", "forged", "--backend", "verl", "--smoke"),
        ("evaluate", "forged", "--backend", "verl", "--smoke"),
        ("evaluate", "forged", "--backend", "verl"),
    ):
        r = cli(*args, "-C", a)
        assert r.returncode == 1 and "refuses 'forged'" in r.stderr, (args, r.stderr)
        assert "fails the static check" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists() and not (Path(a) / ".poise" / "verl").exists()


@pytest.mark.slow  # several CLI processes / a sandboxed verification: seconds of CPU each
def test_verl_refuses_unverified_code_before_running_it(cli, archive):
    """verl runs a candidate outside the sandbox, so train, its dry run and the smokes refuse a node
    whose exact algorithm.py is not verified."""
    from conftest import mark_verified

    edit = (
        "def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:\n"
        "    return batch.rewards.to(torch.float32) - 0.5\n"
    )
    archive.spawn("grpo", "fresh", edit)
    a = str(archive.path)
    for args in (
        ("train", "fresh", "--backend", "verl", "--dry-run"),
        ("train", "fresh", "--backend", "verl", "--smoke"),
        ("evaluate", "fresh", "--backend", "verl", "--smoke"),
    ):
        r = cli(*args, "-C", a)
        assert r.returncode == 1 and "refuses 'fresh'" in r.stderr, (args, r.stderr)
        assert "never verified" in r.stderr and "Traceback" not in r.stderr
    assert not (Path(a) / ".poise" / "verl").exists() and not archive.nodes()["fresh"].results
    mark_verified(archive, "fresh")
    ok = cli("train", "fresh", "--backend", "verl", "--dry-run", "-C", a)
    assert ok.returncode == 0 and "-m verl.trainer.main_ppo" in ok.stdout, ok.stderr


def _proxy_view(n_prompts=4, group=6, t=12, seed=3):
    """One step's rollout as the CPU proxy sees it (trainer_template/proxy/rl.py): contiguous groups,
    binary rewards = correct, correct implies valid, lengths = the response mask's row sums, each
    response's mean token entropy over its mask; one group all invalid, one all correct."""
    gen = torch.Generator().manual_seed(seed)
    n = n_prompts * group
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    valid = torch.rand(n, generator=gen) < 0.75
    correct = valid & (torch.rand(n, generator=gen) < 0.5)
    valid[:group], correct[:group] = False, False  # prompt 0: every response invalid
    valid[group : 2 * group], correct[group : 2 * group] = True, True  # prompt 1: all correct
    ent = torch.rand(n, t, generator=gen) * 2.0
    mf = mask.to(torch.float32)
    batch = RolloutBatch(
        rewards=correct.to(torch.float32),
        group=torch.arange(n_prompts).repeat_interleave(group),
        valid=valid,
        correct=correct,
        lengths=mask.sum(1),
        token_entropy=(ent * mf).sum(1) / mf.sum(1).clamp(min=1),
        progress=0.5,
    )
    return batch, mask, ent


@pytest.mark.parametrize("prior", list_priors())
def test_bridge_advantages_equal_the_proxys_for_every_prior(prior, monkeypatch):
    """The same rollout, in shuffled row order as verl may hold it, through the poise_sync trainer's
    advantage step (reward extras routed as valid / correct, token entropy from verl's `entropy`
    field, uids as labels) and verl's compute_advantage, gives each prior the advantages the proxy's
    batch gives it, broadcast over each response's tokens and zero on padding."""
    from trainer_template.verl_backend import trainer as trainer_mod

    proxy, mask, ent = _proxy_view()
    mod = load_algorithm(prior_source(prior), prior)
    expected = mod.compute_advantages(proxy, make_config(mod))
    perm = torch.randperm(proxy.size, generator=torch.Generator().manual_seed(7))
    n, t = mask.shape
    tok = torch.zeros(n, t)
    last = proxy.lengths[perm] - 1
    tok[torch.arange(n), last] = proxy.rewards[perm]  # verl's score sits on the last response token
    data = DataProto.from_dict(
        tensors={"token_level_rewards": tok, "response_mask": mask[perm].to(torch.int64)},
        non_tensors={"uid": np.array([f"u{int(g)}" for g in proxy.group[perm]], dtype=object)},
    )
    records = [
        {"format_valid": float(v), "acc": float(c), "score": float(c)}
        for v, c in zip(proxy.valid[perm].tolist(), proxy.correct[perm].tolist())
    ]
    monkeypatch.setattr(
        trainer_mod,
        "_get",
        lambda batch, fields: {"response_mask": mask[perm].to(torch.int64), "entropy": ent[perm]},
    )
    name = register_node(f"vb_same_{prior}", prior_source(prior))

    class Base:
        global_steps, total_training_steps = 3, 5  # 0-based step 2 of 5: progress 0.5

        def _compute_advantage(self, batch, metrics):
            return compute_advantage(batch, adv_estimator=name, config=None)

    class Trainer(ExtrasRoutingMixin, Base):
        def _poise_reward_extras(self, batch):
            return extras_from_records(records)

    out = Trainer()._compute_advantage(data, {})
    adv = out.batch["advantages"]
    assert torch.allclose(adv, expected[perm].unsqueeze(-1) * mask[perm], atol=1e-5)
    assert torch.equal(adv, out.batch["returns"])


@pytest.mark.slow
def test_the_verl_run_carries_the_jobs_tags_so_a_dead_workers_run_is_ended(archive):
    """The loop's verl evaluation hands its job's tags (poise.run, poise.round) to the run verl
    logs into, as the proxy's seed runs carry them: a worker killed mid-training leaves that run
    RUNNING, and only the job's tags let the loop mark it KILLED without touching another
    process's run of the node."""
    from engine.archive.tracking import end_dangling_runs, find_runs, mlflow_client
    from engine.operators.verl_launch import node_launch

    job_tags = {"poise.run": "r7", "poise.round": "2"}
    launch = node_launch(archive, "grpo", tags=job_tags)
    rid = launch.env["MLFLOW_RUN_ID"]
    (run,) = find_runs(archive, "grpo")
    assert run.data.tags["poise.run"] == "r7" and run.data.tags["poise.backend"] == "verl"
    mlflow_client(archive.path).update_run(
        rid, status="RUNNING"
    )  # as verl killed mid-run leaves it
    assert end_dangling_runs(archive, "grpo", job_tags) == 1
    assert find_runs(archive, "grpo")[0].info.status == "KILLED"
