"""A canary API key (configured under an unusual variable name) and a canary credentials file in $HOME
never reach a git object, an MLflow file, a record or the CLI's output — after a full small flow in
which the LLM endpoint echoes the key and a candidate tries every way to read it."""

from __future__ import annotations

import os
import subprocess
import uuid

import openai_server
import pytest
from conftest import mark_verified, require_boundary

from engine import secrets
from engine.archive.store import Archive
from engine.cli import EXIT_FAILED, EXIT_REJECTED
from engine.sandbox.env import candidate_env, trusted_env, without_secrets

KEY = "sk-canary-" + uuid.uuid4().hex
FILE_SECRET = "file-canary-" + uuid.uuid4().hex

GOOD_EDIT = '''\
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Dr.GRPO: centred by the group mean, no std scaling."""
    scores = batch.rewards.to(torch.float32)
    stats = group_stats(scores, batch.group)
    return scores - torch.where(stats.count < 2, torch.zeros_like(scores), stats.mean)
'''
# The static check would refuse this; it is planted with --no-verify and marked verified to test
# the boundary itself. It gathers what it can and puts it everywhere it can.
SPY = """\
import os


def _loot() -> str:
    found = [repr(dict(os.environ))]
    for path in ["/proc/%s/environ" % p for p in os.listdir("/proc") if p.isdigit()] + [
        os.path.expanduser("~/.ssh/id_rsa"), "HOME_SSH",
    ]:
        try:
            found.append(open(path, errors="replace").read())
        except OSError as exc:
            found.append(str(exc))
    return " ".join(found)


def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    loot = _loot()
    print(loot)
    os.write(2, loot.encode())
    raise ValueError(loot[:2000])
"""


def test_scrub_and_environments(monkeypatch):
    monkeypatch.setenv("LLM_CRED", KEY)
    monkeypatch.setenv("MY_ODD_NAME", "x" * 12)
    secrets.register_env("MY_ODD_NAME")
    assert secrets.scrub(f"key={KEY} odd={'x' * 12}") == "key=[redacted] odd=[redacted]"
    assert KEY.encode() not in secrets.scrub_bytes(KEY.encode() * 3)
    env = candidate_env(home="/scratch", pythonpath="/p")
    assert "LLM_CRED" not in env and "MY_ODD_NAME" not in env and "PATH" in env
    assert os.environ.get("HOME") != env["HOME"]  # nothing of the engine's environment
    monkeypatch.setenv("POISE_SANDBOX_ENV", "LLM_CRED,MY_ODD_NAME,TERM")
    monkeypatch.setenv("TERM", "xterm")
    env = candidate_env(home="/scratch", pythonpath="/p")
    assert env.get("TERM") == "xterm" and "LLM_CRED" not in env and "MY_ODD_NAME" not in env
    trusted = trusted_env()
    assert "LLM_CRED" not in trusted and "MY_ODD_NAME" not in trusted and "TERM" in trusted
    verl = without_secrets({"TOKENIZERS_PARALLELISM": "false"})  # verl's processes (unsandboxed)
    assert "LLM_CRED" not in verl and "MY_ODD_NAME" not in verl and verl["TERM"] == "xterm"
    assert verl["TOKENIZERS_PARALLELISM"] == "false"  # the caller's own names are kept


@pytest.mark.slow
def test_canary_secret_is_nowhere_after_a_full_flow(tmp_path, cli):
    require_boundary()
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(FILE_SECRET)
    spy = SPY.replace("HOME_SSH", str(home / ".ssh" / "id_rsa"))
    toml = tmp_path / "poise.toml"
    toml.write_text(
        '[propose]\nproposer = "llm"\ncorrection_rounds = 1\npopulation = 1\n'
        '[llm]\nmodel = "gpt-4o-mini"\napi_key_env = "LLM_CRED"\n'
    )
    exp = tmp_path / "exp"
    outputs: list[str] = []

    def run(*args, env=None):
        r = cli(*args, "-C", str(exp), env=env)
        outputs.append(r.stdout + r.stderr)
        return r

    r = cli("init", str(exp), "--config", str(toml))
    assert r.returncode == 0, r.stderr
    arch = Archive(exp)
    echo = openai_server.proposal_reply("drgrpo", GOOD_EDIT).replace(
        "test motivation", f"your key is {KEY}"
    )
    with openai_server.ScriptedOpenAI([echo]) as srv:
        env = {
            "OPENAI_BASE_URL": srv.base_url,
            "LLM_CRED": KEY,
            "HOME": str(home),
            "POISE_CACHE_DIR": str(tmp_path / "cache"),
        }
        r = run("spawn", "grpo", "--auto", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert srv.auth and KEY in srv.auth[0]  # the key did go to the endpoint, and only there
        (tmp_path / "spy.py").write_text(spy)
        r = run(
            "spawn",
            "grpo",
            "--name",
            "spy",
            "--edit",
            str(tmp_path / "spy.py"),
            "--no-verify",
            env=env,
        )
        assert r.returncode == 0, r.stderr
        r = run("verify", "spy", env=env)  # the filter refuses it; the boundary is tested below
        assert r.returncode == EXIT_REJECTED and "import of 'os'" in r.stdout, r.stdout + r.stderr
        mark_verified(Archive(exp), "spy")
        r = run("evaluate", "spy", "--preset", "smoke", "--seeds", "1", env=env)
        assert r.returncode == EXIT_FAILED and "ValueError" in r.stdout, r.stdout + r.stderr
        r = run("log", env=env)
        r = run("show", "spy", env=env)
    nodes = Archive(exp).nodes()
    assert nodes["spy"].status == "failed" and nodes["drgrpo"].status == "verified"
    assert "[redacted]" in arch.read_file("drgrpo", "PROPOSAL.md")
    # every git object, every ref, every file of the archive (MLflow's SQLite store included)
    blobs = subprocess.run(
        ["git", "-C", str(exp), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True,
        check=True,
    ).stdout
    refs = subprocess.run(["git", "-C", str(exp), "for-each-ref"], capture_output=True).stdout
    files = b"".join(p.read_bytes() for p in exp.rglob("*") if p.is_file())
    assert (exp / "mlflow.db").is_file() and b"poise.reason" in files
    for secret in (KEY, FILE_SECRET):
        assert secret.encode() not in blobs + refs + files, secret
        assert not any(secret in out for out in outputs), secret
    assert arch.fsck()


def test_a_tracking_uris_credentials_are_scrubbed_and_not_shown(monkeypatch, cli, tmp_path):
    """``MLFLOW_TRACKING_URI=https://user:pass@host/`` was no secret to the scrubber (its name does
    not look like one), so an error quoting the URI carried the password into git, MLflow or the
    terminal; and ``poise-git ui`` printed the URI as it was. The password is now scrubbed like a
    key, and ``ui`` shows the server without its user and password, even one too short to scrub."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://me:s3cret-pw@mlflow.example/")
    said = "API request to https://me:s3cret-pw@mlflow.example/api/2.0 failed"
    assert secrets.scrub(said) == "API request to https://[redacted]@mlflow.example/api/2.0 failed"
    arch = Archive.init(tmp_path / "exp")
    out = cli("ui", "-C", str(arch.path), env={"MLFLOW_TRACKING_URI": "https://u:pw1@h.example/"})
    assert out.returncode == 0, out.stderr
    assert "pw1" not in out.stdout + out.stderr and "https://h.example/" in out.stdout
