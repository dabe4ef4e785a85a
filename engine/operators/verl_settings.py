"""A node's verl settings, computed in a sandboxed child: the verl path needs the node's
``Hyperparameters`` (with the ``--hparam`` overrides applied) on the engine's side only as the
loss-side settings verl shares with it, and reading them runs the node's code — its module body,
its ``__post_init__`` and field factories. The child (``trainer_template.verl_backend.settings``)
does that behind the sandbox and sends one frame; the engine checks it as untrusted data (known
names, numbers finite, names short printable text) and never executes the node's code itself.

Everything that goes wrong is one :class:`~trainer_template.loader.AlgorithmLoadError` line, before
any MLflow run is opened: the child's own error (a source that fails to load, an unknown
hyperparameter, a ``Hyperparameters`` that raises) or how the child ended (a limit, a malformed frame,
no frame at all).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.sandbox.channel import ChannelError, plain_data, text
from engine.sandbox.limits import Limits
from engine.sandbox.runner import Session, run_sandboxed
from trainer_template.loader import AlgorithmLoadError
from trainer_template.verl_backend.settings import NUMBER_SETTINGS, TEXT_SETTINGS

SETTINGS_CHILD = "trainer_template.verl_backend.settings"
SETTINGS_LIMITS = Limits(wall_s=120.0, cpu_s=60.0, memory_mb=3072, channel_mb=1)
"""the child imports torch (the node's module does) and sends one small frame"""
MAX_SETTING_TEXT = 200
"""characters of a name setting (``loss_agg_mode``, ``kl_type``)"""


def checked_settings(value: Any) -> dict[str, Any]:
    """The settings a child sent, when they are what verl's command line may take: an object of
    known names, each a finite number (``kl_coef`` also null) or a short printable name; else
    ChannelError."""
    plain_data(value, "settings", max_items=64, max_depth=1, max_text=MAX_SETTING_TEXT)
    if not isinstance(value, dict):
        raise ChannelError("settings: not an object")
    unknown = sorted(set(value) - {*NUMBER_SETTINGS, *TEXT_SETTINGS})
    if unknown:
        raise ChannelError(f"settings: unknown names {[text(k, 40) for k in unknown][:8]}")
    for k, v in value.items():
        if k in TEXT_SETTINGS:
            ok, kind = isinstance(v, str), "a name"
        else:
            number = isinstance(v, (int, float)) and not isinstance(v, bool)
            ok, kind = number or (v is None and k == "kl_coef"), "a number"
        if not ok:
            raise ChannelError(f"settings: {k!r} is not {kind}")
    return dict(value)


class _Receiver:
    """``on_frame`` of the settings child: exactly one ``settings`` or ``error`` frame."""

    def __init__(self) -> None:
        self.settings: dict[str, Any] | None = None
        self.error: str | None = None

    def __call__(self, frame: dict, _session: Session) -> None:
        if self.settings is not None or self.error is not None:
            raise ChannelError("a frame after the settings")
        if frame["type"] == "settings":
            self.settings = checked_settings(frame.get("settings"))
        elif frame["type"] == "error":
            self.error = text(frame.get("message", ""), 1000) or "failed"
        else:
            raise ChannelError(f"unexpected frame type {text(frame['type'], 40)!r}")


def verl_settings(
    source: str,
    node: str,
    hparams: Mapping[str, Any] | None = None,
    *,
    limits: Limits = SETTINGS_LIMITS,
    boundary=None,
) -> dict[str, Any]:
    """The verl settings of ``node`` whose algorithm.py is ``source``, with ``hparams`` applied (plain
    data for ``trainer_template.verl_backend.launch``); AlgorithmLoadError when they cannot be had."""
    for k, v in (hparams or {}).items():  # the user's input: said as such, before any child runs
        try:
            plain_data(v, f"hyperparameter override {k}", max_depth=2)
        except ChannelError as exc:
            raise AlgorithmLoadError(f"{exc} ({k}={v!r})") from None
    got = _Receiver()
    run = run_sandboxed(
        SETTINGS_CHILD,
        [node, "{input}/algorithm.py", "{input}/hparams.json"],
        limits=limits,
        inputs={
            "algorithm.py": source.encode("utf-8"),
            "hparams.json": json.dumps(dict(hparams or {}), sort_keys=True).encode("utf-8"),
        },
        on_frame=got,
        boundary=boundary,
    )
    child = f"{node}/algorithm.py: the sandboxed child reading its verl settings"
    if run.protocol_error:
        raise AlgorithmLoadError(f"{child} {run.reason()}")
    if got.error is not None:
        raise AlgorithmLoadError(got.error)
    if got.settings is None:
        raise AlgorithmLoadError(f"{child} sent none ({run.reason()})")
    if not run.ok:
        raise AlgorithmLoadError(f"{child} {run.reason()}")
    return got.settings
