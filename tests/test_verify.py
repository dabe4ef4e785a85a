"""Verification through the real CLI: generated suites committed into nodes, hand-written edits checked
like generated ones, and the bounded correction loop driven by a scripted OpenAI-protocol server."""

from __future__ import annotations

import json

import openai_server  # tests/openai_server.py (tests/ is on pythonpath)
import pytest

from engine.archive.store import Archive

NAN_EDIT = '''\
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Divides by a zero scale: NaN everywhere."""
    scores = batch.rewards.to(torch.float32)
    return (scores - scores.mean()) / (scores.std() * 0.0)
'''
GOOD_EDIT = '''\
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Dr.GRPO: centred by the group mean, no std scaling."""
    scores = batch.rewards.to(torch.float32)
    stats = group_stats(scores, batch.group)
    return scores - torch.where(stats.count < 2, torch.zeros_like(scores), stats.mean)
'''
OS_EDIT = "import os\n\n\n" + GOOD_EDIT
LOOP_EDIT = GOOD_EDIT.replace(
    "    scores = batch", "    while True:\n        pass\n    scores = batch"
)
ALLOC_EDIT = GOOD_EDIT.replace(
    "    scores = batch",
    "    chunks = []\n    while True:\n        chunks.append(torch.empty(2 ** 26))\n    scores = batch",
)


@pytest.mark.slow
def test_verify_command_commits_the_suite(archive, cli):
    r = cli("verify", "grpo", "-C", str(archive.path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified" in r.stdout
    node = archive.node("grpo")
    assert node.status == "verified"
    rec = json.loads(archive.read_file("grpo", "verification.json"))
    assert rec["ok"] and rec["passed"] >= 20 and len(rec["fingerprint"]) > 100
    suite = archive.read_file("grpo", "tests/test_interface.py")
    assert "def test_advantages_shape_dtype_finite" in suite and "all_invalid" in archive.read_file(
        "grpo", "tests/conftest.py"
    )


@pytest.mark.slow  # two CLI verifications
def test_hand_written_edit_is_verified_like_a_generated_one(archive, cli, tmp_path):
    good, bad, hostile = tmp_path / "good.py", tmp_path / "nan.py", tmp_path / "os.py"
    good.write_text(GOOD_EDIT)
    bad.write_text(NAN_EDIT)
    hostile.write_text(OS_EDIT)
    r = cli("spawn", "grpo", "--name", "dr", "--edit", str(good), "-C", str(archive.path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        archive.node("dr").status == "verified"
        and archive.node("dr").trailer("Poise-Proposer") == "manual"
    )
    r = cli("spawn", "grpo", "--name", "nan", "--edit", str(bad), "-C", str(archive.path))
    assert r.returncode == 3 and "rejected" in r.stdout and "non-finite" in r.stdout
    node = archive.node("nan")
    assert node.status == "rejected" and "non-finite" in node.trailer("Poise-Reason")
    assert json.loads(archive.read_file("nan", "verification.json"))["ok"] is False
    r = cli("spawn", "grpo", "--name", "sneaky", "--edit", str(hostile), "-C", str(archive.path))
    assert r.returncode == 3 and "import of 'os'" in r.stdout
    assert json.loads(archive.read_file("sneaky", "verification.json"))["static"].endswith(
        "is not allowed (allowed: __future__, math, dataclasses, typing, torch, torch.nn, "
        "torch.nn.functional, trainer_template.interface, functools, itertools, numbers, enum)"
    )
    # the old behaviour stays available, and the archive is intact
    r = cli(
        "spawn", "grpo", "--name", "raw", "--edit", str(bad), "--no-verify", "-C", str(archive.path)
    )
    assert r.returncode == 1 and "same mechanism as the existing node nan" in r.stderr
    assert not archive.exists("raw")
    r = cli(
        "spawn",
        "grpo",
        "--name",
        "raw",
        "--edit",
        str(bad),
        "--no-verify",
        "--force",
        "-C",
        str(archive.path),
    )
    assert r.returncode == 0 and archive.node("raw").status == "spawned"
    r = cli("spawn", "grpo", "--edit", str(good), "-C", str(archive.path))
    assert r.returncode == 2 and "Missing option '--name'" in r.stderr
    r = cli("log", "-C", str(archive.path))
    assert r.returncode == 0 and "nan" in r.stdout and "rejected" in r.stdout
    assert archive.fsck()


@pytest.mark.slow  # correction rounds, each a sandboxed verification
def test_correction_loop_rejects_hostile_code_and_the_engine_keeps_running(tmp_path, cli):
    S = openai_server
    toml = tmp_path / "poise.toml"
    toml.write_text(
        '[propose]\nproposer = "llm"\ncorrection_rounds = 4\npopulation = 1\n'
        '[llm]\nmodel = "gpt-4o-mini"\napi_key_env = "POISE_TEST_KEY"\n'
    )
    assert cli("init", str(tmp_path / "exp"), "--config", str(toml)).returncode == 0
    arch = Archive(tmp_path / "exp")
    script = [
        S.proposal_reply("sneaky", OS_EDIT),
        S.revise_reply(LOOP_EDIT),
        S.revise_reply(ALLOC_EDIT),
        S.revise_reply(NAN_EDIT),
    ]
    with S.ScriptedOpenAI(script) as srv:
        env = {
            "OPENAI_BASE_URL": srv.base_url,
            "POISE_TEST_KEY": "sk-test-key",
            "POISE_VERIFY_CALL_S": "1",
            "POISE_VERIFY_MEMORY_MB": "1500",
        }
        r = cli("spawn", "grpo", "--auto", "-C", str(arch.path), env=env)
    assert r.returncode == 3, r.stdout + r.stderr
    assert len(srv.requests) == 4
    # every failure went back to the implementer
    assert "import of 'os'" in srv.requests[1]["messages"][-1]["content"]
    assert "longer than" in srv.requests[2]["messages"][-1]["content"]
    node = arch.node("sneaky")
    assert node.status == "rejected" and "non-finite" in node.trailer("Poise-Reason")
    log = arch.read_file("sneaky", "records/failures.txt")
    assert "import of 'os'" in log and "longer than" in log and "non-finite" in log
    assert "memory" in log.lower() or "allocate" in log.lower()
    usage = json.loads(arch.read_file("sneaky", "records/llm_usage.json"))
    assert usage["corrections"]["calls"] == 3 and usage["propose_call"]["calls"] == 1
    assert cli("log", "-C", str(arch.path)).returncode == 0
    assert arch.fsck()


def test_endpoint_lost_during_correction_still_archives_the_reason(archive):
    from engine.config import LLMConfig
    from engine.operators.implement import implement
    from engine.operators.llm import LLMClient
    from engine.operators.propose import Proposal

    S = openai_server
    with S.ScriptedOpenAI([{"status": 500}] * 5) as srv:
        llm = LLMClient(
            LLMConfig(base_url=srv.base_url, max_retries=1, api_key_env="POISE_NO_SUCH_KEY"),
            archive,
            backoff_s=0.01,
        )
        p = Proposal(
            name="sneaky",
            motivation="m",
            mechanism="m",
            expected_effect="e",
            edit=OS_EDIT,
            proposer="llm",
        )
        node = implement(archive, "grpo", p, archive.config(), llm=llm)
    assert node.status == "rejected" and "import of 'os'" in node.trailer("Poise-Reason")
    log = archive.read_file("sneaky", "records/failures.txt")
    assert "correction after round 1 failed" in log and "HTTP 500" in log
    assert archive.algorithm("sneaky") == archive.algorithm(
        "grpo"
    )  # never-passing code is kept aside
    assert "import os" in archive.read_file("sneaky", "records/rejected_edit.py")
    assert archive.fsck()


def _git_log(arch, ref):
    import subprocess

    out = subprocess.run(
        ["git", "-C", str(arch.path), "log", "--format=%s", ref],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.splitlines()[::-1]


@pytest.mark.slow  # a Ray start / real evaluations: tens of CPU-seconds
def test_every_attempt_is_kept_on_the_branch(archive):
    """Attempt 1 imports os (static check, before the node exists), attempt 2 is NaN (verification),
    attempt 3 passes: both failures are on the branch with code, failing tests and prompts."""
    from engine.config import LLMConfig
    from engine.operators.implement import implement
    from engine.operators.llm import LLMClient
    from engine.operators.propose import Proposal

    S = openai_server
    script = [S.revise_reply(NAN_EDIT), S.revise_reply(GOOD_EDIT)]
    with S.ScriptedOpenAI(script) as srv:
        llm = LLMClient(LLMConfig(base_url=srv.base_url, api_key_env="POISE_NO_SUCH_KEY"), archive)
        p = Proposal(
            name="fixed",
            motivation="m",
            mechanism="centred advantages",
            expected_effect="e",
            edit=OS_EDIT,
            proposer="llm",
        )
        node = implement(archive, "grpo", p, archive.config(), llm=llm)
    assert node.status == "verified"
    tip = archive.read_file("fixed", "algorithm.py")
    assert "torch.zeros_like(scores), stats.mean)" in tip and "* 0.0" not in tip
    read = lambda path: archive.read_file("fixed", path)  # noqa: E731
    # attempt 1: the static check; no node yet, so it lands in the spawn commit of attempt 2
    assert "import os" in read("attempts/1/edit.py")
    assert "attempt 1 failed: static check" in read("attempts/1/failure.txt")
    assert (
        read("attempts/1/correction_prompt.md")
        == "\n\n".join(f"## {m['role']}\n\n{m['content']}" for m in srv.requests[0]["messages"])
        + "\n"
    )
    # attempt 2: verification, with the failing tests and the suite that found them
    fail2 = read("attempts/2/failure.txt")
    assert "non-finite" in fail2 and "failing tests:" in fail2
    assert "- tests/test_interface.py::test_advantages_shape_dtype_finite" in fail2
    assert "* 0.0" in read("attempts/2/algorithm.py")
    assert json.loads(read("attempts/2/verification.json"))["ok"] is False
    assert read("attempts/2/tests/test_interface.py") == read("tests/test_interface.py")
    assert "non-finite" in srv.requests[1]["messages"][-1]["content"]
    assert read("attempts/2/correction_prompt.md").endswith(
        srv.requests[1]["messages"][-1]["content"] + "\n"
    )
    assert read("attempts/3/failure.txt") is None
    # the lineage shows the loop, commit by commit
    subjects = _git_log(archive, "poise/fixed")
    loop = subjects[subjects.index("poise: spawn fixed from grpo") :]
    assert loop == [
        "poise: spawn fixed from grpo",
        "poise: fixed rejected",
        "poise: attempt 2 of fixed failed",
        "poise: correction 3 of fixed",
        "poise: fixed verified",
        "poise: LLM usage of fixed",
    ]
    assert archive.fsck()


HUGE_EDIT = '''\
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Returns 150,000 random numbers: every call's recording is megabytes."""
    return torch.rand(150_000)
'''


@pytest.mark.slow
def test_a_recording_over_the_recording_limit_is_refused(archive, monkeypatch):
    """The engine holds a recording in memory, several times its size: a child that sends more than
    RECORDING_CHANNEL_MB (lowered to 1 here; 64 by default) is refused, not read whole."""
    from engine.operators import recording
    from engine.operators.verify import verify_node

    monkeypatch.setattr(recording, "RECORDING_CHANNEL_MB", 1)
    archive.spawn("grpo", "huge", HUGE_EDIT)
    res = verify_node(archive, "huge")
    assert not res.ok and "sent more than 1 MiB" in res.reason, res.reason
    assert archive.node("huge").status == "rejected" and archive.fsck()


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_hyperparameter_is_refused_before_any_code_runs(archive, value):
    """A JSON reply may hold NaN or Infinity as a default: Python source has no literal for it (it
    would read as the undefined name ``nan``), so the proposal is rejected by the static check with
    that reason, not by a verification failing on a NameError."""
    from engine.operators.implement import implement
    from engine.operators.propose import Proposal

    p = Proposal("nonfinite", "m", "m", "e", hyperparameters={"kl_coef": value})
    node = implement(archive, "grpo", p, archive.config(), rounds=1)
    assert node.status == "rejected"
    assert "must be a finite number" in node.trailer("Poise-Reason")
    assert "verification.json" not in archive.git.ls_tree(node.commit)
    assert archive.algorithm("nonfinite") == archive.algorithm("grpo") and archive.fsck()


ZERO_EDIT = '''\
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Ignores the reward: every sample gets 0 (finite, the right shape, trains nothing)."""
    return torch.zeros(batch.size, dtype=torch.float32)
'''
SIGN_EDIT = '''\
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """GRPO with the sign flipped: wrong answers are reinforced."""
    return -grpo_advantages(batch, cfg)
'''
NO_ADV_LOSS_EDIT = '''\
def policy_loss(log_prob, old_log_prob, advantages, response_mask, cfg, ref_log_prob=None, entropy=None, state=None):
    """Ignores the advantages: maximises the likelihood of every sampled token."""
    return -(log_prob * response_mask).sum() / response_mask.sum().clamp(min=1), {}
'''
ASCENT_LOSS_EDIT = '''\
def policy_loss(log_prob, old_log_prob, advantages, response_mask, cfg, ref_log_prob=None, entropy=None, state=None):
    """The PPO surrogate without its minus sign: gradient ascent on the loss."""
    ratio = torch.exp(log_prob - old_log_prob)
    return (advantages * ratio * response_mask).sum() / response_mask.sum().clamp(min=1), {}
'''


@pytest.mark.slow  # a sandboxed verification each
@pytest.mark.parametrize(
    "edit, test",
    [
        (ZERO_EDIT, "test_advantages_follow_the_reward"),
        (SIGN_EDIT, "test_advantages_follow_the_reward"),
        (NO_ADV_LOSS_EDIT, "test_loss_follows_the_advantages"),
        (ASCENT_LOSS_EDIT, "test_loss_follows_the_advantages"),
    ],
    ids=["zero-advantages", "flipped-advantages", "loss-ignores-advantages", "loss-ascends"],
)
def test_a_mechanism_that_does_not_learn_from_the_reward_is_rejected(edit, test):
    """Finite, well-shaped, deterministic and still wrong: advantages that ignore the reward or
    reinforce wrong answers, a loss whose gradient ignores the advantages or points uphill. Every
    interface test but the direction ones passes these; the verdict must still be a rejection."""
    from engine.archive.edit import apply_edit
    from engine.operators.verify import verify_source
    from trainer_template import ALGORITHM_FILE

    root = ALGORITHM_FILE.read_text(encoding="utf-8")
    res = verify_source(apply_edit(root, edit), root)
    assert not res.ok and res.reason.startswith(test), res.reason
    failed = {t.split("[")[0] for t in res.report["failed"]}
    assert failed == {test}, failed


SPIN_REPR = '''\
class Spin:
    """Not a tensor: an object whose repr never returns."""

    def __repr__(self):
        while True:
            pass


def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Returns an object the harness's failing assertions would print."""
    return Spin()
'''
SPIN_CONFIG = '''\
@dataclass
class Hyperparameters:
    """The root's settings, printed by a repr that never returns."""

    eps: float = 1e-6
    norm_adv_by_std: bool = True
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    kl_coef: float = 0.001
    kl_type: str = "low_var_kl"
    entropy_coef: float = 0.0

    def __repr__(self):
        while True:
            pass


def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Ignores the reward: a failing test, whose report prints the test's arguments (cfg)."""
    return torch.zeros(batch.size, dtype=torch.float32)
'''


@pytest.mark.slow  # a sandboxed verification each
@pytest.mark.parametrize("edit", [SPIN_REPR, SPIN_CONFIG], ids=["returned-object", "config"])
def test_no_candidate_object_reaches_the_harness_after_its_call(edit):
    """After a call's end frame its deadline is off, so the recording child's harness must hold
    only what the replay rebuilds from the recording: a returned object or a config whose
    ``__repr__`` spins would otherwise run when pytest prints a failing assertion (the returned
    value) or a failing test's arguments (cfg), unbounded until the child's wall clock."""
    from engine.archive.edit import apply_edit
    from engine.operators.verify import VerifyLimits, verify_source
    from trainer_template import ALGORITHM_FILE

    root = ALGORITHM_FILE.read_text(encoding="utf-8")
    limits = VerifyLimits(timeout_s=60, cpu_s=60, memory_mb=1500, call_s=1.0)
    res = verify_source(apply_edit(root, edit), root, (), limits)
    assert not res.ok and res.report["static"] == "ok", res.reason
    assert "ended" not in res.report, res.report["ended"]  # the recording child finished its suite
    assert res.report["wall_s"] < 30, res.report["wall_s"]
