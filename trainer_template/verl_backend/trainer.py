"""The ``poise_sync`` trainer: verl's synchronous V1 trainer with the node's view of each step.

verl's V1 trainer calls advantage estimators with rewards, mask and uids only, and policy losses with
log-probabilities and its actor config. :class:`ExtrasRoutingMixin` adds, per step:

- the reward function's extras ``format_valid`` / ``acc`` (stored per sample in the TransferQueue
  field ``extra_fields`` as ``{"reward_extra_info": {...}}`` by the agent loop) routed to the estimator
  as ``valid`` / ``correct``, with the mean per-token entropy of each response (the ``entropy`` field
  verl's old-log-prob pass writes) as ``RolloutBatch.token_entropy`` and the training progress;
- the step's :class:`~trainer_template.interface.TrainingState` (progress, 0-based step, total steps,
  mean response entropy) installed in every actor worker before the update, so the node's
  ``policy_loss`` receives it as ``state``; with it each worker sets verl's entropy weight
  (``actor.entropy_coeff``) to the node's ``entropy_coefficient(cfg, state, state.entropy)`` for the
  step, and verl computes the entropy in the update whenever that weight is non-zero
  (``train/entropy_coef`` logs it);
- the proxy's signal names (``train/reward_mean``, ``train/adv_std``, ... see
  ``trainer_template.proxy.rl.SIGNALS``) beside verl's own metrics, and one JSON line per step in
  ``$POISE_PROGRESS_FILE`` when set (what the engine renders as progress).

:func:`register_trainer` registers ``PPOTrainerSync`` with the mixin as
``trainer.v1.trainer_mode=poise_sync``; verl's base trainer branches on ``trainer_mode == "sync"``
(replay buffer, refill granularity, queue checkpoints), so the registered class reports ``sync`` to it
and behaves exactly as verl's synchronous trainer otherwise. On the CPU platform
(``VERL_PLATFORM=cpu``) the actor/rollout/ref role runs in ``cpu_worker.CPUActorRolloutRefWorker``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from typing import Any

import torch

from trainer_template.verl_backend import cpu_platform
from trainer_template.verl_backend.adapter import (
    EntropyCoefficientError,
    extras_from_mapping,
    extras_from_records,
    install_training_state_in_actor,
    routed_extras,
)

TRAINER_MODE = "poise_sync"
EXTRAS_FIELD = "extra_fields"
ENV_PROGRESS_FILE = "POISE_PROGRESS_FILE"
# proxy signal <- verl metric meaning the same quantity (the others are computed here)
VERL_ALIASES = {
    "train/reward_mean": "critic/score/mean",
    "train/response_length": "response_length/mean",
    "train/clipfrac": "actor/pg_clipfrac",
    "train/grad_norm": "actor/grad_norm",
    "train/pg_loss": "actor/pg_loss",
    "train/step_s": "timing_s/step",
}


def _get(batch, fields: list[str]) -> dict:
    """The named fields of ``batch`` from the TransferQueue; a field the queue lacks is left out
    (only for the optional signals: entropy, reference log-probabilities)."""
    import transfer_queue as tq  # lazy: optional dependency (verl extra)

    out = {}
    for name in fields:
        try:
            data = tq.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=[name]
            )
        except Exception:  # noqa: BLE001 - absent field (e.g. no reference model): skip it
            continue
        value = data.get(name, None)
        if value is not None:
            out[name] = value
    return out


def _padded(value):
    return value.to_padded_tensor(0.0) if getattr(value, "is_nested", False) else value


def _seq_mean(values, mask):
    """Per-response mean over response tokens [B] of a [B, T] tensor."""
    m = mask.to(values.dtype)
    return (values * m).sum(-1) / m.sum(-1).clamp(min=1.0)


class ExtrasRoutingMixin:
    """Overrides ``_compute_advantage``, ``_update_actor`` and ``_compute_metrics`` of verl's trainer."""

    def _poise_reward_extras(self, batch) -> dict[str, list]:
        """Column-wise reward extras of ``batch`` (a KVBatchMeta) read from the TransferQueue."""
        import transfer_queue as tq  # lazy: optional dependency (verl extra)

        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=[EXTRAS_FIELD]
        )
        column = data.get(EXTRAS_FIELD, None)
        if column is None:  # absent when the reward function returned a bare score
            return {}
        records = []
        for value in list(column):
            fields = getattr(value, "data", value)
            records.append(fields.get("reward_extra_info", {}) if isinstance(fields, dict) else {})
        return extras_from_records(records)

    def _poise_progress(self) -> tuple[int, int, float]:
        """(0-based step, total steps, progress = step / (total - 1)) of the step being run."""
        total = int(getattr(self, "total_training_steps", 0) or 0)
        step = max(0, int(getattr(self, "global_steps", 1) or 1) - 1)
        progress = min(1.0, step / (total - 1)) if total > 1 else 0.0
        return step, total, progress

    def _poise_signals(self, batch, n: int) -> dict[str, Any]:
        """token entropy [B] (mean over each response) and the proxy's entropy / KL signals."""
        got = _get(batch, ["response_mask", "entropy", "old_log_probs", "ref_log_prob"])
        out: dict[str, Any] = {}
        if "response_mask" not in got:
            return out
        mask = _padded(got["response_mask"]).to(torch.float32)
        if "entropy" in got:
            ent = _seq_mean(_padded(got["entropy"]).to(torch.float32), mask)
            if ent.shape[0] == n:
                out["token_entropy"] = ent
                out["train/entropy"] = float(ent.mean())
        if "old_log_probs" in got and "ref_log_prob" in got:
            diff = _padded(got["old_log_probs"]) - _padded(got["ref_log_prob"])
            out["train/kl"] = float((diff * mask).sum() / mask.sum().clamp(min=1.0))
        return out

    def _compute_advantage(self, batch, metrics: dict) -> Any:
        n = len(batch)
        extras = self._poise_reward_extras(batch)
        valid, correct = extras_from_mapping(extras, n)
        if valid is not None:
            metrics["poise/valid_rate"] = metrics["train/valid_rate"] = (
                float(valid.mean()) if n else 0.0
            )
        if correct is not None:
            metrics["poise/correct_rate"] = metrics["train/correct_rate"] = (
                float(correct.mean()) if n else 0.0
            )
        signals = self._poise_signals(batch, n)
        entropy = signals.pop("token_entropy", None)
        metrics.update(signals)
        step, total, progress = self._poise_progress()
        self._poise_state = {
            "progress": progress,
            "step": step,
            "total_steps": total,
            "entropy": signals.get("train/entropy"),
        }
        with routed_extras(valid, correct, progress, entropy) as sink:
            out = super()._compute_advantage(batch, metrics)
        adv = sink.get("advantages")
        if adv is not None and adv.numel():
            metrics["train/adv_mean"] = float(adv.mean())
            metrics["train/adv_std"] = float(adv.std()) if adv.numel() > 1 else 0.0
            metrics["train/adv_min"] = float(adv.min())
            metrics["train/adv_max"] = float(adv.max())
        return out

    def _update_actor(self, batch, metrics: dict) -> Any:
        """Install the step's state and the node's entropy weight in every actor worker, then run verl's
        update. verl's driver decides from its own ``actor.entropy_coeff`` whether the update computes
        the entropy (``calculate_entropy or entropy_coeff != 0``), so that value is the step's weight
        while verl's ``_update_actor`` runs, and is put back after it."""
        import ray  # lazy: optional dependency (ray extra)

        state = getattr(self, "_poise_state", None)
        actor = self.config.actor_rollout_ref.actor
        node = actor.policy_loss.get("loss_mode")
        try:
            weights = ray.get(
                [
                    w.__ray_call__.remote(install_training_state_in_actor, state, node)
                    for w in self.actor_rollout_wg.workers
                ]
            )
        except EntropyCoefficientError as exc:  # one line, not the worker's wrapped traceback
            raise EntropyCoefficientError(str(getattr(exc, "cause", None) or exc)) from None
        if len(set(weights)) > 1:
            raise EntropyCoefficientError(
                f"{node}: the actor workers computed different entropy weights {sorted(set(map(str, weights)))}"
            )
        weight = weights[0] if weights else None
        if weight is None:  # the node defines no entropy_coefficient: verl's constant
            metrics["train/entropy_coef"] = float(actor.entropy_coeff)
            return super()._update_actor(batch, metrics)
        metrics["train/entropy_coef"] = weight
        constant = actor.entropy_coeff
        actor.entropy_coeff = weight
        try:
            return super()._update_actor(batch, metrics)
        finally:
            actor.entropy_coeff = constant

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        for ours, theirs in VERL_ALIASES.items():
            if theirs in metrics and ours not in metrics:
                metrics[ours] = float(metrics[theirs])
        path = os.environ.get(ENV_PROGRESS_FILE)
        if path:
            row = {
                "step": int(global_steps),
                "total_steps": int(getattr(self, "total_training_steps", 0) or 0),
                "time": time.time(),
                "metrics": {
                    k: float(v)
                    for k, v in metrics.items()
                    if _is_number(v) and (k.startswith(("train/", "poise/", "actor/", "critic/")))
                },
            }
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row, sort_keys=True) + "\n")

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()

        if cpu_platform.active():
            import ray  # lazy: optional dependency (ray extra)

            # lazy: optional dependency (verl extra)
            from trainer_template.verl_backend.cpu_worker import CPUActorRolloutRefWorker

            for role in list(self.role_worker_mapping):
                if str(role) in ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref"):
                    self.role_worker_mapping[role] = ray.remote(CPUActorRolloutRefWorker)


def _is_number(v: Any) -> bool:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return False
    return math.isfinite(f)


class SyncModeAlias:
    """``trainer_mode`` reads ``sync`` for verl's base trainer, whatever name the class is registered under.

    ``PPOTrainer.__init__`` sets ``self.trainer_mode`` from ``trainer.v1.trainer_mode`` and later code
    tests ``== "sync"``; the registered name is kept in ``registered_mode``."""

    registered_mode: str = TRAINER_MODE

    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        if value not in (TRAINER_MODE, "sync"):
            raise ValueError(
                f"the poise trainer runs as trainer.v1.trainer_mode={TRAINER_MODE}, got {value!r}"
            )
        self.registered_mode = value


def register_trainer() -> type | None:
    """Register ``poise_sync`` (PPOTrainerSync + the mixin); None when verl's V1 stack is not importable."""
    if (
        importlib.util.find_spec("transfer_queue") is None
    ):  # V1's data plane (the TransferQueue package)
        return None
    try:
        # lazy: optional dependency (verl extra)
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

        # lazy: optional dependency (verl extra)
        from verl.trainer.ppo.v1.trainer_base import register_trainer as _register

        # lazy: optional dependency (verl extra)
        from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    except ImportError:
        return None
    existing = TRAINER_REGISTRY.get(TRAINER_MODE)
    if existing is not None:
        return existing
    cls = type(
        "PoisePPOTrainerSync",
        (SyncModeAlias, ExtrasRoutingMixin, PPOTrainerSync),
        {"__module__": __name__},
    )
    return _register(TRAINER_MODE)(cls)
