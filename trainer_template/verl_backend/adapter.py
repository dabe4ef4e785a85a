"""Wrap a node's mechanism in verl 0.9.1's signatures and register it under the node's name.

Estimator: ``fn(token_level_rewards [B,T], response_mask [B,T], index (np.ndarray of uids), config,
**kw) -> (advantages [B,T], returns [B,T])``; the node's sequence advantages [B] are broadcast over the
response tokens and masked. ``valid`` / ``correct`` come from :func:`routed_extras` (set by the trainer
subclass from the reward function's extras); without them every response counts as valid and a
response is correct when its reward is positive. The response lengths are counted from the mask only
if the mechanism reads ``batch.lengths``, so GRPO-like mechanisms make two [B, T] passes, as verl does.

Policy loss: ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights) -> (loss, metrics)``. verl passes it no training progress or entropy: the trainer
installs this step's :class:`TrainingState` in each actor worker process before the update
(:func:`install_training_state`, a process-global read by the loss), and the node's ``policy_loss``
receives it as ``state``. verl adds the KL-to-reference and entropy terms itself
(``actor.use_kl_loss`` / ``actor.entropy_coeff``), so the node's own coefficients are zeroed here and
carried into verl's config by the launcher instead. The entropy weight is the node's per step: with the
state, the worker sets the ``entropy_coeff`` its actor loss reads to the node's
``entropy_coefficient(cfg, state, state.entropy)`` (:func:`install_training_state_in_actor`), so an
adaptive or annealed controller acts on verl as on the proxy. The node's loss is normalised over its
micro-batch; it is rescaled to verl's global-batch normalisation (``config.global_batch_info``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from trainer_template.interface import RolloutBatch, TrainingState, call_policy_loss
from trainer_template.loader import load_algorithm, make_config
from trainer_template.verl_backend import registered_name

_EXTRAS: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "poise_reward_extras", default=None
)
_REGISTERED: dict[str, str] = {}  # registered name -> sha1 of (source, hparams)
_STATE: list[TrainingState | None] = [None]  # this process's training state (set per step)
_NODES: dict[str, tuple[Any, Any]] = {}  # registered name -> (the node's module, its cfg)
# measured entropies (nats) at which a coefficient is probed when verl measured none: far apart, and
# 100 is above any token entropy (ln of a 150k vocabulary is 12)
_PROBE_ENTROPIES = (0.0, 100.0)

VALID_KEYS = ("valid", "format_valid")
CORRECT_KEYS = ("correct", "acc")


class VerlRegistrationError(ValueError):
    """A node could not be registered with verl (a name clash with different code, or bad source)."""


class EntropyCoefficientError(ValueError):
    """A node's ``entropy_coefficient`` gave verl no usable weight for a step (not a finite number, or
    it raised), or verl's actor loss config could not be found to set it on."""


@contextlib.contextmanager
def routed_extras(
    valid=None, correct=None, progress: float | None = None, token_entropy=None
) -> Iterator[dict]:
    """Make per-sample ``valid`` / ``correct`` / ``token_entropy`` [B] and training ``progress``
    visible to the estimator; yields a dict in which the estimator leaves the sequence advantages
    [B] it computed (key ``advantages``, a CPU tensor)."""
    sink: dict = {}
    token = _EXTRAS.set(
        {
            "valid": valid,
            "correct": correct,
            "progress": progress,
            "token_entropy": token_entropy,
            "sink": sink,
        }
    )
    try:
        yield sink
    finally:
        _EXTRAS.reset(token)


def install_training_state(state: TrainingState | Mapping[str, Any] | None) -> None:
    """Set the :class:`TrainingState` this process's policy losses receive (None clears it)."""
    if state is not None and not isinstance(state, TrainingState):
        state = TrainingState(**dict(state))
    _STATE[0] = state


def node_entropy_coefficient(name: str, state: TrainingState | None) -> float | None:
    """The weight of verl's entropy term this step for the node registered as ``name``: its
    ``entropy_coefficient(cfg, state, state.entropy)`` (the cfg with its own ``entropy_coef``, which
    the controllers add to). None when ``name`` is no node of this process or the node defines no
    ``entropy_coefficient`` (verl's constant ``actor.entropy_coeff`` stays).

    A negative weight is an entropy penalty, applied as the proxy applies it (DCBE-GRPO's controller
    above its target). Without a measured entropy (verl writes it in its old-log-prob pass, which
    only rollout-correction bypass mode skips) the coefficient is used only if it does not depend on
    it: it is evaluated at 0 and 100 nats and must agree (GRPO's constant does)."""
    entry = _NODES.get(name)
    if entry is None:
        return None
    module, cfg = entry
    fn = getattr(module, "entropy_coefficient", None)
    if not callable(fn):
        return None
    where = f"{name}: entropy_coefficient"
    if state is not None and state.entropy is not None:
        where += f" at step {state.step} (measured entropy {state.entropy:.6g} nats)"
        probes = (float(state.entropy),)
    else:
        probes = _PROBE_ENTROPIES
    values = []
    for measured in probes:
        try:
            value = float(fn(cfg, state, measured))
        except Exception as exc:  # noqa: BLE001 - the node's code may raise anything
            raise EntropyCoefficientError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        if not math.isfinite(value):
            raise EntropyCoefficientError(
                f"{where} returned {value}; verl's entropy weight must be a finite number"
            )
        values.append(value)
    if len(set(values)) > 1:
        raise EntropyCoefficientError(
            f"{where} depends on the measured entropy, and verl measured none this step "
            "(its old-log-prob pass writes it; rollout-correction bypass mode skips that pass)"
        )
    return values[0]


def _actor_loss_configs(actor: Any) -> list[Any]:
    """The actor configs verl 0.9.1's ``ppo_loss`` reads ``entropy_coeff`` from in this worker process.

    In an engine ``ActorRolloutRefWorker`` that is the ``config`` its loss function
    (``functools.partial(ppo_loss, config=...)``, handed to its ``TrainingWorker`` ``actor`` by
    ``set_loss_fn``) is bound to. verl's trainer runs the worker colocated: the Ray actor that
    ``__ray_call__`` reaches is a ``WorkerDict`` (``worker_dict``: {role: worker}) or a ``FusedWorker``
    (``fused_worker_dict``), so the workers inside it are searched too."""
    inner = [actor]
    for attr in ("worker_dict", "fused_worker_dict"):
        found = getattr(actor, attr, None)
        if isinstance(found, Mapping):
            inner.extend(found.values())
    configs: dict[int, Any] = {}
    for worker in inner:
        for owner in (getattr(worker, "actor", None), worker):
            keywords = getattr(getattr(owner, "loss_fn", None), "keywords", None) or {}
            config = keywords.get("config")
            if config is not None and hasattr(config, "entropy_coeff"):
                configs[id(config)] = config
    return list(configs.values())


def set_entropy_coeff(actor: Any, value: float) -> None:
    """Set the entropy weight the worker ``actor``'s loss applies in its next updates. verl freezes its
    config dataclasses (``BaseConfig.__setattr__``) because its weight is a constant; this one field
    of the worker's own copy is set for the step, before verl's update reads it."""
    configs = _actor_loss_configs(actor)
    if not configs:
        raise EntropyCoefficientError(
            f"no actor loss config in {type(actor).__name__} to set the node's entropy weight on "
            "(expected verl 0.9.1's engine worker: actor.loss_fn = partial(ppo_loss, config=...))"
        )
    for config in configs:
        object.__setattr__(config, "entropy_coeff", float(value))


def install_training_state_in_actor(
    actor: Any, state: Mapping[str, Any] | None, node: str | None = None
) -> float | None:
    """``__ray_call__`` target: the trainer runs it in each actor worker before the update. Installs
    ``state`` and, when ``node`` (the registered name, verl's ``policy_loss.loss_mode``) defines
    ``entropy_coefficient``, sets the worker's entropy weight to its value for this step; returns
    that weight (None: verl's constant stays)."""
    install_training_state(state)
    if node is None:
        return None
    value = node_entropy_coefficient(node, _STATE[0])
    if value is not None:
        set_entropy_coeff(actor, value)
    return value


def extras_from_mapping(
    extras: Mapping[str, Any], n: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(valid, correct) bool arrays [n] from a reward-extras mapping {key: per-sample values}."""

    def pick(keys):
        for k in keys:
            if k in extras and extras[k] is not None:
                arr = np.asarray(
                    [bool(v) if v is not None else False for v in list(extras[k])], dtype=bool
                )
                if arr.shape != (n,):
                    raise ValueError(
                        f"reward extra {k!r} has {arr.shape[0]} values for {n} responses"
                    )
                return arr
        return None

    return pick(VALID_KEYS), pick(CORRECT_KEYS)


def extras_from_records(records: Sequence[Mapping[str, Any] | None]) -> dict[str, list]:
    """Column-wise extras from per-sample ``reward_extra_info`` dicts (None / missing keys -> None)."""
    keys = sorted({k for r in records if r for k in r})
    return {k: [(r or {}).get(k) for r in records] for k in keys}


def _group_ids(index, n: int, device) -> torch.Tensor:
    """Dense group ids [n] from verl's uid array (any hashable labels; first-seen order). No uids is
    an error, as in verl's own GRPO: a group of one per response would give every mechanism's group
    statistics nothing to compare, silently."""
    if index is None:
        raise ValueError(
            "the batch carries no uid (verl's `index`): group advantages need the prompt group "
            "of each response; run through verl's trainer, which sets one per prompt"
        )
    if isinstance(index, torch.Tensor):
        return index.reshape(-1).to(device=device, dtype=torch.long)
    try:  # pandas (a verl dependency) factorizes object arrays of uids in C: ~5x a Python dict
        import pandas as pd  # lazy: optional dependency (its ImportError is handled here)

        codes = pd.factorize(np.asarray(index, dtype=object).reshape(-1))[0]
        return torch.from_numpy(codes.astype(np.int64)).to(device)
    except (ImportError, TypeError):
        seen: dict = {}
        labels = index.tolist() if hasattr(index, "tolist") else list(index)
        ids = [
            seen.setdefault(u if isinstance(u, (str, int)) else str(u), len(seen)) for u in labels
        ]
        return torch.tensor(ids, dtype=torch.long, device=device)


def _row_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim of a [B, T] tensor (``sum(-1)``: measured ~5x faster than a matrix-vector
    product on 2048 x 3000 with an idle CPU)."""
    return x.sum(dim=-1)


def _token_counts(response_mask: torch.Tensor):
    """A function returning the response lengths [B] long; :class:`RolloutBatch` calls it only when the
    mechanism reads ``batch.lengths`` (GRPO never does: one [B, T] pass saved)."""

    def count() -> torch.Tensor:
        n = _row_sum(response_mask)
        return (n.round() if n.is_floating_point() else n).to(torch.long)

    return count


def make_estimator(module, cfg):
    """verl-signature advantage estimator calling ``module.compute_advantages(batch, cfg)``."""

    def poise_estimator(token_level_rewards, response_mask, index=None, config=None, **_: Any):
        with torch.no_grad():
            rewards = _row_sum(token_level_rewards).to(torch.float32)
            n = rewards.shape[0]
            if tuple(response_mask.shape) != tuple(token_level_rewards.shape):
                raise ValueError(
                    f"response_mask {tuple(response_mask.shape)} and token_level_rewards "
                    f"{tuple(token_level_rewards.shape)} must have the same shape [B, T]"
                )
            extras = _EXTRAS.get() or {}
            valid, correct = extras.get("valid"), extras.get("correct")
            dev = rewards.device
            valid_t = (
                torch.ones(n, dtype=torch.bool, device=dev)
                if valid is None
                else torch.as_tensor(np.asarray(valid), dtype=torch.bool, device=dev)
            )
            correct_t = (
                rewards > 0
                if correct is None
                else torch.as_tensor(np.asarray(correct), dtype=torch.bool, device=dev)
            )
            progress = float(extras.get("progress") or 0.0)
            ent = extras.get("token_entropy")
            ent_t = (
                None
                if ent is None
                else torch.as_tensor(np.asarray(ent), dtype=torch.float32, device=dev).reshape(-1)
            )
            if ent_t is not None and ent_t.shape[0] != n:
                raise ValueError(f"token_entropy has {ent_t.shape[0]} values for {n} responses")
            batch = RolloutBatch(
                rewards=rewards,
                group=_group_ids(index, n, dev),
                valid=valid_t,
                correct=correct_t,
                lengths=_token_counts(response_mask),
                token_entropy=ent_t,
                progress=min(max(progress, 0.0), 1.0),
            )
            adv = module.compute_advantages(batch, cfg)
            if tuple(adv.shape) != (n,) or not torch.isfinite(adv).all():
                raise ValueError(
                    f"compute_advantages must return finite advantages of shape [{n}], got {tuple(adv.shape)}"
                )
            sink = extras.get("sink")
            if sink is not None:
                sink["advantages"] = adv.detach().to("cpu", torch.float32)
            out = adv.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask
        return out, out

    return poise_estimator


def _global_scale(
    mask: torch.Tensor, mode: str, info: Mapping[str, Any] | None
) -> float | torch.Tensor:
    """Factor turning a micro-batch-normalised loss into verl's global-batch normalisation."""
    info = dict(info or {})
    dp = info.get("dp_size") or 1
    m = mask.to(torch.float32)
    if mode == "token-mean":
        total = info.get("batch_num_tokens")
        return 1.0 if total is None and dp == 1 else m.sum().clamp(min=1.0) * dp / float(total)
    seqs = (m.sum(-1) > 0).to(torch.float32).sum().clamp(min=1.0)
    gbs = info.get("global_batch_size")
    scale = 1.0 if gbs is None and dp == 1 else seqs * dp / float(gbs)
    if mode == "seq-mean-token-sum-norm" and info.get("loss_scale_factor") is not None:
        scale = scale * mask.shape[-1] / float(info["loss_scale_factor"])
    return scale


def make_policy_loss(module, cfg):
    """verl-signature policy loss calling ``module.policy_loss`` (KL / entropy left to verl)."""
    fields = {f.name for f in dataclasses.fields(cfg)} if dataclasses.is_dataclass(cfg) else set()
    zeroed = {k: 0.0 for k in ("kl_coef", "entropy_coef") if k in fields}

    def poise_policy_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode="token-mean",
        config=None,
        rollout_is_weights=None,
    ):
        if rollout_is_weights is not None:
            raise ValueError(
                "poise policy losses do not support rollout correction weights; unset algorithm.rollout_correction"
            )
        node_cfg = (
            dataclasses.replace(
                cfg,
                **zeroed,
                **({"loss_agg_mode": loss_agg_mode} if "loss_agg_mode" in fields else {}),
            )
            if fields
            else cfg
        )
        loss, metrics = call_policy_loss(
            module.policy_loss,
            log_prob,
            old_log_prob,
            advantages,
            response_mask,
            node_cfg,
            state=_STATE[0],  # installed by the trainer for this step (None outside a run)
        )
        info = getattr(config, "global_batch_info", None) if config is not None else None
        loss = loss * _global_scale(response_mask, loss_agg_mode, info)
        mask = response_mask.to(log_prob.dtype)
        ppo_kl = ((old_log_prob - log_prob) * mask).sum() / mask.sum().clamp(min=1.0)
        out = {"actor/ppo_kl": float(ppo_kl.detach())}
        coeff = getattr(config, "entropy_coeff", None) if config is not None else None
        if isinstance(coeff, (int, float)):  # the weight verl's ppo_loss gives the entropy next
            out["actor/poise_entropy_coeff"] = float(coeff)
        state = _STATE[0]
        if state is not None:  # what the node's loss was given (shows the state reached the worker)
            out["actor/poise_state_progress"] = float(state.progress)
            out["actor/poise_state_step"] = float(state.step)
        for k, v in metrics.items():
            out[f"actor/{k}" if not k.startswith("actor/") else k] = float(v)
        return loss, out

    return poise_policy_loss


def register_node(node: str, source: str, hparams: Mapping[str, Any] | None = None) -> str:
    """Register ``node``'s estimator and policy loss with verl as ``poise_<node>``; returns that name.

    Re-registering the same source and hyperparameters is a no-op (Ray workers may import twice);
    a different mechanism under a name already taken is rejected.
    """
    from verl.trainer.ppo import core_algos  # lazy: optional dependency (verl extra)

    name = registered_name(node)
    digest = hashlib.sha1(
        (source + "\0" + json.dumps(dict(hparams or {}), sort_keys=True)).encode()
    ).hexdigest()
    if name in _REGISTERED:
        if _REGISTERED[name] != digest:
            raise VerlRegistrationError(
                f"verl name {name!r} is already registered to a different mechanism"
            )
        return name
    if name in core_algos.ADV_ESTIMATOR_REGISTRY or name in core_algos.POLICY_LOSS_REGISTRY:
        raise VerlRegistrationError(f"verl already has an estimator or policy loss named {name!r}")
    try:
        module = load_algorithm(source, node)
        cfg = make_config(module, hparams)
    except Exception as exc:
        raise VerlRegistrationError(str(exc)) from exc
    core_algos.register_adv_est(name)(make_estimator(module, cfg))
    core_algos.register_policy_loss(name)(make_policy_loss(module, cfg))
    _REGISTERED[name] = digest
    _NODES[name] = (module, cfg)
    return name


def compute_advantage_with_extras(
    data, adv_estimator: str, progress: float | None = None, token_entropy=None, **kwargs
):
    """verl's own ``compute_advantage`` with the reward extras of ``data.non_tensor_batch`` routed in."""
    # lazy: optional dependency (verl extra)
    from verl.trainer.ppo.ray_trainer import compute_advantage

    valid, correct = extras_from_mapping(data.non_tensor_batch, len(data))
    with routed_extras(valid, correct, progress, token_entropy):
        return compute_advantage(data, adv_estimator=adv_estimator, **kwargs)
