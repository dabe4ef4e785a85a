"""The verl command line of the paper's protocol for one node (hydra overrides + environment).

Protocol: Qwen2.5-Math-1.5B, 5,000 MATH L3-5 problems, lr 1e-6, global batch 256 prompts, n = 8
samples, 8 epochs, prompt 1024 / response 3000 tokens, KL loss (low_var_kl), vLLM rollout, MLflow
logging into the node's run. Assumed where the paper is silent: 4 PPO mini-batches per step
(``ppo_mini_batch_size`` 64). KL coefficient: the node's ``kl_coef`` (the root's 0.001, verl's GRPO
recipe; 0 turns verl's KL loss off, as DAPO does), the protocol's 0.001 for a node without the field.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import urllib.parse
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer_template.verl_backend import ENV_ALGORITHM_FILE, ENV_HPARAMS, ENV_NODE, registered_name
from trainer_template.verl_backend.data_prep import write_parquet

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "trainer_template.verl_backend.plugin"
REWARD_FILE = Path(__file__).resolve().parent / "reward.py"
DEFAULT_MODEL = "Qwen/Qwen2.5-Math-1.5B"


@dataclass(frozen=True)
class VerlProtocol:
    """The paper's standardized verl protocol (defaults) — every field a hydra setting."""

    model: str = DEFAULT_MODEL
    lr: float = 1e-6
    train_batch_size: int = 256
    ppo_mini_batch_size: int = 64
    n: int = 8
    epochs: int = 8
    max_prompt_length: int = 1024
    max_response_length: int = 3000
    kl_coef: float = 0.001
    temperature: float = 1.0
    n_gpus: int = 8
    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.6
    seed: int = 0


@dataclass
class Launch:
    """What ``poise-git train`` runs: ``cmd`` with ``env`` (only the variables it adds)."""

    cmd: list[str]
    env: dict[str, str]
    overrides: list[str]
    files: dict[str, str] = field(default_factory=dict)


_SAFE = re.compile(r"[\w./:@+\-~ ]*")


def _fmt(v: Any) -> str:
    """A hydra override value: booleans lower-case, strings with grammar characters single-quoted."""
    if isinstance(v, bool):
        return "true" if v else "false"
    s = str(v)
    if _SAFE.fullmatch(s):
        return s
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fmt_str(v: Any) -> str:
    """A hydra override value that stays a string (``false``, ``1`` or ``null`` unquoted would not)."""
    return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"


def carries_credentials(value: str) -> bool:
    """Whether ``value`` is a URI with a user or password (``https://user:pass@host/``): such a value
    stays off verl's command line, where ``ps`` and verl's printed config would show it."""
    if "://" not in value:
        return False
    try:
        return "@" in urllib.parse.urlsplit(value).netloc
    except ValueError:
        return True  # not a URI urllib reads: kept off the command line all the same


def build_overrides(
    node: str,
    settings: Mapping[str, Any],
    *,
    train_file: str,
    val_file: str,
    ckpt_dir: str,
    project: str,
    env_for_workers: Mapping[str, str],
    protocol: VerlProtocol = VerlProtocol(),
    extra: Sequence[str] = (),
) -> list[str]:
    """Hydra overrides of verl's ``ppo_trainer`` config for ``node`` (its mechanism registered by name);
    ``settings``: the node's loss-side settings (``settings.node_settings``), protocol defaults where
    it defines none. ``env_for_workers`` reaches verl's Ray workers through Ray's runtime env, except
    a value with credentials (:func:`carries_credentials`): that one only through the launched
    process's environment, which the workers of the Ray instance ``main_ppo`` starts inherit."""
    s = settings
    name = registered_name(node)
    p = protocol
    kl = s["kl_coef"] if s.get("kl_coef") is not None else p.kl_coef
    ov = [
        f"algorithm.adv_estimator={name}",
        "algorithm.use_kl_in_reward=false",
        f"data.train_files={_fmt(train_file)}",
        f"data.val_files={_fmt(val_file)}",
        f"data.train_batch_size={p.train_batch_size}",
        f"data.max_prompt_length={p.max_prompt_length}",
        f"data.max_response_length={p.max_response_length}",
        "data.filter_overlong_prompts=true",
        "data.truncation=error",
        f"data.seed={p.seed}",
        f"actor_rollout_ref.model.path={_fmt(p.model)}",
        f"actor_rollout_ref.model.external_lib={PLUGIN}",
        f"actor_rollout_ref.actor.optim.lr={p.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={p.ppo_mini_batch_size}",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu="
        f"{max(16384, 2 * (p.max_prompt_length + p.max_response_length))}",
        f"actor_rollout_ref.actor.use_kl_loss={_fmt(kl > 0)}",
        f"actor_rollout_ref.actor.kl_loss_coef={kl}",
        f"actor_rollout_ref.actor.kl_loss_type={s.get('kl_type', 'low_var_kl')}",
        f"actor_rollout_ref.actor.entropy_coeff={s.get('entropy_coef', 0.0)}",
        f"actor_rollout_ref.actor.loss_agg_mode={s.get('loss_agg_mode', 'token-mean')}",
        f"actor_rollout_ref.actor.clip_ratio_low={s.get('clip_ratio_low', 0.2)}",
        f"actor_rollout_ref.actor.clip_ratio_high={s.get('clip_ratio_high', 0.2)}",
        f"actor_rollout_ref.actor.clip_ratio_c={s.get('clip_ratio_c', 3.0)}",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={name}",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.n={p.n}",
        f"actor_rollout_ref.rollout.temperature={p.temperature}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={p.tensor_parallel}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={p.gpu_memory_utilization}",
        f"reward.custom_reward_function.path={_fmt(REWARD_FILE)}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.use_v1=true",
        "trainer.v1.trainer_mode=poise_sync",
        "trainer.logger=['console','mlflow']",
        f"trainer.project_name={_fmt(project)}",
        f"trainer.experiment_name={node}",
        f"trainer.total_epochs={p.epochs}",
        f"trainer.n_gpus_per_node={p.n_gpus}",
        "trainer.nnodes=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        # verl saves when the step is the last or a multiple of save_freq: a huge period means
        # "only at the end"; the Hugging Face copy is what the evaluation loads
        "trainer.save_freq=100000000",
        "actor_rollout_ref.actor.checkpoint.save_contents=['model','optimizer','extra','hf_model']",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={_fmt(ckpt_dir)}",
        f"hydra.run.dir={_fmt(Path(ckpt_dir).parent / 'hydra')}",  # not ./outputs of the caller
        "hydra.output_subdir=null",
    ]
    ov += [
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}={_fmt_str(v)}"
        for k, v in sorted(env_for_workers.items())
        if not carries_credentials(v)
    ]
    replaced = {_key(e) for e in extra}
    return [o for o in ov if _key(o) not in replaced] + list(extra)


class VerlConfigError(ValueError):
    """The overrides do not make a config verl's ``ppo_trainer`` accepts (one line)."""


def check_overrides(overrides: Sequence[str]) -> None:
    """Compose ``overrides`` over verl's own ``ppo_trainer.yaml`` as ``main_ppo`` does and run verl's
    ``validate_config``, so an unknown key, a bad value or a local model path that does not exist is
    one line here rather than a traceback after the MLflow run and the data exist."""
    import verl  # lazy: optional dependency (verl extra)
    from hydra import compose, initialize_config_dir  # lazy: verl's dependency
    from verl.trainer.ppo.utils import need_critic, need_reference_policy  # lazy: verl extra
    from verl.utils.config import validate_config  # lazy: verl extra

    config_dir = Path(verl.__file__).resolve().parent / "trainer" / "config"
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = compose("ppo_trainer", overrides=list(overrides))
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # verl prints and warns as it checks
            validate_config(
                config=cfg,
                use_reference_policy=need_reference_policy(cfg),
                use_critic=need_critic(cfg),
            )
    except Exception as exc:  # noqa: BLE001 - hydra, OmegaConf and verl's assertions alike
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise VerlConfigError(f"verl refuses the config: {why}") from None
    model = str(cfg.actor_rollout_ref.model.path)
    if model.startswith(("/", "./", "../", "~")) and not Path(model).expanduser().exists():
        raise VerlConfigError(f"the model path {model} does not exist")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def prepare_launch(
    node: str,
    source: str,
    settings: Mapping[str, Any],
    *,
    work_dir: str | Path,
    tracking_uri: str,
    run_id: str | None = None,
    project: str = "poise",
    protocol: VerlProtocol = VerlProtocol(),
    hparams: Mapping[str, Any] | None = None,
    extra: Sequence[str] = (),
    dry_run: bool = False,
) -> Launch:
    """The verl launch of ``node`` whose algorithm.py is ``source``, from plain values (the engine
    owns the archive and the MLflow run: ``tracking_uri`` and ``run_id`` are handed in; ``settings``
    are the node's loss-side settings with ``hparams`` applied, read where its code may run, see
    :mod:`trainer_template.verl_backend.settings`: nothing here executes the node's code). Unless
    ``dry_run``, writes the algorithm, its hyperparameters and the parquet data under ``work_dir``."""
    root = Path(work_dir).resolve()
    work, data = root / "nodes" / node, root / "data" / f"math_l3to5_n5000_seed{protocol.seed}"
    files = {
        "algorithm": str(work / "algorithm.py"),
        "hparams": str(work / "hparams.json"),
        "train": str(data / "train.parquet"),
        "val": str(data / "val.parquet"),
        "ckpt": str(work / "checkpoints"),
        "tmp": str(work / "tmp"),
    }
    if not dry_run:
        Path(files["tmp"]).mkdir(parents=True, exist_ok=True)
        Path(files["algorithm"]).write_text(source, encoding="utf-8")
        Path(files["hparams"]).write_text(
            json.dumps(dict(hparams or {}), sort_keys=True), encoding="utf-8"
        )
        if not (Path(files["train"]).is_file() and Path(files["val"]).is_file()):
            write_parquet(data, n=5000, seed=protocol.seed)
    env = {
        ENV_NODE: node,
        ENV_ALGORITHM_FILE: files["algorithm"],
        ENV_HPARAMS: files["hparams"],
        "VERL_USE_EXTERNAL_MODULES": PLUGIN,
        "PYTHONPATH": os.pathsep.join(
            dict.fromkeys(  # the project first, once
                p
                for p in (str(PROJECT_ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep))
                if p
            )
        ),
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MLFLOW_RUN_ID": run_id or "new-run-created-at-launch",
    }
    return main_ppo_launch(
        node, settings, files, env, project=project, protocol=protocol, extra=extra
    )


def main_ppo_launch(
    node: str,
    settings: Mapping[str, Any],
    files: dict[str, str],
    env: dict[str, str],
    *,
    project: str,
    protocol: VerlProtocol,
    extra: Sequence[str] = (),
) -> Launch:
    """verl's ``main_ppo`` for ``node`` over the prepared ``files`` (train, val, ckpt) and ``env``.
    With ``files["tmp"]`` (an existing directory of the node's), verl's Ray workers take it as their
    ``TMPDIR``: verl leaves a lock file in the temporary directory for every checkpoint directory it
    makes, which then stays with the node rather than in the machine's ``/tmp``. The launched
    process keeps the caller's: a Ray instance it starts keeps its session (and socket paths, which
    have a length limit) where Ray puts them."""
    workers = {**env, "TMPDIR": files["tmp"]} if files.get("tmp") else env
    overrides = build_overrides(
        node,
        settings,
        train_file=files["train"],
        val_file=files["val"],
        ckpt_dir=files["ckpt"],
        project=project,
        env_for_workers=workers,
        protocol=protocol,
        extra=extra,
    )
    return Launch(
        cmd=[sys.executable, "-m", "verl.trainer.main_ppo", *overrides],
        env=env,
        overrides=overrides,
        files=files,
    )
