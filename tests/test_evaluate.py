"""engine.operators.evaluate on the smoke proxy: results on the node's branch, failures recorded, MLflow runs, CLI."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import mark_verified, node_lock_holder

from engine.archive.store import Archive

BROKEN = '''
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Deliberately broken."""
    raise RuntimeError("deliberately broken mechanism")
'''

DR_GRPO = '''
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    """Dr.GRPO: group-centred, not scaled."""
    stats = group_stats(batch.rewards.to(torch.float32), batch.group)
    return batch.rewards.to(torch.float32) - stats.mean
'''


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    cache = tmp_path_factory.mktemp("proxy-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("POISE_CACHE_DIR", str(cache))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    arch = Archive.init(tmp_path_factory.mktemp("arch") / "exp")
    arch.spawn("grpo", "broken", edit=BROKEN)
    arch.spawn("grpo", "drgrpo", edit=DR_GRPO)
    arch.spawn("grpo", "unverified", edit=DR_GRPO)
    mark_verified(arch, "broken")  # it raises only when trained: as if it passed verification
    mark_verified(arch, "drgrpo")
    yield arch
    mp.undo()


@pytest.mark.slow  # two seeds of the smoke preset, logged to MLflow
def test_evaluate_records_results_on_the_branch_and_mlflow(exp):
    from engine.archive.tracking import find_runs, tracking_uri
    from engine.operators.evaluate import evaluate_node

    events = []
    result = evaluate_node(exp, "grpo", seeds=2, preset="smoke", on_event=events.append)
    assert result.status == "evaluated", result.reason
    node = Archive(exp.path).node("grpo")  # read back from git alone
    assert node.status == "evaluated" and node.results["proxy/smoke"] == result
    blob = subprocess.run(
        ["git", "-C", str(exp.path), "show", "poise/grpo:results/proxy/smoke.json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    res = json.loads(blob)
    assert res["schema"] == "poise.result/2" and res["status"] == "evaluated"
    m = res["metrics"]
    for key in (
        "overall",
        "mean_length",
        "valid_rate",
        "hard/pass@8",
        "hard/pass@1",
        "hard/acc@1",
        "easy/acc@1",
    ):
        assert key in m and 0 <= m[key] <= (100 if key == "mean_length" else 1)
        assert res["units"][key] == ("tokens" if key == "mean_length" else "fraction")
    lo, hi = res["intervals"]["overall"]
    assert lo <= m["overall"] <= hi and res["interval_kind"] == "95% Student-t over seeds"
    proto = res["protocol"]
    assert res["seeds"] == [0, 1] and len(res["per_seed"]) == 2 and res["utility"] == "overall"
    assert proto["id"] == "proxy/smoke" and proto["hash"].startswith("sha256:")
    assert (
        proto["backend"] == "proxy" and res["details"]["versions"]["torch"] and res["node_commit"]
    )
    assert res["details"]["machine"]["cores"] >= 1 and res["details"]["machine"]["cpu"]
    # the device it trained on, by model (a GPU's name on cuda), and the torch that trained it
    assert res["details"]["device"] == res["details"]["device_model"] == "cpu"
    import torch

    assert res["details"]["versions"]["torch"] == torch.__version__

    assert (
        res["details"]["machine"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    )
    assert len(res["trajectory"]["step"]) == proto["settings"]["rl"]["steps"] <= 100
    assert {"train/reward_mean", "train/entropy", "train/kl", "train/adv_std"} <= set(
        res["trajectory"]
    )
    assert node.trailer("Poise-Results") == "proxy/smoke" and exp.fsck()
    # the smoke result is not compared under the experiment's protocol (proxy/default)
    assert node.result is None and Archive(exp.path).nodes("proxy/smoke")["grpo"].evaluated
    assert any("seed 1" in e for e in events)
    # MLflow: one run per seed in the archive's SQLite store, tagged and with batched step metrics
    assert tracking_uri(exp.path).startswith("sqlite:///") and (exp.path / "mlflow.db").is_file()
    runs = find_runs(exp, "grpo")
    assert sorted(r.info.run_id for r in runs) == sorted(res["mlflow_run_ids"])
    for r in runs:
        assert r.data.tags["poise.node"] == "grpo" and r.data.tags["mlflow.source.git.commit"]
        assert "poise.parent" in r.data.tags
        assert "eval/overall" in r.data.metrics and "train/reward_mean" in r.data.metrics
        assert "eval/hard/pass_at_8" in r.data.metrics  # '@' is not allowed in MLflow names
    from mlflow.tracking import MlflowClient

    hist = MlflowClient(tracking_uri(exp.path)).get_metric_history(
        runs[0].info.run_id, "train/reward_mean"
    )
    assert len(hist) == proto["settings"]["rl"]["steps"]
    # each seed's row carries its training series' means over the last third: the same numbers as
    # that seed's MLflow history (what the reflection pairs with the parent's seeds)
    from engine.stats import tail_mean

    row = next(r for r in res["per_seed"] if r["mlflow_run_id"] == runs[0].info.run_id)
    assert row["trajectory_tail"]["train/reward_mean"] == pytest.approx(
        tail_mean([m.value for m in sorted(hist, key=lambda m: m.step)])
    )
    assert {"train/entropy", "train/kl"} <= set(row["trajectory_tail"])
    assert "step" not in row["trajectory_tail"]


@pytest.mark.slow  # warm start + seed workers + a new MLflow store
def test_broken_candidate_is_recorded_as_failed(exp):
    from engine.archive.tracking import find_runs
    from engine.operators.evaluate import evaluate_node

    result = evaluate_node(exp, "broken", seeds=1, preset="smoke")
    assert result.status == "failed"
    assert "compute_advantages raised RuntimeError: deliberately broken mechanism" in result.reason
    node = Archive(exp.path).node("broken")
    assert node.status == "failed" and node.results["proxy/smoke"].reason == result.reason
    assert "deliberately broken" in node.trailer("Poise-Reason")
    runs = find_runs(exp, "broken")
    assert len(runs) == 1 and runs[0].data.tags["poise.status"] == "failed"
    assert runs[0].data.tags["poise.parent"] == "grpo"
    assert exp.fsck()


@pytest.mark.slow  # three trusted warm-start children (torch imports)
def test_a_process_asks_for_the_warm_start_once_until_its_checkpoint_changes(exp, monkeypatch):
    import engine.operators.evaluate as ev
    from engine.sandbox.process import trusted_env

    asked = []

    def counted(argv, **kw):  # the real trusted child, counted
        asked.append(argv)
        return real(argv, **kw)

    real = ev.run_limited
    monkeypatch.setattr(ev, "run_limited", counted)
    monkeypatch.setattr(ev, "_WARM", {})
    env = trusted_env()
    first = ev._warm_start("smoke", env, 600.0)
    assert ev._warm_start("smoke", env, 600.0) == first and len(asked) == 1
    capability, content, device, ckpt = first[-4:]
    import torch

    assert capability == torch.backends.cpu.get_cpu_capability() and device == "cpu"
    assert content.startswith("sha256:") and os.path.isfile(ckpt)
    # another cache directory is another question
    other = {**env, "POISE_CACHE_DIR": str(exp.path.parent / "elsewhere")}
    assert ev._warm_start("smoke", other, 600.0)[-3] == content and len(asked) == 2
    # a checkpoint that is no longer the file it was (rewritten, replaced) is asked about again
    st = os.stat(ckpt)
    os.utime(ckpt, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    try:
        assert ev._warm_start("smoke", env, 600.0)[-3] == content and len(asked) == 3
    finally:  # the shipped checkpoint's time stamp as it was
        os.utime(ckpt, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_unknown_preset_and_backend_are_clear_errors(exp):
    from engine.errors import EvaluationError
    from engine.operators.evaluate import evaluate_node

    with pytest.raises(EvaluationError, match="unknown proxy preset"):
        evaluate_node(exp, "drgrpo", preset="giant")
    with pytest.raises(EvaluationError, match="backend"):
        evaluate_node(exp, "drgrpo", backend="tpu")
    assert Archive(exp.path).node("drgrpo").status == "verified"


def test_evaluate_refuses_a_node_that_is_not_verified(exp, cli):
    from engine.errors import EvaluationError
    from engine.operators.evaluate import evaluate_node

    with pytest.raises(EvaluationError, match="never verified; run `poise-git verify unverified`"):
        evaluate_node(exp, "unverified", preset="smoke")
    r = cli("evaluate", "unverified", "--preset", "smoke", "-C", str(exp.path))
    assert r.returncode == 1 and "refuses 'unverified'" in r.stderr and "Traceback" not in r.stderr
    exp.set_status("unverified", "rejected", "test_x failed: non-finite", files={})
    exp.commit_files(
        "unverified",
        {"verification.json": json.dumps({"ok": False, "reason": "test_x failed"})},
        subject="rejected",
    )
    with pytest.raises(EvaluationError, match="verification rejected it"):
        evaluate_node(exp, "unverified", preset="smoke")
    mark_verified(exp, "unverified")
    exp.commit_files(
        "unverified", {"algorithm.py": exp.algorithm("grpo") + "\n# changed\n"}, subject="x"
    )
    with pytest.raises(EvaluationError, match="not the one verified"):
        evaluate_node(exp, "unverified", preset="smoke")
    assert exp.node("unverified").status != "evaluating" and exp.fsck()


@pytest.mark.slow  # the CLI evaluates on the tiny preset
def test_cli_evaluate_tiny(exp, cli):
    import os

    out = cli(
        "evaluate",
        "drgrpo",
        "--preset",
        "tiny",
        "--seeds",
        "1",
        "-C",
        str(exp.path),
        env={"POISE_CACHE_DIR": os.environ["POISE_CACHE_DIR"]},
    )
    assert out.returncode == 0, out.stderr + out.stdout
    assert "drgrpo evaluated" in out.stdout and "overall" in out.stdout
    node = Archive(exp.path).nodes("proxy/tiny")["drgrpo"]
    assert node.status == "evaluated" and node.overall is not None
    bad = cli(
        "evaluate",
        "broken",
        "--preset",
        "tiny",
        "-C",
        str(exp.path),
        env={"POISE_CACHE_DIR": os.environ["POISE_CACHE_DIR"]},
    )
    assert bad.returncode == 4 and "reason" in bad.stdout
    nope = cli("evaluate", "nosuch", "--preset", "tiny", "-C", str(exp.path))
    assert nope.returncode == 1 and "unknown node" in nope.stderr


SPINS = """
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    while True:
        pass
"""


@pytest.mark.slow  # a warm start and one tiny-preset seed stopped at its limit
def test_evaluate_takes_the_evaluations_time_limit_from_the_command_line(exp, cli):
    """The archive's settings come from its root's committed poise.toml, which nothing rewrites:
    ``--eval-timeout`` (as ``run``'s) is how one evaluation gets a lower limit than
    ``[evaluation].timeout_s``; a limit that is not positive is refused before anything runs."""
    exp.spawn("grpo", "spins", edit=SPINS)
    mark_verified(exp, "spins")  # it hangs only when trained: as if it passed verification
    args = ("evaluate", "spins", "--preset", "tiny", "--seeds", "1", "-C", str(exp.path))
    warm = {"POISE_CACHE_DIR": os.environ["POISE_CACHE_DIR"]}
    for bad in ("0", "-3"):
        r = cli(*args, "--eval-timeout", bad, env=warm)
        assert (
            r.returncode == 1
            and f"--eval-timeout must be > 0 and finite, got {float(bad)}" in r.stderr
        )
    assert Archive(exp.path).node("spins").status == "verified"
    r = cli(*args, "--eval-timeout", "2", env=warm)
    assert r.returncode == 4, r.stderr + r.stdout
    assert "exceeded the wall-clock limit (2 s)" in r.stdout, r.stdout
    res = Archive(exp.path).node("spins").results["proxy/tiny"]
    assert res.status == "failed" and "wall-clock limit (2 s)" in res.reason
    suite = cli("evaluate", "spins", "--suite", "math6", "--eval-timeout", "2", "-C", str(exp.path))
    assert suite.returncode == 1 and "--eval-timeout" in suite.stderr


@pytest.mark.slow  # three tiny-preset evaluations through the CLI (the last from the seed cache)
def test_a_re_evaluation_says_which_result_it_replaces(exp, cli, tmp_path, monkeypatch):
    """Evaluating a node again under the same protocol replaces its result (a legitimate re-run):
    one line says which result (its status, protocol and seeds), that the new one has fewer seeds
    when it has, and which seeds the per-seed cache reads back instead of training them again."""
    monkeypatch.delenv("POISE_EVAL_CACHE", raising=False)
    exp.spawn("grpo", "again", edit=DR_GRPO.replace("- stats.mean", "- 0.5 * stats.mean"))
    mark_verified(exp, "again")
    warm = {"POISE_CACHE_DIR": os.environ["POISE_CACHE_DIR"]}
    cached = {**warm, "POISE_EVAL_CACHE": str(tmp_path / "seeds")}

    def evaluate(seeds: int, env: dict) -> list[str]:
        args = ("evaluate", "again", "--preset", "tiny", "--seeds", str(seeds), "-C", str(exp.path))
        r = cli(*args, env=env)
        assert r.returncode == 0, r.stderr + r.stdout
        return [ln.strip() for ln in r.stdout.splitlines() if "replaces" in ln]

    assert evaluate(1, warm) == []  # a first evaluation replaces nothing
    key = Archive(exp.path).node("again").results["proxy/tiny"].protocol.key
    assert evaluate(2, cached) == [f"replaces the evaluated result under {key} (seeds 0)"]
    (line,) = evaluate(1, cached)
    assert line == (
        f"replaces the evaluated result under {key} (seeds 0, 1): the new one has fewer seeds "
        "(seeds 0); seed 0 is read back from the per-seed cache ($POISE_EVAL_CACHE), measured "
        "before under the same code, protocol and harness"
    ), line
    assert Archive(exp.path).node("again").results["proxy/tiny"].seeds == (0,)


def test_the_replaced_line_names_another_protocol_version_and_a_failed_result():
    from engine.archive.results import EvaluationResult, Protocol
    from engine.operators.reevaluation import replaced_line

    old = EvaluationResult(
        Protocol("proxy/tiny", "sha256:" + "a" * 64), "failed", seeds=(0, 1, 2), reason="x"
    )
    assert replaced_line(None, "sha256:b", [0]) is None
    assert replaced_line(old, "sha256:b", [0, 1, 2, 3], cached=[0, 1]) == (
        "replaces the failed result under proxy/tiny@aaaaaaaaaaaa (seeds 0, 1, 2; another version "
        "of proxy/tiny); seeds 0, 1 are read back from the per-seed cache ($POISE_EVAL_CACHE), "
        "measured before under the same code, protocol and harness"
    )


@pytest.mark.slow  # a Ray start / real evaluations: tens of CPU-seconds
def test_tracking_never_leaks_the_store_into_the_environment(tmp_path, monkeypatch):
    """mlflow.set_tracking_uri exports $MLFLOW_TRACKING_URI; two archives in one process stay apart."""
    from engine.archive.store import Archive
    from engine.archive.tracking import find_runs, node_run

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    a, b = Archive.init(tmp_path / "a"), Archive.init(tmp_path / "b")
    with node_run(a, "grpo"):
        pass
    assert "MLFLOW_TRACKING_URI" not in os.environ
    assert len(find_runs(a, "grpo")) == 1 and find_runs(b, "grpo") == []
    assert (tmp_path / "a" / "mlflow.db").is_file()


def test_tracking_set_from_threads_at_once_leaves_the_environment_alone(tmp_path, monkeypatch):
    """Evaluations in threads of one process (the loop's in-process executor) point MLflow at their
    archives at once; none leaves $MLFLOW_TRACKING_URI exported, which would send every later
    archive's runs, in this process and its children, into that store."""
    import threading

    from engine.archive.tracking import set_uri, tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uris = [f"sqlite:///{tmp_path / name / 'mlflow.db'}" for name in "abcd"]
    start = threading.Barrier(len(uris))

    def point(i: int) -> None:
        start.wait()
        for j in range(300):
            set_uri(uris[(i + j) % len(uris)])

    threads = [threading.Thread(target=point, args=(i,)) for i in range(len(uris))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert os.environ.get("MLFLOW_TRACKING_URI") is None
    assert tracking_uri(tmp_path / "e") == f"sqlite:///{(tmp_path / 'e').resolve() / 'mlflow.db'}"


_OPEN_AT = """
import sys, time
from engine.archive.store import Archive
from engine.archive.tracking import node_run
archive, start = Archive(sys.argv[1]), float(sys.argv[2])
import mlflow  # imported before the start line, so the processes open the store together
time.sleep(max(0.0, start - time.time()))
with node_run(archive, "grpo"):
    pass
"""


@pytest.mark.slow  # three processes importing MLflow
def test_processes_opening_a_new_store_at_once_all_record_their_runs(tmp_path, monkeypatch):
    """MLflow builds a new SQLite store's schema on first use; evaluations that start together on a
    fresh archive take turns at it (engine.archive.tracking.open_store) instead of all failing."""
    import sys
    import time

    from engine.archive.tracking import STORE_LOCK, find_runs

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    arch = Archive.init(tmp_path / "exp")
    start = str(time.time() + 8)  # past the three interpreters' imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_AT, str(arch.path), start],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(e[-800:] for e in errors)
    assert len(find_runs(arch, "grpo")) == 3
    assert (arch.path / STORE_LOCK).is_file() and arch.fsck()
    status = subprocess.run(
        ["git", "-C", str(arch.path), "status", "--porcelain"], capture_output=True, text=True
    )
    assert status.returncode == 0 and status.stdout == ""  # the lock never shows in git


def test_the_seed_cache_is_keyed_by_the_harness_as_well_as_the_code(tmp_path, monkeypatch):
    """A cached per-seed result is only reused by the same candidate code under the same protocol
    and the same trainer/scorer sources: an edit of the harness never serves the old one's numbers."""
    from engine.operators.evaluate import SeedCache, harness_digest, source_digest
    from trainer_template import ALGORITHM_FILE

    TEMPLATE_SOURCE = ALGORITHM_FILE.read_text()
    monkeypatch.delenv("POISE_EVAL_CACHE", raising=False)
    assert SeedCache.from_env(TEMPLATE_SOURCE, "sha256:p") is None  # off by default
    monkeypatch.setenv("POISE_EVAL_CACHE", str(tmp_path / "cache"))
    same = SeedCache.from_env(TEMPLATE_SOURCE, "sha256:p", harness="h1")
    assert same.key == SeedCache.from_env(TEMPLATE_SOURCE, "sha256:p", harness="h1").key
    assert same.key != SeedCache.from_env(TEMPLATE_SOURCE, "sha256:p", harness="h2").key
    assert same.key != SeedCache.from_env(TEMPLATE_SOURCE, "sha256:q", harness="h1").key
    # the default harness is the installed trainer's and scorer's sources, stable within a process
    assert (
        SeedCache.from_env(TEMPLATE_SOURCE, "sha256:p").key
        == SeedCache.from_env(TEMPLATE_SOURCE, "sha256:p", harness=harness_digest()).key
    )
    # the digest follows every file's content and name
    pkg = tmp_path / "harness"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    before = source_digest((pkg,))
    (pkg / "sub" / "b.py").write_text("y = 3\n")
    edited = source_digest((pkg,))
    (pkg / "sub" / "b.py").rename(pkg / "sub" / "c.py")
    assert len({before, edited, source_digest((pkg,))}) == 3
    # a skipped folder (the verl harness, which never makes a proxy number) does not enter it
    renamed = source_digest((pkg,))
    (pkg / "verl_backend").mkdir()
    (pkg / "verl_backend" / "d.py").write_text("z = 4\n")
    assert source_digest((pkg,), skip=("verl_backend",)) == renamed != source_digest((pkg,))


def test_a_proxy_result_names_the_harness_sources_it_was_measured_with(exp):
    """The protocol hash covers the settings and the warm start, not the code that turns them into
    numbers: a result records the digest of the trainer's and scorer's sources beside it."""
    from engine.operators.evaluate import _Job, harness_digest

    job = _Job.prepare(exp, "drgrpo", 1, "tiny", None, None)
    assert job.base["details"]["harness_sha256"] == harness_digest()
    assert len(harness_digest()) == 64


def test_a_node_another_process_evaluates_is_refused_at_once_or_waited_for(tmp_path, cli):
    """One process at a time evaluates a node: `poise-git evaluate` of a node another process is
    evaluating fails at once, naming it, and changes nothing; a loop's worker (``wait_for_other``)
    waits, and takes the result the other recorded under its protocol version and seeds instead of
    evaluating again."""
    import threading
    import time

    from results_util import record

    from engine.operators.evaluate import evaluate_node

    arch = Archive.init(tmp_path / "exp")
    tip = arch.node("grpo").commit
    holder = node_lock_holder(arch.path)
    try:
        r = cli("evaluate", "grpo", "--preset", "smoke", "--seeds", "1", "-C", str(arch.path))
        assert r.returncode == 1, r.stdout
        assert f"grpo is being evaluated by another process (pid {holder.pid}, since" in r.stderr
        assert arch.node("grpo").commit == tip
        got: dict = {}

        def work() -> None:
            try:
                got["r"] = evaluate_node(arch, "grpo", seeds=1, preset="smoke", wait_for_other=True)
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                got["error"] = exc

        worker = threading.Thread(target=work)
        worker.start()
        time.sleep(0.5)
        assert worker.is_alive() and not got  # waiting for the holder
        record(arch, "grpo", {"overall": 0.42}, preset="smoke")  # what the holder recorded
        mine = arch.node("grpo").commit
        holder.stdin.write("\n")
        holder.stdin.flush()
        worker.join(timeout=60)
        assert not worker.is_alive()
    finally:
        holder.kill()
        holder.wait()
    assert "error" not in got, got
    assert got["r"].metrics == {"overall": 0.42} and arch.node("grpo").commit == mine
    assert arch.fsck()


def _closed_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there any more: connections are refused
    return port


@pytest.mark.slow  # one seed of the tiny preset
def test_an_unreachable_tracking_server_is_one_clear_line_and_costs_no_result(tmp_path, cli):
    """MLflow retried every call to a dead server with backoff for about four minutes per seed,
    before the result was recorded in git (a worker's wall-clock limit could then kill the
    evaluation and lose it), and the loop said nothing. The evaluation is recorded at once, with
    one line naming the server."""
    import time

    arch = Archive.init(tmp_path / "exp")
    uri = f"http://127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    out = cli(
        "evaluate",
        "grpo",
        "--preset",
        "tiny",
        "--seeds",
        "1",
        "-C",
        str(arch.path),
        env={"MLFLOW_TRACKING_URI": uri, "POISE_CACHE_DIR": str(tmp_path / "cache")},
    )
    wall = time.monotonic() - t0
    assert out.returncode == 0, out.stdout + out.stderr
    assert wall < 90, wall
    assert f"MLflow tracking server {uri} is unreachable" in out.stdout + out.stderr, out.stdout
    node = arch.node("grpo")
    assert node.status == "evaluated" and not node.results["proxy/tiny"].mlflow_run_ids
    assert not (arch.path / "mlflow.db").exists()
    assert arch.fsck()


def test_the_tracking_probe_tells_a_dead_server_from_one_it_cannot_verify(tmp_path):
    """Only a server that does not answer is unreachable: one whose TLS certificate this process
    cannot verify answered (MLflow's own TLS settings may accept it), and a URI's credentials
    never appear in the message."""
    import shutil
    import socket
    import ssl
    import threading

    from engine.archive import tracking

    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a certificate")
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key)]
        + ["-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
        check=True,
        capture_output=True,
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        while True:
            conn, _ = srv.accept()
            try:
                ctx.wrap_socket(conn, server_side=True).close()
            except OSError:
                pass

    threading.Thread(target=serve, daemon=True).start()
    assert tracking.server_problem(f"https://127.0.0.1:{srv.getsockname()[1]}") == ""
    dead = f"http://127.0.0.1:{_closed_port()}"
    assert "ConnectionRefused" in tracking.server_problem(dead)
    assert tracking.shown_uri("https://me:sk-x@h.example:8443/p") == "https://h.example:8443/p"
    assert tracking.server_problem("sqlite:///x/mlflow.db") == ""
    srv.close()


def test_a_shown_tracking_uri_keeps_its_host_and_port_as_written():
    """Only the user and password leave a shown server URI: an IPv6 host keeps its brackets (it
    read ``http://::1:5000``) and a port out of range is shown, not raised from the warning that
    names the server (a ValueError at the start of a run)."""
    from engine.archive.tracking import shown_uri

    assert shown_uri("http://u:p@[::1]:5000/x") == "http://[::1]:5000/x"
    assert shown_uri("https://me:sk-x@h.example:8443/p") == "https://h.example:8443/p"
    assert shown_uri("http://127.0.0.1:99999") == "http://127.0.0.1:99999"
    assert shown_uri("http://a@b@h:1/") == "http://h:1/"


@pytest.mark.slow  # a real MLflow server and two seeds of the tiny preset
def test_a_tracking_server_that_dies_mid_run_costs_seconds_and_no_result(tmp_path, monkeypatch):
    """A server that answered the start-up probe and died before the logging went through MLflow's
    own retries (about four minutes per call, for every seed) before the result reached git. Now
    the engine's calls are bounded, a failed call probes again, and a dead server is said once and
    skipped as one dead from the start is; the evaluation is recorded in git."""
    import sys
    import time

    from engine.archive import tracking
    from engine.operators.evaluate import evaluate_node

    port = _closed_port()
    uri = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
        + ["--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}"],
        env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    names = list(tracking.HTTP_BOUNDS)
    try:
        deadline = time.monotonic() + 120
        while tracking.server_problem(uri) and time.monotonic() < deadline:
            tracking._probed.clear()
            time.sleep(1)
        tracking._probed.clear()
        assert not tracking.server_problem(uri), "the MLflow server did not start"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.setattr(tracking, "PROBE_TTL_S", 3600.0)  # the probe's "alive" holds
        for name in names:
            monkeypatch.delenv(name, raising=False)
        arch = Archive.init(tmp_path / "exp")
        said: list[str] = []

        def on_event(msg: str) -> None:
            said.append(msg)
            if msg.startswith("seed ") and server.poll() is None:  # trained: the server dies
                os.killpg(server.pid, 9)
                server.wait()

        t0 = time.monotonic()
        res = evaluate_node(arch, "grpo", seeds=2, preset="tiny", on_event=on_event)
        wall = time.monotonic() - t0
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 9)
            server.wait()
        for name in names:
            os.environ.pop(name, None)
        tracking._bounded.clear()
    skipped = [m for m in said if "MLflow logging skipped" in m]
    assert len(skipped) == 1 and f"MLflow tracking server {uri} is unreachable" in skipped[0], said
    assert wall < 120, (wall, said)
    node = arch.node("grpo")
    assert res.status == "evaluated" and node.status == "evaluated", said
    assert not node.results["proxy/tiny"].mlflow_run_ids
    assert arch.fsck()


def test_the_engines_mlflow_http_bounds_keep_the_users_and_stay_out_of_verl(monkeypatch):
    """The bounds apply where the user set none, and verl's processes keep MLflow's own retries (a
    long training rides out a server's short outage)."""
    from engine.archive import tracking
    from engine.sandbox.env import without_secrets

    monkeypatch.setattr(tracking, "_bounded", {})
    for name in tracking.HTTP_BOUNDS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "300")  # the user's
    tracking.bound_http_retries()
    try:
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "300"
        verl = without_secrets()
        assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in verl
        assert verl["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "300"
    finally:
        for name in tracking._bounded:
            os.environ.pop(name, None)
