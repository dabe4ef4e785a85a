"""The verl CPU smoke: verl 0.9.1's real ``main_ppo`` for a few steps on the host CPU.

Same trainer (``poise_sync``), same plugin, same estimator / policy-loss registration as the GPU
protocol (:mod:`launch`); what differs is the scale and the device: a tiny random Qwen2 built at run
time (:mod:`tiny_model`), a few real MATH L3-5 problems whose prompts fit ``max_prompt_length``, the
CPU platform and Hugging Face rollout (:mod:`cpu_platform`, :mod:`cpu_rollout`), FSDP2 in float32,
sdpa attention without remove-padding, rollout tensor parallelism 1, one TransferQueue storage unit,
and Ray with more logical CPUs than cores plus one logical GPU so verl's placement groups resolve.
The reward is :func:`reward.compute_smoke_score` (the project's grading plus partial credit, so a
random policy still sees rewards that vary). No reference model: FSDP2 offloads the reference to
pinned host memory, which needs an accelerator, so the KL-to-reference term is not exercised here.

Everything here takes plain paths and values; the engine owns the archive, MLflow and the result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_template.verl_backend import ENV_ALGORITHM_FILE, ENV_HPARAMS, ENV_NODE, tiny_model
from trainer_template.verl_backend.data_prep import load_math_problems, sample_subset
from trainer_template.verl_backend.launch import (
    PLUGIN,
    PROJECT_ROOT,
    REWARD_FILE,
    Launch,
    VerlProtocol,
    main_ppo_launch,
)

PROTOCOL_ID = "verl-smoke"


@dataclass(frozen=True)
class SmokeProtocol:
    """The smoke's settings (all recorded with the result; nothing here is the paper's protocol)."""

    steps: int = 2
    prompts: int = 4
    n: int = 4
    mini_batches: int = 2
    max_prompt_length: int = 192
    max_response_length: int = 32
    lr: float = 1e-4
    temperature: float = 1.0
    seed: int = 0
    val_problems: int = 4
    ray_cpus: int = 32

    def __post_init__(self) -> None:
        if self.steps < 1 or self.prompts < 1 or self.n < 2:
            raise ValueError(
                "the smoke needs steps >= 1, prompts >= 1 and n >= 2 samples per prompt"
            )
        if self.prompts % self.mini_batches:
            raise ValueError("prompts must be a multiple of mini_batches")

    def as_dict(self) -> dict[str, Any]:
        return {"id": PROTOCOL_ID, **dataclasses.asdict(self)}


def _fits(tokenizer, row: dict, limit: int) -> bool:
    ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, Mapping) else ids
    return len(ids) <= limit


def write_data(out_dir: str | Path, model_dir: str | Path, proto: SmokeProtocol) -> dict[str, str]:
    """``train.parquet`` (``steps * prompts`` problems) and ``val.parquet`` drawn, in the seeded order
    of :func:`data_prep.sample_subset`, from the shipped MATH L3-5 problems whose chat prompt fits
    ``max_prompt_length`` tokens of the tiny tokenizer. Reuses files already written for ``proto``."""
    import pandas as pd  # lazy: pandas is heavy (only this path needs it)
    from transformers import AutoTokenizer  # lazy: transformers is heavy (only this path needs it)

    out = Path(out_dir)
    paths = {"train": str(out / "train.parquet"), "val": str(out / "val.parquet")}
    stamp = out / "smoke_data.json"
    want = {"protocol": proto.as_dict()}
    if stamp.is_file() and json.loads(stamp.read_text(encoding="utf-8")) == want:
        return paths
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rows, _ = sample_subset(
        len(load_math_problems()), seed=proto.seed
    )  # every problem, seeded order
    need = proto.steps * proto.prompts + proto.val_problems
    chosen = []
    for row in rows:
        if _fits(tok, row, proto.max_prompt_length):
            chosen.append(row)
            if len(chosen) == need:
                break
    if len(chosen) < need:
        raise ValueError(f"only {len(chosen)} problems fit {proto.max_prompt_length} prompt tokens")
    k = proto.steps * proto.prompts
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(chosen[:k]).to_parquet(paths["train"], index=False)
    val = [{**r, "extra_info": {**r["extra_info"], "split": "val"}} for r in chosen[k:]]
    pd.DataFrame(val).to_parquet(paths["val"], index=False)
    stamp.write_text(json.dumps(want, sort_keys=True), encoding="utf-8")
    return paths


def cpu_overrides(
    proto: SmokeProtocol, model_dir: str, work_dir: str, ray_address: str | None = None
) -> list[str]:
    """The hydra settings that put verl on the CPU at smoke scale (replacing the protocol's). With
    ``ray_address`` verl joins that running Ray instead of starting one (which then must offer
    ``ray_cpus`` logical CPUs and one logical GPU)."""
    if ray_address:
        ray = [f"+ray_kwargs.ray_init.address={ray_address}"]
    else:
        ray = [
            f"ray_kwargs.ray_init.num_cpus={proto.ray_cpus}",
            "+ray_kwargs.ray_init.num_gpus=1",
            "+ray_kwargs.ray_init.include_dashboard=false",
        ]
    fp32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
    arr = "actor_rollout_ref"
    return [
        f"{arr}.model.path={model_dir}",
        f"{arr}.model.use_remove_padding=false",
        f"{arr}.model.enable_gradient_checkpointing=false",
        f"+{arr}.model.override_config.attn_implementation=sdpa",
        f"{arr}.actor.strategy=fsdp2",
        f"{arr}.actor.use_torch_compile=false",
        f"{arr}.actor.fsdp_config.use_torch_compile=false",
        f"+{arr}.actor.fsdp_config.mixed_precision={fp32}",
        f"{arr}.actor.use_kl_loss=false",
        f"{arr}.actor.ppo_max_token_len_per_gpu=4096",
        f"{arr}.rollout.name=poise_hf",
        f"{arr}.rollout.tensor_model_parallel_size=1",
        f"{arr}.rollout.seed={proto.seed}",
        f"{arr}.rollout.agent.num_workers=1",
        f"{arr}.rollout.log_prob_max_token_len_per_gpu=4096",
        "data.filter_overlong_prompts=false",
        "data.dataloader_num_workers=0",
        f"reward.custom_reward_function.path={REWARD_FILE}",
        "reward.custom_reward_function.name=compute_smoke_score",
        "reward.num_workers=1",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={proto.steps}",
        "trainer.total_epochs=1",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "transfer_queue.backend.SimpleStorage.total_storage_size=4096",
        *ray,
        f"hydra.run.dir={Path(work_dir) / 'hydra'}",
    ]


def worker_env(
    node: str,
    files: Mapping[str, str],
    *,
    tracking_uri: str,
    run_id: str,
    progress_file: str,
) -> dict[str, str]:
    """The environment every verl process of the smoke needs (passed through Ray's runtime env)."""
    return {
        ENV_NODE: node,
        ENV_ALGORITHM_FILE: files["algorithm"],
        ENV_HPARAMS: files["hparams"],
        "VERL_USE_EXTERNAL_MODULES": PLUGIN,
        "VERL_PLATFORM": "cpu",
        # verl picks the training engine by device; its FSDP engine is registered for cuda/npu and
        # runs unchanged on the CPU platform
        "VERL_ENGINE_DEVICE": "cuda",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MLFLOW_RUN_ID": run_id,
        "POISE_PROGRESS_FILE": progress_file,
        "TOKENIZERS_PARALLELISM": "false",
        # Ray enables token authentication for a local cluster; a driver joining a running one must
        # say so explicitly to present the token (~/.ray/auth_token)
        "RAY_AUTH_MODE": "token",
    }


def prepare(
    node: str,
    source: str,
    settings: Mapping[str, Any],
    *,
    work_dir: str | Path,
    shared_dir: str | Path,
    tracking_uri: str,
    run_id: str,
    project: str = "poise",
    proto: SmokeProtocol = SmokeProtocol(),
    hparams: Mapping[str, Any] | None = None,
    extra: Sequence[str] = (),
    ray_address: str | None = None,
) -> Launch:
    """Write what the smoke of ``node`` needs and return its command (joining the Ray at
    ``ray_address`` when given, else starting its own).

    ``work_dir`` (per node, emptied of earlier checkpoints and progress) receives ``algorithm.py``,
    ``hparams.json``, ``progress.jsonl`` and ``checkpoints/``; ``shared_dir`` (per archive) the tiny
    model and the data, built once and reused by every node. ``settings``: the node's loss-side
    settings with ``hparams`` applied, plain data (see :func:`launch.prepare_launch`)."""
    work, shared = Path(work_dir).resolve(), Path(shared_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    shared.mkdir(parents=True, exist_ok=True)
    with _locked(shared / ".lock"):  # smokes of several nodes may start together
        model_dir = tiny_model.build(shared / "model", seed=proto.seed)
        data = write_data(shared / f"data_seed{proto.seed}", model_dir, proto)
    files = {
        "algorithm": str(work / "algorithm.py"),
        "hparams": str(work / "hparams.json"),
        "progress": str(work / "progress.jsonl"),
        "ckpt": str(work / "checkpoints"),
        "log": str(work / "verl.log"),
        "tmp": str(work / "tmp"),
        "model": str(model_dir),
        **data,
    }
    Path(files["algorithm"]).write_text(source, encoding="utf-8")
    Path(files["hparams"]).write_text(json.dumps(dict(hparams or {}), sort_keys=True), "utf-8")
    Path(files["progress"]).write_text("", encoding="utf-8")
    Path(files["tmp"]).mkdir(exist_ok=True)
    _remove_tree(Path(files["ckpt"]))
    env = worker_env(
        node, files, tracking_uri=tracking_uri, run_id=run_id, progress_file=files["progress"]
    )
    protocol = VerlProtocol(
        model=str(model_dir),
        lr=proto.lr,
        train_batch_size=proto.prompts,
        ppo_mini_batch_size=proto.prompts // proto.mini_batches,
        n=proto.n,
        epochs=1,
        max_prompt_length=proto.max_prompt_length,
        max_response_length=proto.max_response_length,
        temperature=proto.temperature,
        n_gpus=1,
        seed=proto.seed,
    )
    extra = [*cpu_overrides(proto, str(model_dir), str(work), ray_address), *extra]
    return main_ppo_launch(
        node, settings, files, env, project=project, protocol=protocol, extra=extra
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created) for the block."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_tree(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)


def read_progress(path: str | Path) -> list[dict]:
    """The per-step rows the trainer wrote to ``$POISE_PROGRESS_FILE`` (complete lines only)."""
    p = Path(path)
    if not p.is_file():
        return []
    rows = []
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line being written
    return rows
