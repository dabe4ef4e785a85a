"""The loop's own pieces on real archives: budgets, the objective syntax, the run record and the
pending-work state machine that `run --resume` follows, and the evaluation executor's limits."""

from __future__ import annotations

import time

import pytest
from results_util import record

from engine.errors import ConfigError
from engine.loop.budget import Budget, RunUsage, exhausted


def test_budget_parse_and_first_exhausted():
    b = Budget.parse(["candidates=8", "wall=1.5h,tokens=2e5", "cost=3", "gpu-hours=0.5"])
    assert (b.candidates, b.wall_s, b.tokens, b.cost_usd, b.device_hours) == (
        8,
        5400.0,
        200000,
        3.0,
        0.5,
    )
    assert exhausted(b, RunUsage(candidates=7, wall_s=10)) is None
    assert exhausted(b, RunUsage(candidates=8, wall_s=6000)).startswith(
        "candidate budget exhausted: used 8 of 8"
    )
    assert "wall-time budget exhausted" in exhausted(b, RunUsage(candidates=1, wall_s=5400))
    assert "accelerator-hour" in exhausted(b, RunUsage(device_hours=0.6))
    assert Budget.parse(["wall=90s"]).wall_s == 90 and Budget.parse(["wall=30m"]).wall_s == 1800
    merged = Budget(candidates=4, wall_s=60).merged(Budget(candidates=10))
    assert (merged.candidates, merged.wall_s) == (10, 60)
    for bad in (["candidates"], ["apples=3"], ["wall=soon"], ["cost=-1"]):
        with pytest.raises(ConfigError):
            Budget.parse(bad)


def test_objective_syntax_covers_the_length_compression_experiment():
    from engine.config import ExperimentConfig
    from engine.select.objective import (
        describe_objective,
        has_length_objective,
        parse_objective,
        with_objective,
    )

    assert parse_objective("overall") == {"objective": "overall"}
    assert parse_objective("overall - 0.002*mean_length") == {
        "objective": "overall",
        "length_penalty": 0.002,
    }
    assert parse_objective("pareto(overall, -mean_length)") == {
        "objective": "overall",
        "pareto_objectives": ("overall", "-mean_length"),
    }
    exp = with_objective(
        ExperimentConfig(),
        "overall - 0.002*mean_length",
        "cut mean length by a quarter without losing Overall",
    )
    assert (
        exp.length_penalty == 0.002
        and exp.directive.startswith("cut mean length")
        and has_length_objective(exp)
    )
    assert describe_objective(exp) == "maximize overall - 0.002*mean_length"
    for bad in ("", "pareto(overall)", "overall + length", "overall - x*mean_length"):
        with pytest.raises(ConfigError):
            parse_objective(bad)


def test_pending_work_follows_the_status_machine(archive):
    from engine.loop.state import pending_work

    nodes = archive.nodes()
    assert pending_work(archive, nodes).evaluate == ["grpo"]  # the root is evaluated first
    record(archive, "grpo", {"overall": 0.5})
    archive.spawn("grpo", "a", trailers={"Poise-Round": "1"})  # spawned -> verify
    archive.spawn(
        "grpo", "b", trailers={"Poise-Round": "1"}, status="verified"
    )  # verified -> evaluate
    archive.spawn("grpo", "c", trailers={"Poise-Round": "1"}, status="verified")
    archive.set_status("c", "evaluating")  # evaluating -> evaluate
    archive.spawn("grpo", "d", trailers={"Poise-Round": "1"}, status="verified")
    record(archive, "d", {"overall": 0.6})  # evaluated -> reflect
    archive.spawn("grpo", "e", trailers={"Poise-Round": "1"}, status="verified")
    record(archive, "e", {"overall": 0.4})
    archive.record_reflection("e", "# fine\n")  # done
    archive.spawn("grpo", "f", trailers={"Poise-Round": "1"})
    archive.set_status("f", "rejected", reason="imports os")  # done
    archive.spawn("grpo", "manual")  # not the loop's: left alone
    todo = pending_work(archive, archive.nodes())
    assert (todo.verify, sorted(todo.evaluate), todo.reflect) == (["a"], ["b", "c"], ["d"])
    assert todo.count() == 4


def test_run_record_lives_on_a_git_ref_with_compare_and_swap(archive):
    from engine.loop.state import RUN_REF, RunRecord, RunStateError, last_round, load_run, save_run

    assert load_run(archive) is None
    rec = save_run(
        archive,
        RunRecord({"id": "r1", "plan": {"rounds": 2}, "selections": {}}),
        "poise: run r1 started",
    )
    stale = RunRecord(dict(rec.data), rec.commit)
    rec.data["round"] = 1
    save_run(archive, rec, "poise: run r1 round 1")
    assert load_run(archive).get("round") == 1
    with pytest.raises(RunStateError, match="another `poise-git run`"):
        save_run(archive, stale, "poise: a second writer")
    assert len(archive.git.text("log", "--format=%H", RUN_REF).split()) == 2
    assert "r1" not in archive.nodes()  # the record is not a node
    archive.spawn("grpo", "x", trailers={"Poise-Round": "3"})
    assert last_round(archive.nodes()) == 3
    assert archive.fsck()


def _crashing_evaluation(archive, name: str, tags: dict | None = None):
    """The outcome of evaluating verified node ``name`` in a worker that dies (its evaluation
    raises inside the worker: an unknown backend), through the loop's local executor."""
    from engine.loop.executor import EvalJob, LocalExecutor

    job = EvalJob(
        str(archive.path), name, backend="no-such-backend", seeds=1, timeout_s=120, tags=tags or {}
    )
    ex = LocalExecutor(1)
    try:
        return ex.submit(job).result(timeout=180)
    finally:
        ex.shutdown()


def test_executor_records_a_crashed_evaluation_as_failed(archive):
    """A worker that dies (here: the node's evaluation raises inside the worker) gives a failed node
    with the reason, never an exception in the loop."""
    archive.spawn("grpo", "ghost-backend", trailers={"Poise-Round": "1"}, status="verified")
    out = _crashing_evaluation(archive, "ghost-backend")
    node = archive.node("ghost-backend")
    assert out.status == "failed" and node.status == "failed"
    assert node.trailer("Poise-Reason") and out.reason
    (res,) = node.results.values()  # under the job's own protocol, not the experiment's
    assert res.status == "failed" and res.source == "loop" and res.reason
    assert archive.fsck()


@pytest.mark.slow
def test_a_dead_worker_leaves_no_mlflow_run_running(archive):
    """A worker killed while it logs to MLflow never ends its run: the run it opened, carrying the
    job's tags, is marked KILLED when its node is recorded failed. A RUNNING run of the same node
    without the job's tags (another process's evaluation) is left alone."""
    from engine.archive.tracking import find_runs, mlflow_client, node_run

    archive.spawn("grpo", "dies-logging", trailers={"Poise-Round": "1"}, status="verified")
    job_tags = {"poise.run": "r7", "poise.round": "1"}
    with node_run(archive, "dies-logging", tags=job_tags) as run:  # the dead worker's run
        mine = run.info.run_id
    with node_run(archive, "dies-logging", tags={"poise.run": "elsewhere"}) as run:
        theirs = run.info.run_id
    client = mlflow_client(archive.path)
    for rid in (mine, theirs):  # as a process killed inside `node_run` leaves them
        client.update_run(rid, status="RUNNING")
    out = _crashing_evaluation(archive, "dies-logging", job_tags)
    assert out.status == "failed"
    status = {r.info.run_id: r.info.status for r in find_runs(archive, "dies-logging")}
    assert status == {mine: "KILLED", theirs: "RUNNING"}
    assert archive.fsck()


HANGS = (
    "def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:\n"
    "    while True:\n        pass\n"
)


@pytest.mark.slow  # W worker processes start and warm up before the stop: 15-30 s on 2 cores
def test_a_stopped_executor_starts_none_of_its_queued_evaluations(archive):
    """Stopping (Ctrl-C, a wall-time budget) kills the running evaluations and starts no queued one:
    the threads whose workers were killed took the next queued job while the rest were still being
    killed, so the stop waited out whole evaluations and recorded their outcomes."""
    from conftest import mark_verified

    from engine.loop.executor import STOPPED, EvalJob, LocalExecutor
    from engine.loop.state import pending_work

    workers, queued = 8, 8
    names = [f"hangs-{i}" for i in range(workers + queued)]
    for name in names:
        archive.spawn("grpo", name, HANGS, trailers={"Poise-Round": "1"})
        mark_verified(archive, name)
    ex = LocalExecutor(workers)
    futures = [
        ex.submit(EvalJob(str(archive.path), n, seeds=1, preset="smoke", timeout_s=20))
        for n in names
    ]
    deadline = time.monotonic() + 240
    while sum(n.status == "evaluating" for n in archive.nodes().values()) < workers:
        assert time.monotonic() < deadline, "the workers never started evaluating"
        time.sleep(0.2)
    t0 = time.monotonic()
    ex.shutdown(kill=True)
    took = time.monotonic() - t0
    outcomes = [f.result().status for f in futures if not f.cancelled()]
    statuses = {k: n.status for k, n in archive.nodes().items() if k in names}
    assert took < 10, took
    assert outcomes == [STOPPED] * len(outcomes), outcomes
    assert sorted(statuses.values()) == ["evaluating"] * workers + ["verified"] * queued, statuses
    assert set(names) <= set(pending_work(archive, archive.nodes("proxy/smoke")).evaluate)
    assert archive.fsck()


def test_kill_tree_reaches_descendants_in_their_own_sessions(tmp_path):
    import subprocess
    import sys

    import psutil

    from engine.loop.executor import kill_tree

    script = tmp_path / "spawner.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    grandchild = int(proc.stdout.readline())
    assert psutil.pid_exists(grandchild)
    kill_tree(proc.pid)
    proc.wait(timeout=10)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            if psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the grandchild in its own session survived kill_tree")


def test_run_rejects_bad_input_before_touching_anything(tmp_path, cli):
    exp = tmp_path / "exp"
    p = cli("run", "-C", str(exp), "--rounds", "0")
    assert p.returncode != 0 and not exp.exists()
    p = cli("run", "-C", str(exp), "--objective", "overall + length")
    assert p.returncode == 1 and "--objective" in p.stderr and not exp.exists()
    p = cli("run", "-C", str(exp), "--budget", "apples=3")
    assert p.returncode == 1 and "unknown kind 'apples'" in p.stderr and not exp.exists()
    p = cli("run", "-C", str(exp), "--resume")
    assert p.returncode == 1 and "nothing to resume" in p.stderr and not exp.exists()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    p = cli("run", "-C", str(tmp_path / "notes"))
    assert p.returncode == 1 and "not a poise-git archive" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_resume_without_a_run_says_so(archive, cli):
    p = cli("run", "-C", str(archive.path), "--resume")
    assert p.returncode == 1 and "nothing to resume: no `poise-git run` has started" in p.stderr
    assert archive.fsck()


def test_pending_work_evaluates_nodes_that_lack_a_result_under_the_runs_protocol(archive):
    """A root and a child evaluated at the smoke preset are evaluated again by a run at the default
    preset (their smoke results are never read as default ones); under smoke nothing is left."""
    from engine.archive.results import configured_protocol
    from engine.loop.state import pending_work

    record(archive, "grpo", {"overall": 0.5}, preset="smoke")
    archive.spawn("grpo", "a", trailers={"Poise-Round": "1"}, status="verified")
    record(archive, "a", {"overall": 0.6}, preset="smoke")
    archive.record_reflection("a", "# fine\n")
    default = pending_work(archive, archive.nodes(configured_protocol(archive.config())))
    assert sorted(default.evaluate) == ["a", "grpo"]
    assert not pending_work(archive, archive.nodes("proxy/smoke"))


def test_a_second_run_is_refused_up_front_and_touches_nothing(archive, cli):
    """While one `poise-git run` holds the archive, another (``--resume`` too) stops at once with one
    error line naming the holder, before it reads or writes the run record or spawns anything."""
    import os

    from engine.loop.state import RUN_REF, load_run, run_lock

    record(archive, "grpo", {"overall": 0.5}, preset="tiny")
    refs = archive.git.text("for-each-ref")
    with run_lock(archive):
        for extra in ((), ("--resume",)):
            res = cli(
                "run", "-C", str(archive.path), "--rounds", "1", "--parents", "1",
                "--population", "1", "--seeds", "1", "--preset", "tiny", "--no-report", *extra,
            )  # fmt: skip
            assert res.returncode == 1, res.stdout + res.stderr
            assert "another `poise-git run` is running in this archive" in res.stderr
            assert f"pid {os.getpid()}" in res.stderr
    assert load_run(archive) is None and not archive.git.ok("rev-parse", "-q", "--verify", RUN_REF)
    assert archive.git.text("for-each-ref") == refs  # nothing spawned, nothing recorded
    with run_lock(archive):  # released when the holder's block ended
        pass


def test_a_killed_run_leaves_the_run_lock_free(archive, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from engine.loop.state import RunStateError, run_lock

    holder = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys, time\nfrom engine.archive.store import Archive\n"
            "from engine.loop.state import run_lock\n"
            f"with run_lock(Archive({str(archive.path)!r})):\n"
            "    print('held', flush=True)\n    time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunStateError, match=f"pid {holder.pid}"):
            with run_lock(archive):
                pass
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    with run_lock(archive):  # the kernel released it with the process
        pass


@pytest.mark.parametrize("text", ["[1, 2]", '{"plan": {}}', '{"id": 7}', "[" * 5000])
def test_a_run_record_that_is_not_one_is_a_clear_error(archive, text):
    from engine.loop.state import RUN_FILE, RUN_REF, RunStateError, load_run

    oid = archive.git.write_blobs([text.encode()])[0]
    tree = archive.git.write_tree({RUN_FILE: ("100644", oid)})
    archive.git.update_ref(RUN_REF, archive.git.commit_tree(tree, [], "damaged"), None, "test")
    with pytest.raises(RunStateError, match="not a run record|not valid JSON"):
        load_run(archive)
