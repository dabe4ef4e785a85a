"""MLflow for an archive: one experiment per archive, its SQLite store (``mlflow.db``) and its
artifacts (``mlruns/``) inside the archive by default; nothing is written to the working directory.

``import mlflow`` costs 2-3 s, so it happens inside these functions only.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

from engine import secrets
from engine.errors import PoiseError

log = logging.getLogger(__name__)
MLFLOW_DB = "mlflow.db"
ARTIFACTS = "mlruns"
STORE_LOCK = ".poise/mlflow.lock"  # beside the archive's other local state, excluded from git
_opened: set[str] = set()  # SQLite stores this process has opened (created or migrated) already
_uri_lock = threading.Lock()  # one set_uri at a time: each saves and puts back the environment
PROBE_TIMEOUT_S = 10.0
"""how long a tracking server has to answer the reachability probe"""
PROBE_TTL_S = 60.0
"""how long a probe's answer holds in this process (each seed's run would probe again)"""
_probed: dict[str, tuple[float, str]] = {}  # server URI -> (monotonic time, "" or why unreachable)
HTTP_BOUNDS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}
"""MLflow's HTTP settings for the engine's own calls to a tracking server, each where the user set
none: a server that dies after the probe costs seconds per call, not MLflow's ~4 minutes (7
retries, backoff factor 2, 120 s per request)"""
_bounded: dict[str, str] = {}  # the HTTP_BOUNDS this process set (not the user's)


class TrackingUnavailable(PoiseError):
    """The MLflow tracking server cannot be reached: nothing is logged there, the result is in git."""


def server_problem(uri: str) -> str:
    """Why the tracking server at ``uri`` cannot be reached ("" when it answers, with any HTTP
    status, and for a URI that is no server). One request bounded by :data:`PROBE_TIMEOUT_S`:
    MLflow's own client retries a dead server with backoff for about four minutes per call."""
    if not uri.startswith(("http://", "https://")):
        return ""
    hit = _probed.get(uri)
    if hit is not None and time.monotonic() - hit[0] < PROBE_TTL_S:
        return hit[1]
    why = ""
    try:
        url = uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1"
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S):
            pass
    except urllib.error.HTTPError:
        pass  # it answered: authentication and the like are MLflow's to report
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if not isinstance(reason, ssl.SSLError):  # TLS answered: its settings are MLflow's
            why = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
    _probed[uri] = (time.monotonic(), why)
    return why


def unreachable(archive_path: str | Path, *, fresh: bool = False) -> str:
    """The one line saying that the archive's tracking server does not answer ("" when it does, or
    when the archive logs into its own store). ``fresh``: probe again, whatever an earlier probe
    said (a server that answered may have died since)."""
    uri = tracking_uri(archive_path)
    if fresh:
        _probed.pop(uri, None)
    why = server_problem(uri)
    if not why:
        return ""
    return (
        f"the MLflow tracking server {shown_uri(uri)} is unreachable ({why}); "
        "nothing is logged there, results are recorded in git"
    )


def bound_http_retries() -> None:
    """Export :data:`HTTP_BOUNDS` for this process's MLflow client, each one the user did not set."""
    with _uri_lock:
        for name, value in HTTP_BOUNDS.items():
            if name not in os.environ:
                os.environ[name] = _bounded[name] = value


def bounded_here() -> dict[str, str]:
    """The MLflow HTTP settings :func:`bound_http_retries` exported (verl keeps MLflow's own)."""
    with _uri_lock:
        return dict(_bounded)


def shown_uri(uri: str) -> str:
    """``uri`` without the user and password a server URI may carry."""
    parts = urllib.parse.urlsplit(uri)  # host and port as written: an IPv6 host keeps its brackets
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def tracking_uri(archive_path: str | Path) -> str:
    """``$MLFLOW_TRACKING_URI`` when set (a server at scale), else ``sqlite:///<archive>/mlflow.db``.
    Read under :func:`set_uri`'s lock: not in the moment another thread has the variable exported."""
    with _uri_lock:
        env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path(archive_path).resolve() / MLFLOW_DB}"


def artifact_root(archive_path: str | Path) -> str:
    """``file://<archive>/mlruns``: where the archive's runs keep their artifacts."""
    return (Path(archive_path).resolve() / ARTIFACTS).as_uri()


def open_store(archive_path: str | Path) -> str:
    """The archive's tracking URI, its SQLite store created (or migrated) by this process under a
    file lock first: MLflow builds a new store's schema on first use, and two processes doing it at
    once (two evaluations starting on a fresh archive) both run the migrations and fail. Opened once
    per process; a tracking server needs no lock, and one that does not answer is
    :class:`TrackingUnavailable` within seconds (MLflow would retry each call for minutes)."""
    problem = unreachable(archive_path)
    if problem:
        raise TrackingUnavailable(problem)
    uri = tracking_uri(archive_path)
    if not uri.startswith("sqlite:"):
        bound_http_retries()
    if uri in _opened or not uri.startswith("sqlite:"):
        return uri
    from mlflow.tracking import MlflowClient  # lazy: mlflow is heavy (only this path needs it)

    lock = Path(archive_path) / STORE_LOCK
    with contextlib.ExitStack() as held:
        try:
            lock.parent.mkdir(exist_ok=True)
            fcntl.flock(held.enter_context(open(lock, "a")), fcntl.LOCK_EX)  # released on close
        except OSError:  # a read-only archive: no process can create its store there either
            pass
        MlflowClient(uri).search_experiments(max_results=1)  # builds the store and its schema
    _opened.add(uri)
    return uri


def open_store_meanwhile(archive_path: str | Path) -> threading.Thread:
    """:func:`open_store` in a thread started now, so that MLflow's import and a new store's schema
    (5-10 s on a small CPU) overlap work that needs no tracking, such as training; ``join()`` it
    before logging. An error there is left to the logging, which opens the store again and reports
    it. Not a daemon: a store being migrated is never cut off by the process exiting."""

    def opening() -> None:
        with contextlib.suppress(Exception):
            open_store(archive_path)

    thread = threading.Thread(target=opening, name="poise-mlflow-open")
    thread.start()
    return thread


def mlflow_client(archive_path: str | Path):
    """An ``MlflowClient`` on the archive's store (a bare ``MlflowClient()`` would open ./mlflow.db)."""
    from mlflow.tracking import MlflowClient  # lazy: mlflow is heavy (only this path needs it)

    return MlflowClient(open_store(archive_path))


def experiment_name(archive) -> str:
    try:
        name = archive.config().experiment.name
    except Exception:
        name = "poise-experiment"
    return f"{name}@{Path(archive.path).name}"


def set_uri(uri: str) -> None:
    """Point MLflow at ``uri`` in this process without touching ``$MLFLOW_TRACKING_URI``.

    ``mlflow.set_tracking_uri`` also exports the variable, which would make the next archive opened in
    the same process (and every child process) log into this archive's store. Evaluations in
    threads of one process call it at once: without the lock one thread could read as "before" the
    value another had just exported, and put it back for good."""
    import mlflow  # lazy: mlflow is heavy (only this path needs it)

    with _uri_lock:
        before = os.environ.get("MLFLOW_TRACKING_URI")
        mlflow.set_tracking_uri(uri)
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before


def _client_setup(archive):
    """Point MLflow at the archive's store and return (mlflow, the archive's experiment id); a new
    experiment keeps its artifacts in the archive (on a tracking server: the server's default)."""
    import mlflow  # lazy: mlflow is heavy (only this path needs it)
    from mlflow.exceptions import MlflowException  # lazy: mlflow is heavy (only this path needs it)

    uri = open_store(archive.path)
    set_uri(uri)
    name = experiment_name(archive)
    c = mlflow.MlflowClient(uri)
    exp = c.get_experiment_by_name(name)
    if exp is None:
        local = not uri.startswith(("http://", "https://", "databricks"))
        try:
            exp_id = c.create_experiment(
                name, artifact_location=artifact_root(archive.path) if local else None
            )
        except MlflowException:  # created concurrently by another evaluation
            exp_id = c.get_experiment_by_name(name).experiment_id
        log.debug("MLflow experiment %r (%s) on %s", name, exp_id, uri)
    else:
        exp_id = exp.experiment_id
    mlflow.set_experiment(experiment_id=exp_id)
    return mlflow, exp_id


@contextlib.contextmanager
def node_run(
    archive, node: str, *, run_name: str | None = None, tags: Mapping[str, str] | None = None
) -> Iterator[object]:
    """Start an MLflow run for ``node`` tagged poise.node / poise.parent / mlflow.source.git.commit."""
    mlflow, exp_id = _client_setup(archive)
    n = archive.node(node)
    all_tags = {
        "poise.node": node,
        "poise.parent": ",".join(n.parents),
        "mlflow.source.git.commit": n.commit,
        "mlflow.source.name": "poise-git",
    }
    if n.trailer("Poise-Round"):
        all_tags["poise.round"] = n.trailer("Poise-Round")
    all_tags.update(tags or {})

    all_tags = {k: secrets.scrub(str(v)) for k, v in all_tags.items()}
    with mlflow.start_run(experiment_id=exp_id, run_name=run_name or node, tags=all_tags) as run:
        yield run


def has_store(archive) -> bool:
    """Whether the archive logs anywhere yet: a tracking server, or its SQLite store exists."""
    uri = tracking_uri(archive.path)  # read as tracking_uri reads it: not mid-set_uri
    return not uri.startswith("sqlite:") or (Path(archive.path) / MLFLOW_DB).exists()


def end_dangling_runs(archive, node: str, tags: Mapping[str, str] | None = None) -> int:
    """Mark KILLED the MLflow runs of ``node`` left RUNNING by an evaluation that died (a killed
    worker never ends the run it was logging into), so none reads as live or is counted twice.
    ``tags``: only runs carrying all of them (those of one loop run's job). Call it only once the
    evaluation that opened them is dead. Returns how many it ended; no store, nothing to end."""
    if not has_store(archive):
        return 0
    client = mlflow_client(archive.path)
    ended = 0
    for run in find_runs(archive, node):
        if run.info.status != "RUNNING":
            continue
        if any(run.data.tags.get(k) != str(v) for k, v in (tags or {}).items()):
            continue
        client.set_terminated(run.info.run_id, "KILLED")
        ended += 1
    return ended


def find_runs(archive, node: str | None = None):
    """The MLflow runs of the archive (of one node when given), as a list of mlflow Run objects."""
    mlflow, exp_id = _client_setup(archive)
    filt = f"tags.`poise.node` = '{node}'" if node else ""
    return mlflow.search_runs(experiment_ids=[exp_id], filter_string=filt, output_format="list")
