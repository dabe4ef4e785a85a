"""Route the reward extras ``valid`` / ``correct`` from verl's rollouts to a node's estimator.

verl's V1 trainer calls advantage estimators with rewards, mask and uids only. The reward function's
extras (``format_valid``, ``acc``) are stored per sample in the TransferQueue field ``extra_fields``
(``{"reward_extra_info": {...}}``, written by the agent loop); :class:`ExtrasRoutingMixin` reads them
for the batch being processed (a ``KVBatchMeta``: ``keys``, ``partition_id``) and runs the trainer's
own ``_compute_advantage`` inside :func:`adapter.routed_extras`. :func:`register_trainer` registers
``PPOTrainerSync`` with the mixin as ``trainer.v1.trainer_mode=poise_sync``; verl's base trainer
branches on ``trainer_mode == "sync"`` (replay buffer, refill granularity, queue checkpoints), so the
registered class reports ``sync`` to it and behaves exactly as verl's synchronous trainer otherwise.
"""

from __future__ import annotations

from typing import Any

from trainer_template.verl_backend.adapter import (
    extras_from_mapping,
    extras_from_records,
    routed_extras,
)

TRAINER_MODE = "poise_sync"
EXTRAS_FIELD = "extra_fields"


class ExtrasRoutingMixin:
    """Overrides ``_compute_advantage(batch, metrics)`` to deliver valid / correct to the estimator."""

    def _poise_reward_extras(self, batch) -> dict[str, list]:
        """Column-wise reward extras of ``batch`` (a KVBatchMeta) read from the TransferQueue."""
        import transfer_queue as tq

        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=[EXTRAS_FIELD]
        )
        column = data.get(
            EXTRAS_FIELD, None
        )  # absent when the reward function returned a bare score
        if column is None:
            return {}
        records = []
        for value in list(column):
            fields = getattr(value, "data", value)
            records.append(fields.get("reward_extra_info", {}) if isinstance(fields, dict) else {})
        return extras_from_records(records)

    def _poise_progress(self) -> float:
        total = getattr(self, "total_training_steps", None) or 0
        return min(1.0, float(getattr(self, "global_steps", 0) or 0) / total) if total else 0.0

    def _compute_advantage(self, batch, metrics: dict) -> Any:
        extras = self._poise_reward_extras(batch)
        valid, correct = extras_from_mapping(extras, len(batch))
        if valid is not None:
            metrics["poise/valid_rate"] = float(valid.mean()) if len(valid) else 0.0
        if correct is not None:
            metrics["poise/correct_rate"] = float(correct.mean()) if len(correct) else 0.0
        with routed_extras(valid, correct, self._poise_progress()):
            return super()._compute_advantage(batch, metrics)


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
    import importlib.util

    if (
        importlib.util.find_spec("transfer_queue") is None
    ):  # V1's data plane (the TransferQueue package)
        return None
    try:
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
        from verl.trainer.ppo.v1.trainer_base import register_trainer as _register
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
