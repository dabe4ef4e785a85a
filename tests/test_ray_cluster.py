"""`poise-git run --ray ADDRESS` on a real two-node Ray cluster: a head and a worker node, each a
`ray start` of its own (its own raylet, temporary directory and process group) on this machine.

One run proves both things the cluster is for: its evaluations run on both nodes (each seed's MLflow
run names the Ray node that ran it), and killing the worker node (its whole process group, SIGKILL:
the raylet and the task running on it) mid-evaluation re-queues that evaluation on the head, where
it completes; nothing is lost, nothing stays `evaluating`, `git fsck` stays clean.

Which node runs what is made certain, not left to Ray's scheduler: an actor holding a node's one
CPU (a "blocker") keeps evaluations off that node while the test wants them elsewhere."""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--preset", "tiny", "--seeds", "1", "--proposer", "offline", "--eval-timeout", "240"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Cluster:
    def __init__(self, root: Path, port: int, head, worker, env: dict[str, str]):
        self.root, self.port, self.head, self.worker, self.env = root, port, head, worker, env
        self.address = f"127.0.0.1:{port}"
        self.tmp = root / "tmp"  # $TMPDIR of every process of the cluster and of the run


def _die_with_the_test() -> None:
    """PR_SET_PDEATHSIG: a node's `ray start --block` gets SIGKILL if the test's process dies
    (its reaper then stops the node's other processes), so a killed test run leaves no raylet."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


@contextmanager
def _two_node_cluster():
    """A Ray head (1 CPU, resource ``head_node``) and a worker node (1 CPU, ``worker_node``), each
    `ray start --block` in a session of its own under a short directory of its own (Ray's socket
    paths must stay under 108 bytes); every process of both, and the directory, gone afterwards."""
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    root = Path(tempfile.mkdtemp(prefix="poise-rayt-", dir=base))
    (root / "tmp").mkdir()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    env = dict(
        os.environ,
        TMPDIR=str(root / "tmp"),
        COLUMNS="400",  # the run's log lines unwrapped
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        RAY_USAGE_STATS_ENABLED="0",
        # token authentication with a token of the cluster's own: `ray start --head` turns it on
        # by itself where ~/.ray/auth_token exists (any local `ray.init` writes one), and then
        # every node and driver must present that token
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(16),
        # a dead node is declared dead within about two seconds, not fifteen
        RAY_health_check_period_ms="500",
        RAY_health_check_failure_threshold="3",
        RAY_health_check_initial_delay_ms="0",
    )
    port = _free_port()
    common = ["--block", "--num-cpus", "1", "--disable-usage-stats"]
    head_cmd = [ray_bin, "start", "--head", "--port", str(port), *common]
    head_cmd += ["--dashboard-agent-listen-port", str(_free_port())]
    head_cmd += ["--include-dashboard=false", "--dashboard-port", str(_free_port())]
    head_cmd += ["--ray-client-server-port", str(_free_port()), "--temp-dir", str(root / "h")]
    head_cmd += ["--resources", '{"head_node": 1}']
    procs = []

    def start(cmd: list[str], log_name: str) -> None:
        with open(root / log_name, "w") as log:
            procs.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_the_test,
                )
            )

    try:
        start(head_cmd, "head.log")
        worker_cmd = [ray_bin, "start", "--address", f"127.0.0.1:{port}", *common]
        worker_cmd += ["--dashboard-agent-listen-port", str(_free_port())]
        worker_cmd += ["--temp-dir", str(root / "w"), "--resources", '{"worker_node": 1}']
        start(worker_cmd, "worker.log")
        yield _Cluster(root, port, procs[0], procs[1], env)
    finally:
        from engine.loop.executor import kill_tree

        # every process the cluster started: each node's session, and whatever names its
        # directory (a Ray worker of the killed node outlives its raylet for a moment)
        for p in procs:
            kill_tree(p.pid, wait=True)
            p.wait()
        for pid, cmd in _processes():
            if str(root) in cmd:
                kill_tree(pid, wait=True)
        shutil.rmtree(root, ignore_errors=True)


def _processes() -> list[tuple[int, str]]:
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append((p.pid, " ".join(p.info["cmdline"] or [])))
    return out


SEEN_RAY_ADDRESS: set[str | None] = set()
"""``RAY_ADDRESS`` in the environment of every evaluation worker :func:`_evaluations` saw"""


def _evaluations(cluster: _Cluster, exp: Path) -> list[tuple[str, str]]:
    """(node name, "head" | "worker") of every evaluation worker of ``exp`` running now, by the Ray
    node whose worker process started it (its command line names the node's directory)."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "engine.loop.executor" not in cmd or not any(str(exp) in c for c in cmd):
            continue
        try:
            job = json.loads(cmd[cmd.index("engine.loop.executor") + 1])
            SEEN_RAY_ADDRESS.add(p.environ().get("RAY_ADDRESS"))
            for parent in p.parents():
                line = " ".join(parent.cmdline())
                for where in ("h", "w"):
                    if f"--temp-dir={cluster.root / where}" in line:
                        found.append((job["node"], "head" if where == "h" else "worker"))
        except (psutil.Error, ValueError, IndexError, KeyError):
            continue
    return found


CONTROLLER = r"""
import json, sys, time
import ray

ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
deadline = time.monotonic() + 120
while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
    time.sleep(0.3)
ids = {r: n["NodeID"] for n in ray.nodes() if n["Alive"] for r in n["Resources"] if r.endswith("_node")}
print(json.dumps(ids), flush=True)


@ray.remote(num_cpus=1)
class Blocker:  # holds its node's one CPU while it lives
    def ready(self):
        return True


held = {}
for line in sys.stdin:
    verb, node, *wait = line.split()
    if verb == "hold":
        held[node] = Blocker.options(resources={node: 1}).remote()
        if wait:  # until it holds the CPU; else it waits in Ray's queue for it
            ray.get(held[node].ready.remote(), timeout=120)
    else:
        ray.kill(held.pop(node))
    print("done", flush=True)
ray.shutdown()
"""


class _Controller:
    """A Ray driver of the test's own, in a process of its own (Ray's state stays out of the test's
    process): it reports the nodes' ids and holds or lets go of a node's CPU on request."""

    def __init__(self, cluster: _Cluster):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CONTROLLER, cluster.address],
            env=cluster.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        line = self.proc.stdout.readline()
        assert line, "the test's Ray driver could not join the cluster"
        self.ids: dict[str, str] = json.loads(line)
        assert set(self.ids) == {"head_node", "worker_node"}, self.ids

    def tell(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "done", command

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _wait_for(what: str, check, run: subprocess.Popen, timeout: float = 300.0):
    """Poll ``check()`` until it returns something true; fail with the run's output if the run
    ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if run.poll() is not None:
            out, err = run.communicate()
            pytest.fail(f"the run ended before {what}: {out[-2000:]}\n{err[-3000:]}")
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_run_on_two_ray_nodes_uses_both_and_requeues_what_a_dead_node_ran(tmp_path):
    pytest.importorskip("ray")
    from engine.archive.store import Archive
    from engine.archive.tracking import find_runs
    from engine.scratch import SCRATCH_PREFIXES

    exp = tmp_path / "exp"
    with _two_node_cluster() as cluster:
        control = _Controller(cluster)
        ids = control.ids
        run = None
        try:
            # the root's evaluation on the head: the worker's CPU is held
            control.tell("hold worker_node wait")
            run = subprocess.Popen(
                [sys.executable, "-m", "engine", "run", "-C", str(exp), "--rounds", "1"]
                + ["--parents", "1", "--population", "2", "--workers", "2"]
                + ["--ray", cluster.address, *SMALL, "--no-report"],
                cwd=REPO,
                env=cluster.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            _wait_for(
                "the root's evaluation on the head",
                lambda: ("grpo", "head") in _evaluations(cluster, exp),
                run,
            )
            # the candidates' on the worker: the head's CPU is held from the root's end on
            # (the blocker waits in Ray's queue until then), the worker's let go
            control.tell("hold head_node")
            control.tell("release worker_node")
            first = _wait_for(
                "a candidate's evaluation on the worker",
                lambda: [n for n, w in _evaluations(cluster, exp) if w == "worker" and n != "grpo"],
                run,
            )[0]
            second = _wait_for(  # queued behind the first on the worker's one CPU
                "the second candidate's evaluation on the worker",
                lambda: [
                    n
                    for n, w in _evaluations(cluster, exp)
                    if w == "worker" and n not in ("grpo", first)
                ],
                run,
            )[0]
            time.sleep(0.2)  # inside its evaluation: a tiny seed trains in seconds
            os.killpg(cluster.worker.pid, signal.SIGKILL)  # the worker node dies: raylet and all
            control.tell("release head_node")  # the head may take the re-queued evaluation
            out, err = run.communicate(timeout=400)
        finally:
            if run is not None and run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
            control.close()
        assert run.returncode == 0, out[-3000:] + err[-3000:]

        arch = Archive(exp)
        nodes = arch.nodes()
        assert set(nodes) == {"grpo", first, second}, sorted(nodes)
        # nothing lost: every node has its result, none is left evaluating
        assert {n: nodes[n].status for n in nodes} == dict.fromkeys(nodes, "evaluated")
        assert all(nodes[n].results["proxy/tiny"].status == "evaluated" for n in nodes)
        assert arch.fsck()
        # where each evaluation ran, by its MLflow run: both nodes, the re-queued one on the head
        runs = find_runs(arch)
        where = {r.data.tags["poise.node"]: r.data.tags.get("poise.ray.node") for r in runs}
        assert where == {
            "grpo": ids["head_node"],
            first: ids["worker_node"],
            second: ids["head_node"],
        }, where
        assert len(runs) == 3 and all(r.info.status == "FINISHED" for r in runs)
        assert all(r.data.tags.get("poise.host") == socket.gethostname() for r in runs)
        # the run says so: the node's death, the re-queue, where each evaluation ran
        assert f"{second}: the Ray node running its evaluation died" in err, err[-3000:]
        assert "NodeDiedError" in err, err[-3000:]
        logged = " ".join(out.split())
        assert f"on ray-node {ids['worker_node'][:8]}" in logged, out[-3000:]
        assert f"re-queued after ray-node {ids['worker_node'][:8]} died" in logged, out[-3000:]
        # a Ray the evaluation starts (verl's) is a private one, never the cluster
        assert SEEN_RAY_ADDRESS == {"local"}, SEEN_RAY_ADDRESS
        # what the killed evaluation left in the temporary directory, the run's end removed
        left = [n for n in os.listdir(cluster.tmp) if n.startswith(SCRATCH_PREFIXES)]
        assert not left, left


@pytest.mark.slow
def test_a_ray_node_without_the_archive_stops_the_run_rather_than_failing_the_candidate(tmp_path):
    """The archive must be at the same path on every node (a shared filesystem). A node that does
    not see it is not the candidate's failure: the task says the set-up failed (the loop then
    stops with that line and records nothing), and nothing is written anywhere."""
    pytest.importorskip("ray")
    from engine.loop.executor import SETUP_FAILED, EvalJob, RayExecutor

    gone = tmp_path / "not-mounted-here"
    ex = RayExecutor("local", 1)
    try:
        out = ex.submit(EvalJob(str(gone), "grpo", seeds=1, preset="tiny")).result(timeout=120)
    finally:
        ex.shutdown(kill=True)
    assert out.status == SETUP_FAILED, out
    assert f"the archive {gone} is not there on ray-node " in out.reason, out.reason
    assert "same path" in out.reason
    assert not gone.exists()
