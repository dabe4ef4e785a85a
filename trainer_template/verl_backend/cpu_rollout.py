"""A CPU rollout for verl 0.9.1: Hugging Face ``generate`` behind verl's rollout-server interface.

vLLM does not run on a CPU. verl's agent loop talks to rollout *servers* (Ray actors with
``generate(prompt_ids, sampling_params, request_id, ...) -> TokenOutput``) that a
``RolloutReplica`` launches, and the hybrid actor worker pushes new weights into them through a
``BaseRollout`` adapter after each step (the V1 trainer's ``naive`` checkpoint engine). This module
provides the three pieces under the rollout name ``poise_hf``:

- :class:`HFGenerateServer`: holds the policy as a ``transformers`` model on the CPU; samples one
  request at a time (temperature / top-k / top-p, per-token log-probabilities of the sampled tokens),
  each request seeded from (rollout seed, weight version, prompt, occurrence of that prompt in the
  step), so a run is reproducible whatever order the agent loop's requests arrive in;
- :class:`HFReplica`: launches one server next to the workers (``RolloutReplicaRegistry``);
- :class:`HFServerAdapter`: the worker-side adapter; ``update_weights`` gathers the full tensors and
  loads them into the server (``verl.workers.rollout.base._ROLLOUT_REGISTRY``, which has no
  registration function, so :func:`register_hf_rollout` adds the entry itself).

:func:`register_hf_rollout` is called by the plugin in every verl process when ``VERL_PLATFORM=cpu``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from typing import Any

import torch

ROLLOUT_NAME = "poise_hf"


def request_seed(base: int, version: int | None, prompt_ids: list[int], occurrence: int) -> int:
    """A 63-bit seed from (seed, weight version, prompt tokens, k-th request of that prompt)."""
    key = json.dumps([int(base), version, list(map(int, prompt_ids)), int(occurrence)])
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") >> 1


def _get(cfg: Any, key: str):
    """``cfg.key`` for an HFModelConfig or its DictConfig (None when absent)."""
    try:
        return cfg.get(key, None) if hasattr(cfg, "get") else getattr(cfg, key, None)
    except Exception:  # noqa: BLE001 - a struct config without the key
        return None


class HFGenerateServer:
    """verl rollout server (token in, token out) around ``model.generate`` on the CPU."""

    def __init__(self, config, model_config, replica_rank: int = 0, seed: int = 0) -> None:
        # lazy: transformers is heavy (only this path needs it)
        from transformers import AutoModelForCausalLM

        self.config, self.replica_rank, self.seed = config, replica_rank, int(seed)
        path = _get(model_config, "local_path") or _get(model_config, "path")
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        gen = self.model.generation_config
        self.eos_token_id = gen.eos_token_id
        self.pad_token_id = gen.pad_token_id if gen.pad_token_id is not None else 0
        self.global_steps: int | None = None
        self._seen: dict[tuple, int] = {}  # (weight version, prompt) -> requests seen
        self._lock = asyncio.Lock()  # one generation at a time: the seeds stay per request

    # -- generation ---------------------------------------------------------------------------------
    def _max_tokens(self, n_prompt: int, sampling_params: dict) -> int:
        cfg = self.config
        limit = sampling_params.pop("max_tokens", None) or sampling_params.pop(
            "max_new_tokens", None
        )
        if limit is None:
            limit = min(cfg.response_length, cfg.prompt_length + cfg.response_length - n_prompt)
        return max(1, int(limit))

    @torch.no_grad()
    def _sample(self, prompt_ids: list[int], params: dict, seed: int) -> tuple[list, list]:
        temperature = float(params.get("temperature", 1.0) or 0.0)
        top_k = int(params.get("top_k", -1) or -1)
        top_p = float(params.get("top_p", 1.0) or 1.0)
        kwargs: dict[str, Any] = {"do_sample": temperature > 0}
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else None)
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=params["max_tokens"],
                eos_token_id=self.eos_token_id,
                pad_token_id=self.pad_token_id,
                output_scores=True,
                return_dict_in_generate=True,
                **kwargs,
            )
        new = out.sequences[0, ids.shape[1] :].tolist()
        logps = []
        for tok, scores in zip(new, out.scores):
            logps.append(float(torch.log_softmax(scores[0].float(), dim=-1)[tok]))
        if self.eos_token_id is not None and self.eos_token_id in new:  # drop padding after EOS
            end = new.index(self.eos_token_id) + 1
            new, logps = new[:end], logps[:end]
        return new, logps

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data=None,
        video_data=None,
        audio_data=None,
        mm_processor_kwargs=None,
        priority: int = 0,
        **_: Any,
    ):
        # lazy: optional dependency (verl extra)
        from verl.workers.rollout.replica import TokenOutput

        if image_data or video_data or audio_data:
            raise ValueError("the poise_hf CPU rollout serves text prompts only")
        prompt_ids = [int(t) for t in prompt_ids]
        params = dict(sampling_params)
        want_logprobs = bool(params.pop("logprobs", False))
        params["max_tokens"] = self._max_tokens(len(prompt_ids), params)
        async with self._lock:
            key = (self.global_steps, tuple(prompt_ids))
            k = self._seen.get(key, 0)
            self._seen[key] = k + 1
            seed = request_seed(self.seed, self.global_steps, prompt_ids, k)
            loop = asyncio.get_running_loop()
            tokens, logps = await loop.run_in_executor(None, self._sample, prompt_ids, params, seed)
        return TokenOutput(
            token_ids=tokens,
            log_probs=logps if want_logprobs else None,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    # -- weights and life cycle (verl calls these on every replica) ------------------------------
    async def update_weights(self, named_tensors: dict[str, torch.Tensor]) -> int:
        """Load full tensors by Hugging Face name; returns how many were loaded."""
        own = self.model.state_dict()
        unknown = sorted(set(named_tensors) - set(own))
        if unknown:
            raise KeyError(f"rollout weights unknown to the model: {unknown[:5]}")
        with torch.no_grad():
            for name, value in named_tensors.items():
                own[name].copy_(value.to(own[name].dtype))
        self._seen.clear()
        return len(named_tensors)

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps
        self._seen.clear()

    async def state_dict_digest(self) -> str:
        """sha256 over the model's tensors (name order): lets a test see that weights moved."""
        h = hashlib.sha256()
        for name, t in sorted(self.model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().to(torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()

    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        async with self._lock:
            return None

    async def abort_all_requests(
        self, reset_prefix_cache: bool = True, reject_request: bool = False
    ):
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True):
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self) -> None:
        return None

    async def resume_engine_generation(self) -> None:
        return None

    async def open_submission_gate(self) -> None:
        return None

    async def start_profile(self, **_: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


def server_name(replica_rank: int, node_rank: int = 0) -> str:
    return f"{ROLLOUT_NAME}_server_{replica_rank}_{node_rank}"


def _replica_class():
    import ray  # lazy: optional dependency (ray extra)

    # lazy: optional dependency (ray extra)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # lazy: optional dependency (verl extra)
    from verl.workers.rollout.replica import RolloutReplica

    class HFReplica(RolloutReplica):
        """One :class:`HFGenerateServer` per replica, on the node of the replica's first worker."""

        async def launch_servers(self):
            if self.nnodes != 1:
                raise ValueError("the poise_hf CPU rollout runs on one node")
            node_id = await self.workers[0].__ray_call__.remote(
                lambda w: ray.get_runtime_context().get_node_id()
            )
            server = (
                ray.remote(HFGenerateServer)
                .options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                    name=server_name(self.replica_rank),
                    max_concurrency=self.max_concurrency,
                    num_cpus=0,
                )
                .remote(
                    config=self.config,
                    model_config=self.model_config,
                    replica_rank=self.replica_rank,
                    seed=self.config.seed,
                )
            )
            self.servers.append(server)
            await server.set_global_steps.remote(None)  # waits for the model to load
            self._server_handle = server
            self._server_address = f"{ROLLOUT_NAME}://{self.replica_rank}"

        def rollout_worker_use_gpu(self) -> bool:
            return False

    return HFReplica


def _adapter_class():
    from verl.workers.rollout.base import BaseRollout  # lazy: optional dependency (verl extra)

    class HFServerAdapter(BaseRollout):
        """Worker-side half of the rollout: pushes the trainer's weights into the replica's server."""

        def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **_: Any):
            super().__init__(config, model_config, device_mesh)
            rank = int(os.environ.get("RANK", "0"))
            width = (
                self.config.tensor_model_parallel_size
                * self.config.data_parallel_size
                * self.config.pipeline_model_parallel_size
            )
            self.replica_rank = rank // width if replica_rank == -1 else replica_rank
            self.is_leader_rank = rank % width == 0
            self._server = None

        def _handle(self):
            import ray  # lazy: optional dependency (ray extra)

            if self._server is None:
                self._server = ray.get_actor(server_name(self.replica_rank))
            return self._server

        async def resume(self, tags: list[str]) -> None:
            return None

        async def release(self) -> None:
            return None

        async def update_weights(
            self, weights, global_steps: int | None = None, wire_format: str = "named_tensors", **_
        ) -> None:
            # lazy: optional dependency (verl extra)
            from verl.workers.rollout.utils import ensure_async_iterator

            if wire_format != "named_tensors":
                raise ValueError(f"the poise_hf rollout takes full tensors, not {wire_format!r}")
            state = {}
            async for name, tensor in ensure_async_iterator(weights):  # every rank joins gathers
                if self.is_leader_rank:
                    state[name] = tensor.detach().to("cpu", copy=True)
            if self.is_leader_rank:
                server = self._handle()
                await server.update_weights.remote(state)
                if global_steps is not None:
                    await server.set_global_steps.remote(global_steps)

    return HFServerAdapter


_CLASSES: dict[str, type] = {}


def replica_class() -> type:
    if "replica" not in _CLASSES:
        _CLASSES["replica"] = _replica_class()
    return _CLASSES["replica"]


def adapter_class() -> type:
    if "adapter" not in _CLASSES:
        _CLASSES["adapter"] = _adapter_class()
    return _CLASSES["adapter"]


def register_hf_rollout() -> None:
    """Make ``actor_rollout_ref.rollout.name=poise_hf`` resolvable by verl (idempotent; the classes
    are built on first use)."""
    from verl.workers.rollout import base  # lazy: optional dependency (verl extra)

    # lazy: optional dependency (verl extra)
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, replica_class)
    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{__name__}.HFServerAdapter"


def __getattr__(name: str):  # verl's get_rollout_class imports the adapter by its dotted path
    if name == "HFServerAdapter":
        return adapter_class()
    if name == "HFReplica":
        return replica_class()
    raise AttributeError(name)
