"""verl on the CPU: a device platform for verl's platform registry and a gloo-initialised worker.

Product feature, not a test fixture: with ``VERL_PLATFORM=cpu`` (set by the smoke launch) the plugin
registers :class:`CPUPlatform` under the name ``cpu`` before verl resolves its platform, so verl's
device helpers answer ``cpu`` / ``torch.device('cpu')`` and ``gloo``. verl 0.9.1 keeps asking Ray
for its accelerator resource (``GPU``): the smoke starts Ray with one *logical* GPU, which only
lets the placement groups resolve; nothing touches CUDA.

verl's ``TrainingWorker`` initialises torch.distributed with ``"cpu:gloo,<device>:<backend>"``,
which torch rejects when the device is itself ``cpu`` (duplicate device type). The trainer therefore
maps the actor/rollout/ref role to ``cpu_worker.CPUActorRolloutRefWorker`` on this platform, which
opens the process group with plain ``gloo`` first (:func:`init_gloo_process_group`); verl then finds it
initialised and goes on unchanged.
"""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

PLATFORM = "cpu"
ENV_PLATFORM = "VERL_PLATFORM"  # verl's own switch (verl.plugin.platform.platform_manager)


def active() -> bool:
    """True in a process started for the CPU smoke (``VERL_PLATFORM=cpu``)."""
    return os.environ.get(ENV_PLATFORM, "").strip().lower() == PLATFORM


def _noop(*_a: Any, **_k: Any) -> None:
    return None


def _device_module() -> SimpleNamespace:
    """What verl calls on ``torch.<device>``: torch.cpu's functions, memory queries answering 0 and
    cache/allocator calls as no-ops; the RNG state is torch's (CPU) generator."""
    cpu = torch.cpu
    return SimpleNamespace(
        is_available=lambda: False,  # verl's memory helpers skip accelerator bookkeeping
        current_device=lambda: 0,
        device_count=lambda: 1,
        set_device=_noop,
        synchronize=_noop,
        current_stream=cpu.current_stream,
        stream=cpu.stream,
        Stream=cpu.Stream,
        Event=cpu.Event,
        empty_cache=_noop,
        ipc_collect=_noop,
        set_per_process_memory_fraction=_noop,
        memory_allocated=lambda *_a, **_k: 0,
        memory_reserved=lambda *_a, **_k: 0,
        max_memory_allocated=lambda *_a, **_k: 0,
        max_memory_reserved=lambda *_a, **_k: 0,
        reset_peak_memory_stats=_noop,
        mem_get_info=lambda *_a, **_k: (0, 0),
        get_device_name=lambda *_a, **_k: "cpu",
        get_rng_state=lambda *_a, **_k: torch.get_rng_state(),
        set_rng_state=lambda state, *_a, **_k: torch.set_rng_state(state),
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
    )


def _platform_class():
    from verl.plugin.platform import PlatformBase  # lazy: optional dependency (verl extra)

    class CPUPlatform(PlatformBase):
        """verl platform for the host CPU: device ``cpu``, collectives ``gloo``, Ray resource ``GPU``
        (logical: the smoke's Ray is started with ``num_gpus=1`` so verl's placement groups resolve)."""

        _module = _device_module()

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self):
            return self._module

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return active()  # never auto-detected: only an explicit VERL_PLATFORM=cpu selects it

        def current_device(self):
            return torch.device("cpu")

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    return CPUPlatform


_REGISTERED: list[type] = []


def register_cpu_platform() -> type:
    """Register the CPU platform with verl's ``PlatformRegistry`` as ``cpu`` (idempotent)."""
    if _REGISTERED:
        return _REGISTERED[0]
    from verl.plugin.platform import PlatformRegistry  # lazy: optional dependency (verl extra)

    cls = PlatformRegistry.register(platform=PLATFORM)(_platform_class())
    _REGISTERED.append(cls)
    return cls


def init_gloo_process_group() -> None:
    """Open torch.distributed's default group with ``gloo`` from verl's worker environment (RANK,
    WORLD_SIZE, MASTER_ADDR / MASTER_PORT, set by verl's Worker); no-op when already open."""
    if dist.is_initialized():
        return
    dist.init_process_group(
        backend="gloo",
        rank=int(os.environ.get("RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        init_method=os.environ.get("DIST_INIT_METHOD") or None,
    )
