"""verl's hybrid actor/rollout/ref worker for the CPU platform (see :mod:`cpu_platform`).

Imported only by the trainer when ``VERL_PLATFORM=cpu`` (importing verl's workers is slow); Ray
pickles the class by reference, so it lives at module level here.
"""

from __future__ import annotations

from verl.workers.engine_workers import ActorRolloutRefWorker

from trainer_template.verl_backend.cpu_platform import init_gloo_process_group


class CPUActorRolloutRefWorker(ActorRolloutRefWorker):
    """``ActorRolloutRefWorker`` that opens torch.distributed with plain ``gloo`` at construction
    (verl's Worker has exported RANK / WORLD_SIZE / MASTER_* by then), before verl's engine would
    ask for ``"cpu:gloo,cpu:gloo"``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        init_gloo_process_group()
