"""A verl experiment ranks under the protocol its scored results are recorded under (math6/paper at
the scoring's hash), and a failed verl training is recorded there too: one protocol holds a node's
verl outcome, whichever it was. Driven on the CPU from the results the verl path records (the
training and the scoring need a GPU); docs/verl.md, "A run on verl and the protocol it ranks under"."""

from __future__ import annotations

import json

import pytest
from results_util import record_verl_outcome

from engine.archive.results import EvaluationResult, ProtocolRef, configured_protocol
from engine.archive.store import Archive
from engine.config import DEFAULT_TOML, parse_config
from engine.loop.state import pending_work

VERL_TOML = DEFAULT_TOML.replace('backend = "proxy"', 'backend = "verl"', 1)


@pytest.fixture
def verl_archive(tmp_path):
    return Archive.init(tmp_path / "exp", config_toml=VERL_TOML)


def _scoring():
    from engine.operators.evaluate_suite import suite_protocol
    from engine.operators.evaluate_verl import SCORING

    return suite_protocol(**SCORING)


def _log(cli, archive) -> dict:
    p = cli("log", "--json", "-C", str(archive.path))
    assert p.returncode == 0, p.stdout + p.stderr
    return {row["node"]: row for row in json.loads(p.stdout)}


def _no_parent(cli, archive) -> bool:
    """`select` finds no parent: the root's failure counts."""
    p = cli("select", "-C", str(archive.path))
    return p.returncode == 1 and "no node can be a parent" in p.stderr


def _select(cli, archive) -> dict:
    p = cli("select", "--json", "--explain", "-C", str(archive.path))
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout)


def test_a_verl_experiment_ranks_under_the_protocol_its_checkpoints_are_scored_under(
    verl_archive, cli
):
    """Before, a verl experiment ranked under verl/paper, which only ever held failures: a scored
    root had no result there, `log` and `select` showed nothing for it, and the run's pending work
    listed it for evaluation again (hours of training at every start or --resume)."""
    scored = _scoring()
    ref = configured_protocol(verl_archive.config())
    assert ref == ProtocolRef("math6/paper", scored.hash)
    record_verl_outcome(verl_archive, scored, "evaluated")
    nodes = verl_archive.nodes()
    assert nodes["grpo"].result is not None and nodes["grpo"].result.value == 41.5
    assert not pending_work(verl_archive, nodes)
    row = _log(cli, verl_archive)["grpo"]
    assert row["overall"] == 41.5 and row["protocol"] == scored.key
    sel = _select(cli, verl_archive)
    assert sel["chosen"] == ["grpo"] and sel["params"]["protocol"] == scored.key


def test_an_explicit_protocol_and_the_proxy_rank_as_before(tmp_path):
    """``[evaluation].protocol`` still decides where it is set; the proxy's protocol is unchanged."""
    from trainer_template.proxy.protocol import get_protocol

    for explicit, ref in (
        ("verl/paper", ProtocolRef("verl/paper")),
        ("math6/paper", ProtocolRef("math6/paper")),
        ("math6/paper@abc123", ProtocolRef("math6/paper", "abc123")),
    ):
        toml = VERL_TOML.replace('# protocol = "proxy/default"', f'protocol = "{explicit}"', 1)
        assert configured_protocol(parse_config(toml)) == ref
    proxy = configured_protocol(parse_config(DEFAULT_TOML))
    assert proxy == ProtocolRef("proxy/default", get_protocol("default").hash())


def test_a_failed_verl_training_is_recorded_under_the_ranking_protocol(verl_archive, cli):
    """A training that fails is recorded as the node's verl outcome under the scoring protocol (it
    replaces a scored result there, as any re-evaluation does), with its reason and what the
    training took; an earlier training's failure under verl/paper goes. The node is failed under
    the ranking protocol: not pending, shown failed, failure evidence, never a parent."""
    from engine.archive.results import Protocol
    from engine.operators.evaluate_verl import _record_training_failure

    scored = _scoring()
    record_verl_outcome(
        verl_archive, Protocol("verl/paper", backend="verl", preset="paper"), "failed"
    )
    record_verl_outcome(verl_archive, scored, "evaluated")
    said: list[str] = []
    training = {"gpus": 8, "wall_time_s": 7200.0, "mlflow_run_id": "run1"}
    result = _record_training_failure(
        verl_archive, "grpo", scored, "verl training failed: exit status 2", training, said.append
    )
    node = verl_archive.node("grpo")
    assert list(node.results) == ["math6/paper"] and node.status == "failed"
    r = node.results["math6/paper"]
    assert r == result and r.protocol.hash == scored.hash and r.status == "failed"
    assert r.reason == "verl training failed: exit status 2" and r.seeds == (0,)
    assert r.details["training"] == {"gpus": 8, "wall_time_s": 7200.0, "mlflow_run_id": "run1"}
    assert r.wall_time_s == 7200.0 and r.mlflow_run_ids == ("run1",)
    assert node.trailer("Poise-Reason") == "verl training failed: exit status 2"
    assert any("verl/paper" in line and "removed" in line for line in said), said
    nodes = verl_archive.nodes()
    # failure evidence under the ranking protocol: its result there is a failure
    assert nodes["grpo"].result == r and not r.ok
    assert not pending_work(verl_archive, nodes)
    row = _log(cli, verl_archive)["grpo"]
    assert row["status"] == "failed" and row["protocol"] == scored.key
    assert _no_parent(cli, verl_archive)
    # trained again and scored: the success replaces the failure, its reason with it
    record_verl_outcome(verl_archive, scored, "evaluated")
    node = verl_archive.node("grpo")
    assert node.status == "evaluated" and node.trailer("Poise-Reason") is None
    shown = cli("show", "grpo", "-C", str(verl_archive.path))
    assert shown.returncode == 0 and "reason" not in shown.stdout, shown.stdout
    assert verl_archive.fsck()


def test_a_lost_verl_worker_is_recorded_under_the_ranking_protocol(verl_archive):
    """A loop worker on verl that dies is recorded failed where its evaluation would have recorded
    (math6/paper at the scoring's hash), charged for its GPUs; one killed after its scoring was
    recorded keeps that result (before, the loop looked under verl/paper only and recorded a
    failure beside it)."""
    from engine.loop.executor import EvalJob, job_protocol, record_failure

    scored = _scoring()
    job = EvalJob(str(verl_archive.path), "grpo", backend="verl", devices=8.0)
    assert job_protocol(verl_archive, job) == scored
    verl_archive.set_status("grpo", "evaluating")
    out = record_failure(job, "evaluation process killed by SIGKILL", 3600.0)
    assert out.status == "failed"
    node = verl_archive.node("grpo")
    assert list(node.results) == ["math6/paper"]
    r = node.results["math6/paper"]
    assert r.protocol.hash == scored.hash and r.source == "loop" and r.seeds == (0,)
    assert r.reason == "evaluation process killed by SIGKILL"
    assert r.details["training"] == {"gpus": 8.0, "wall_time_s": 3600.0}
    assert not pending_work(verl_archive, verl_archive.nodes())

    record_verl_outcome(
        verl_archive, scored, "evaluated"
    )  # the scoring recorded, then the worker killed
    out = record_failure(job, "evaluation process killed by SIGKILL", 3700.0)
    assert out.status == "evaluated" and out.overall == 41.5
    node = verl_archive.node("grpo")
    assert node.status == "evaluated" and node.results["math6/paper"].ok and verl_archive.fsck()


def test_an_old_verl_paper_failure_still_reads_and_counts_as_failed(verl_archive, cli):
    """An archive from before holds a failed training under verl/paper. It is read as before and
    shown (`show`, `log`'s results); under the ranking protocol the node has no result but stays
    failed: not pending (a start or --resume does not train it again), never a parent.
    `evaluate --backend verl` trains it again and removes the old failure once its outcome is
    recorded (test_a_failed_verl_training_is_recorded_under_the_ranking_protocol)."""
    from engine.archive.results import Protocol

    record_verl_outcome(
        verl_archive, Protocol("verl/paper", backend="verl", preset="paper"), "failed"
    )
    nodes = verl_archive.nodes()
    assert nodes["grpo"].result is None and nodes["grpo"].status == "failed"
    assert not pending_work(verl_archive, nodes)
    row = _log(cli, verl_archive)["grpo"]
    assert row["status"] == "failed" and row["results"]["verl/paper"]["status"] == "failed"
    shown = cli("show", "grpo", "-C", str(verl_archive.path))
    assert shown.returncode == 0 and "verl training failed: exit status 1" in shown.stdout
    assert _no_parent(cli, verl_archive)


def test_a_verl_evaluations_result_is_charged_for_its_training(verl_archive):
    """The gpu-hours budget: a verl evaluation's result (recorded under the suite protocol) is
    charged the training's GPUs over the training's time, measured by the engine around the
    training process, and the GPUs its vLLM engine spanned over the scoring; before, only the
    scoring's time on one device. A failure recorded under verl/paper by an earlier version is
    charged as before."""
    from engine.archive.results import Protocol
    from engine.loop.budget import result_device_hours

    scored = _scoring()
    training = {"gpus": 8, "wall_time_s": 3600.0, "mlflow_run_id": "r"}
    r = record_verl_outcome(
        verl_archive, scored, "evaluated", wall_time_s=3960.0, details={"training": training}
    )
    assert result_device_hours(r, 4.0) == pytest.approx(8.0 + 0.1)
    wide = {"training": training, "generation": {"backend": "vllm", "tensor_parallel_size": 4}}
    r4 = record_verl_outcome(
        verl_archive, scored, "evaluated", wall_time_s=3960.0, details=wide
    )  # a scoring whose vLLM engine spans 4 GPUs is charged 4 of them
    assert result_device_hours(r4, 4.0) == pytest.approx(8.0 + 0.4)
    old = record_verl_outcome(
        verl_archive, Protocol("verl/paper", backend="verl", preset="paper"), "failed",
        wall_time_s=1800.0,
    )  # fmt: skip
    assert result_device_hours(old, 4.0) == pytest.approx(2.0)
    plain = EvaluationResult(scored, "evaluated", {"overall": 1.0}, {"overall": "percent"},
                             seeds=(0,), wall_time_s=1800.0)  # fmt: skip
    assert result_device_hours(plain, 4.0) == pytest.approx(0.5)


def test_the_scoring_of_a_verl_checkpoint_records_what_the_training_took(archive):
    """``evaluate_node_on_suite(training=...)``: the scored result (a failed scoring too) carries the
    training's GPUs and time, and its wall time counts both."""
    import socket

    from engine.operators.evaluate_suite import evaluate_node_on_suite

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    training = {"gpus": 8, "wall_time_s": 500.0, "mlflow_run_id": "r"}
    result = evaluate_node_on_suite(
        archive, "grpo", generator="openai", model="m", base_url=f"http://127.0.0.1:{port}/v1",
        limit=1, generator_kwargs={"max_retries": 0}, training=training,
    )  # fmt: skip
    assert result.status == "failed" and "cannot reach" in result.reason
    assert result.details["training"] == training and result.wall_time_s >= 500.0
    assert archive.node("grpo").results["math6/paper"] == result
