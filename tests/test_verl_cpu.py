"""The verl CPU pieces without starting verl: the platform, the gloo worker's process group, the
Hugging Face rollout server on the tiny model, the smoke's data and hydra settings, the smoke reward,
and the engine's process handling (progress, milestones, timeout kills the whole group).
The full run is tests/test_verl_smoke.py (slow)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("verl")

from trainer_template.verl_backend import cpu_platform, smoke, tiny_model  # noqa: E402
from trainer_template.verl_backend.cpu_rollout import HFGenerateServer, request_seed  # noqa: E402
from trainer_template.verl_backend.reward import compute_smoke_score  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model.build(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_cpu_platform_in_verls_registry(monkeypatch):
    from verl.plugin.platform import PlatformRegistry

    cls = cpu_platform.register_cpu_platform()
    assert PlatformRegistry.get("cpu") is cls and cpu_platform.register_cpu_platform() is cls
    p = cls()
    assert p.device_name == "cpu" and p.communication_backend_name() == "gloo"
    assert p.current_device() == torch.device("cpu") and p.ray_resource_name() == "GPU"
    assert torch.ones(2).to(p.current_device()).device.type == "cpu"
    mod = p.device_module
    mod.empty_cache(), mod.synchronize(), mod.set_device(0)
    assert mod.memory_allocated() == 0 and not mod.is_available()
    state = mod.get_rng_state()
    mod.set_rng_state(state)
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    assert not p.is_platform_available(use_smi_check=True)  # never auto-detected
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert p.is_platform_available(use_smi_check=True) and cpu_platform.active()


def test_verls_composite_backend_is_refused_for_cpu_so_the_worker_opens_gloo(monkeypatch):
    """verl's TrainingWorker asks for f"cpu:gloo,{device}:{backend}"; torch refuses it for device
    cpu, which is why the CPU worker opens the group first with plain gloo."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import BackendConfig

    with pytest.raises(ValueError, match="Duplicate device type cpu"):
        BackendConfig(dist.Backend("cpu:gloo,cpu:gloo"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("DIST_INIT_METHOD", raising=False)
    assert not dist.is_initialized()
    try:
        cpu_platform.init_gloo_process_group()
        cpu_platform.init_gloo_process_group()  # already open: a no-op
        assert dist.get_backend() == "gloo"
        t = torch.tensor([2.0])
        dist.all_reduce(t)
        assert t.item() == 2.0
    finally:
        dist.destroy_process_group()


def test_tiny_model_is_offline_seeded_and_chatml(model_dir, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(model_dir)
    assert cfg.model_type == "qwen2" and cfg.architectures == ["Qwen2ForCausalLM"]
    assert tiny_model.n_parameters(model_dir) == 656_512
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is $1+1$?"}], add_generation_prompt=True, tokenize=False
    )
    assert ids == "<|im_start|>user\nWhat is $1+1$?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and len(tok.encode("\n", add_special_tokens=False)) == 1
    text = "Compute $\\frac{3}{4}$: \\boxed{0.75} ünïcode"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text  # byte-level: lossless
    mtime = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert tiny_model.build(model_dir, seed=0) == model_dir  # cached: not rebuilt
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == mtime
    other = tiny_model.build(tmp_path / "seed1", seed=1)
    assert (other / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (
        model_dir / "model.safetensors"
    ).read_bytes()


def _server(model_dir, response_length=8):
    cfg = SimpleNamespace(response_length=response_length, prompt_length=64)
    return HFGenerateServer(cfg, {"path": str(model_dir)}, seed=3)


def _gen(server, prompt, **params):
    params = {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "logprobs": True, **params}
    return asyncio.run(server.generate(prompt, params, request_id="r"))


def test_rollout_server_samples_reproducibly_with_true_logprobs(model_dir):
    prompt = [1, 85, 1615, 79, 201, 50, 270, 615, 2, 201, 1, 320, 85, 605, 703, 201]
    a = _server(model_dir)
    asyncio.run(a.set_global_steps(1))
    first, second = _gen(a, prompt), _gen(a, prompt)
    assert first.token_ids != second.token_ids  # the k-th request of a prompt gets its own seed
    assert 1 <= len(first.token_ids) <= 8 and first.extra_fields["global_steps"] == 1
    b = _server(model_dir)  # a fresh server replays the same stream
    asyncio.run(b.set_global_steps(1))
    assert _gen(b, prompt).token_ids == first.token_ids
    assert _gen(b, prompt).token_ids == second.token_ids
    assert request_seed(3, 1, prompt, 0) != request_seed(3, 2, prompt, 0)
    # the log-probabilities are the policy's own at temperature 1
    seq = torch.tensor([prompt + first.token_ids])
    with torch.no_grad():
        logits = a.model(seq).logits[0, len(prompt) - 1 : -1].float()
    want = torch.log_softmax(logits, -1).gather(1, seq[0, len(prompt) :, None])[:, 0]
    assert torch.allclose(torch.tensor(first.log_probs), want, atol=1e-4)
    greedy = _gen(a, prompt, temperature=0, logprobs=False)
    assert greedy.log_probs is None
    with torch.no_grad():
        top = a.model(torch.tensor([prompt])).logits[0, -1].argmax().item()
    assert greedy.token_ids[0] == top
    assert len(_gen(a, prompt, max_tokens=3).token_ids) <= 3


def test_rollout_server_takes_new_weights(model_dir):
    prompt = [1, 85, 1615, 79, 201]
    s = _server(model_dir)
    before = asyncio.run(s.state_dict_digest())
    greedy = _gen(s, prompt, temperature=0).token_ids
    state = {
        k: torch.randn_like(v) for k, v in s.model.state_dict().items() if k.endswith("weight")
    }
    assert asyncio.run(s.update_weights(state)) == len(state)
    assert asyncio.run(s.state_dict_digest()) != before
    assert _gen(s, prompt, temperature=0).token_ids != greedy
    with pytest.raises(KeyError, match="unknown to the model"):
        asyncio.run(s.update_weights({"no.such.weight": torch.zeros(1)}))
    with pytest.raises(ValueError, match="text prompts only"):
        asyncio.run(s.generate(prompt, {}, "r", image_data=["x"]))


def test_smoke_data_fits_the_prompt_budget(model_dir, tmp_path):
    import pandas as pd
    from transformers import AutoTokenizer

    proto = smoke.SmokeProtocol(steps=2, prompts=4, max_prompt_length=128)
    paths = smoke.write_data(tmp_path / "data", model_dir, proto)
    train, val = pd.read_parquet(paths["train"]), pd.read_parquet(paths["val"])
    assert len(train) == 8 and len(val) == proto.val_problems
    assert set(train["data_source"]) == {"math_l3to5"}
    tok = AutoTokenizer.from_pretrained(model_dir)
    for msgs in train["prompt"]:
        ids = tok.apply_chat_template(list(msgs), add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert len(ids) <= 128
    gold = [r["ground_truth"] for r in train["reward_model"]]
    assert all(gold) and len(set(gold)) > 1
    assert smoke.write_data(tmp_path / "data", model_dir, proto) == paths  # reused


def _compose(overrides):
    import verl
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(
        config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None
    ):
        return compose("ppo_trainer", overrides=overrides)


def test_smoke_settings_compose_against_verls_config():
    from engine.archive.edit import prior_source
    from trainer_template.loader import load_algorithm, make_config
    from trainer_template.verl_backend.launch import VerlProtocol, build_overrides
    from trainer_template.verl_backend.settings import node_settings

    proto = smoke.SmokeProtocol()
    settings = node_settings(make_config(load_algorithm(prior_source("dr_grpo"), "dr")))
    files = {"algorithm": "/x/algorithm.py", "hparams": "/x/h.json"}
    env = smoke.worker_env(
        "dr", files, tracking_uri="sqlite:////x/mlflow.db", run_id="0123", progress_file="/x/p"
    )

    def overrides(address=None):
        return build_overrides(
            "dr",
            settings,
            train_file="/x/t.parquet",
            val_file="/x/v.parquet",
            ckpt_dir="/x/ckpt",
            project="p",
            env_for_workers=env,
            protocol=VerlProtocol(model="/x/model", n=proto.n, train_batch_size=proto.prompts),
            extra=smoke.cpu_overrides(proto, "/x/model", "/x/work", address),
        )

    c = _compose(overrides())
    a, r, m = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout, c.actor_rollout_ref.model
    assert r.name == "poise_hf" and r.tensor_model_parallel_size == 1 and r.n == 4
    assert a.strategy == "fsdp2" and not m.use_remove_padding
    assert m.override_config.attn_implementation == "sdpa" and not a.use_kl_loss
    assert a.fsdp_config.mixed_precision.param_dtype == "fp32"
    assert c.trainer.device == "cpu" and c.trainer.n_gpus_per_node == 1
    assert c.trainer.total_training_steps == 2 and c.trainer.resume_mode == "disable"
    assert "hf_model" in a.checkpoint.save_contents  # a final Hugging Face checkpoint
    assert c.reward.custom_reward_function.name == "compute_smoke_score"
    assert c.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    assert c.ray_kwargs.ray_init.num_cpus == 32 and c.ray_kwargs.ray_init.num_gpus == 1
    ev = c.ray_kwargs.ray_init.runtime_env.env_vars
    assert ev.VERL_PLATFORM == "cpu" and ev.TOKENIZERS_PARALLELISM == "false"  # a string
    assert ev.MLFLOW_RUN_ID == "0123"  # digits stay a string
    assert a.loss_agg_mode == "seq-mean-token-sum-norm"  # the node's own aggregation
    joined = _compose(overrides("10.0.0.1:6379")).ray_kwargs.ray_init
    assert joined.address == "10.0.0.1:6379" and "num_gpus" not in joined


def test_smoke_reward_varies_for_wrong_answers():
    right = compute_smoke_score("math", "so \\boxed{12}", "12")
    assert right == {"score": 1.0, "acc": 1.0, "format_valid": 1.0}
    half = compute_smoke_score("math", "the digits 1 and 5 appear", "12")
    assert half["score"] == pytest.approx(0.25) and half["acc"] == 0.0
    assert half["format_valid"] == 0.0
    assert compute_smoke_score("math", "nothing", "12")["score"] == 0.0


FAKE_VERL = r"""
import json, os, subprocess, sys, time
log, progress, mode = sys.argv[1], sys.argv[2], sys.argv[3]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[4], "w").write(str(child.pid))
print("Started a local Ray instance", flush=True)
time.sleep(0.3)
print("Training Progress", flush=True)
for step in (1, 2):
    with open(progress, "a") as fh:
        fh.write(json.dumps({"step": step, "total_steps": 2, "metrics": {
            "train/reward_mean": 0.5, "train/adv_std": 1.0, "train/step_s": 0.1}}) + "\n")
    time.sleep(0.3)
if mode == "hang":
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


@pytest.mark.parametrize("mode", ["finish", pytest.param("hang", marks=pytest.mark.slow)])
def test_run_verl_reports_progress_and_kills_the_group(tmp_path, mode):
    from engine.operators.train_verl import run_verl

    script = tmp_path / "fake_verl.py"
    script.write_text(FAKE_VERL)
    log, progress, child = tmp_path / "verl.log", tmp_path / "progress.jsonl", tmp_path / "child"
    progress.write_text("")
    events: list[str] = []
    t0 = time.monotonic()
    code, timed_out, rows = run_verl(
        [sys.executable, "-u", str(script), str(log), str(progress), mode, str(child)],
        env=dict(os.environ),
        cwd=tmp_path,
        log_path=log,
        progress_path=progress,
        timeout_s=6.0,
        on_event=events.append,
        poll_s=0.1,
    )
    assert [r["step"] for r in rows] == [1, 2]
    assert any(e.startswith("Ray started") for e in events)
    assert "step 1/2: reward_mean 0.5, adv_std 1 (0.1 s)" in events
    assert (code, timed_out) == ((0, False) if mode == "finish" else (None, True))
    assert time.monotonic() - t0 < 30
    deadline = time.monotonic() + 10
    while _alive(int(child.read_text())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(int(child.read_text()))  # nothing of the run outlives it
    assert json.loads(progress.read_text().splitlines()[0])["step"] == 1
