"""The LLM endpoint failing during a search: a run stops (resumable, exit 1, one ``error:`` line)
instead of finishing rounds with no candidates; nothing the endpoint echoes (a key included) reaches
the run log or an MLflow artifact; text the LLM wrote is printed as written, never read as markup;
a correction that changes only hyperparameters keeps the edit."""

from __future__ import annotations

import json
import subprocess
import uuid
from dataclasses import replace

import openai_server
import pytest
from results_util import record

from engine import secrets
from engine.archive.store import Archive
from engine.loop.state import load_run

KEY = "sk-canary-" + uuid.uuid4().hex
LLM_TOML = (
    '[propose]\nproposer = "llm"\npopulation = 1\n'
    '[llm]\napi_key_env = "POISE_FAIL_KEY"\nmax_retries = 0\ntimeout_s = 10\n'
)


def _archive(tmp_path, base_url: str) -> Archive:
    toml = LLM_TOML.replace("[llm]\n", f'[llm]\nbase_url = "{base_url}"\n')
    arch = Archive.init(tmp_path / "exp", config_toml=toml)
    record(arch, "grpo", {"overall": 0.5}, preset="tiny")  # evaluated: the run goes to proposing
    return arch


def test_a_run_stops_when_the_endpoint_refuses_and_leaks_nothing(tmp_path, cli):
    refusal = {"status": 401, "message": f"Incorrect API key provided: {KEY}"}
    with openai_server.ScriptedOpenAI(default=refusal) as srv:
        arch = _archive(tmp_path, srv.base_url)
        res = cli(
            "run", "-C", str(arch.path), "--rounds", "3", "--parents", "1", "--population", "1",
            "--seeds", "1", "--preset", "tiny", "--no-report",
            env={"POISE_FAIL_KEY": KEY},
        )  # fmt: skip
        assert len(srv.requests) == 1  # refused once: no further round asked again
    assert res.returncode == 1, res.stdout + res.stderr
    assert "error:" in res.stderr and "refused the request" in res.stderr
    assert "finished" not in res.stdout
    rec = load_run(arch)
    assert rec is not None and rec.data["status"] == "stopped"
    assert "LLMEndpointError" in rec.data["stop_reason"] and "--resume" in rec.data["stop_reason"]
    run_log = (arch.path / ".poise" / "run.log").read_text()
    blobs = subprocess.run(
        ["git", "-C", str(arch.path), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True,
        check=True,
    ).stdout
    for where in (res.stdout, res.stderr, run_log, blobs.decode("utf-8", "replace")):
        assert KEY not in where
    assert arch.fsck()


def test_a_run_without_a_key_stops_before_it_starts(tmp_path, cli, monkeypatch):
    monkeypatch.delenv("POISE_FAIL_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    arch = Archive.init(tmp_path / "exp", config_toml=LLM_TOML)  # no base_url: the OpenAI default
    res = cli(
        "run", "-C", str(arch.path), "--rounds", "1", "--parents", "1", "--population", "1",
        "--seeds", "1", "--preset", "tiny", "--no-report",
    )  # fmt: skip
    assert res.returncode == 1 and "no API key" in res.stderr and "POISE_FAIL_KEY" in res.stderr
    assert arch.nodes()["grpo"].result is None  # the root was not evaluated first
    assert load_run(arch) is None  # no run was recorded


@pytest.mark.slow  # an MLflow store and run on SQLite, ~6 s
def test_the_reflection_artifact_is_scrubbed_as_git_is(tmp_path, monkeypatch):
    from results_util import proxy_result

    from engine.archive.tracking import mlflow_client, node_run
    from engine.operators.reflect import _log_mlflow

    monkeypatch.setenv("POISE_FAIL_KEY", KEY)
    secrets.register_env("POISE_FAIL_KEY")
    arch = Archive.init(tmp_path / "exp")
    with node_run(arch, "grpo") as run:
        rid = run.info.run_id
    result = replace(proxy_result({"overall": 0.5}), mlflow_run_ids=(rid,))
    _log_mlflow(arch, result, f"the narrative quotes the endpoint: {KEY}\n")
    path = mlflow_client(arch.path).download_artifacts(rid, "REFLECTION.md", str(tmp_path))
    text = open(path, encoding="utf-8").read()
    assert KEY not in text and "[redacted]" in text


@pytest.mark.slow
def test_llm_text_is_printed_as_written(tmp_path, cli):
    code = "def compute_advantages(batch, cfg):\n    return batch.rewards * 0\n"
    reply = json.loads(openai_server.proposal_reply("brackets", code))
    reply["proposals"][0]["mechanism"] = "A = (r - mean[group]) / std[group], clipped [/n] at 5"
    with openai_server.ScriptedOpenAI(default=json.dumps(reply)) as srv:
        arch = _archive(tmp_path, srv.base_url)
        res = cli("propose", "grpo", "-C", str(arch.path), env={"POISE_FAIL_KEY": "sk-x"})
    out = " ".join(res.stdout.split())
    assert "Traceback" not in res.stderr and "MarkupError" not in res.stderr
    assert "mean[group]" in out and "[/n]" in out, res.stdout + res.stderr


def test_a_hyperparameter_only_correction_keeps_the_edit():
    from engine.operators.llm import validate_json
    from engine.operators.proposers.llm import REVISE_SCHEMA

    assert validate_json({"hyperparameters": {"kl_coef": 0.1}}, REVISE_SCHEMA) is None
    assert validate_json({"code": "x = 1"}, REVISE_SCHEMA) is None
    assert validate_json({"explanation": "nothing"}, REVISE_SCHEMA) is not None


def test_a_hostile_correction_reply_leaves_the_node_rejected_with_its_reason(tmp_path):
    """Corrections answered with JSON nested past the parser: the node is archived rejected, saying
    the replies stayed malformed, and the archive is intact (no crash midway through the loop)."""
    from engine.config import LLMConfig
    from engine.operators.implement import implement
    from engine.operators.llm import LLMClient
    from engine.operators.propose import Proposal

    arch = Archive.init(tmp_path / "exp")
    edit = "import os\n\n\ndef compute_advantages(batch, cfg):\n    return batch.rewards * 0\n"
    with openai_server.ScriptedOpenAI(default=lambda _req: "[" * 100_000) as srv:
        llm = LLMClient(LLMConfig(base_url=srv.base_url, api_key_env="POISE_NO_KEY"), arch)
        p = Proposal("deep", "m", "m", "e", edit=edit, proposer="llm")
        node = implement(arch, "grpo", p, arch.config(), rounds=2, llm=llm)
    assert len(srv.requests) == 3  # the correction, re-asked twice
    assert node.status == "rejected"
    assert "stayed malformed" in node.trailer("Poise-Reason")
    assert "nested too deeply" in arch.read_file("deep", "records/failures.txt")
    assert arch.fsck() and sorted(arch.nodes()) == ["deep", "grpo"]
