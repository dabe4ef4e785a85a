"""The closed loop and its outputs: ``run``, ``report``, ``ui``."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import typer
from rich.markup import escape
from rich.text import Text

from engine import secrets
from engine.archive.confirmation import read_confirmation
from engine.archive.store import ALGORITHM, Archive
from engine.cli import EXIT_FAILED, EXIT_REJECTED, ArchiveOpt, console, plain, shell_arg
from engine.cli.archive_cmds import create_archive
from engine.cli.confirm_cmds import confirmation_line, resolve_hint, run_confirmation
from engine.errors import PoiseError
from engine.loop.waiting import USED, waited_phrase


class _Display:
    """A rich live panel (round, stage, node, elapsed, best so far) and a concise log line per event."""

    def __init__(self, log_path: Path | None):
        from rich.live import Live  # lazy: keeps `poise-git --help` fast

        # lazy: keeps `poise-git --help` fast
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task = self.progress.add_task("candidates", total=None, status="")
        self.live = Live(self.progress, console=console, refresh_per_second=4, transient=False)
        self.state = {"round": "—", "stage": "start", "node": "", "best": "—"}
        self.done = 0
        self.per_parent = 1  # children per parent and round (M)
        self.log_file = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_file = log_path.open("a", encoding="utf-8")

    def __enter__(self):
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.__exit__(*exc)
        if self.log_file:
            self.log_file.close()

    def log(self, msg: str) -> None:
        if console.is_terminal:
            console.log(msg, highlight=False)
        else:  # piped (`| tee run.txt`): one plain line, not a log table as wide as the console
            console.print(f"[dim]{time.strftime('[%H:%M:%S]')}[/] {msg}", highlight=False)
        if self.log_file:
            self.log_file.write(
                time.strftime("%Y-%m-%d %H:%M:%S ")
                + secrets.scrub(Text.from_markup(msg).plain)  # an endpoint may echo the key
                + "\n"
            )
            self.log_file.flush()

    def _status(self) -> str:
        s = self.state
        return f"round {s['round']} · {s['stage']} {s['node']} · best {s['best']}"

    def __call__(self, e: dict) -> None:
        kind = e["kind"]
        if kind == "plan":
            per_parent = int(e.get("children") or e["population"])
            n = (e["last"] - e["first"] + 1) * e["parents"] * per_parent
            self.done = int(e.get("done", 0))
            self.per_parent = per_parent
            self.progress.update(self.task, total=n, completed=self.done)
            self.log(
                f"run {e['run']}{' (resumed)' if e['resume'] else ''}: rounds {e['first']}–{e['last']}, "
                f"{e['parents']} parents × {_per_parent(int(e['population']), per_parent)}, "
                f"{e['seeds']} seed(s), "
                f"{e['workers']} worker(s){' on Ray ' + e['ray'] if e['ray'] else ''}; "
                f"{e['objective']}{_under(e.get('protocol'))}; {e['budget']}"
            )
        elif kind == "round" and self.progress.tasks[0].total:
            missing = (int(e["planned"]) - int(e["parents"])) * self.per_parent
            self.progress.update(
                self.task, total=max(self.done, self.progress.tasks[0].total - missing)
            )
        elif kind == "stage":
            self.state.update(
                round=e.get("round") or self.state["round"],
                stage=e["stage"],
                node=e.get("node", ""),
            )
        elif kind == "node":
            st = e["status"]
            if st in ("evaluated", "failed", "rejected") and e.get("round") is not None:
                self.done += 1
                self.progress.update(self.task, completed=self.done)
            if st == "evaluated":
                u = e.get("utility")
                verdict = (
                    f" — {e['verdict']} vs {e['parent']}"
                    if e.get("verdict") and e.get("parent")
                    else ""
                )
                self.log(
                    f"[green]{e['node']}[/] evaluated: U {u:.4f}{verdict} ({_took(e)})"
                    if u is not None
                    else f"{e['node']} evaluated ({_took(e)})"
                )
            elif st in ("failed", "rejected"):
                why = escape(e.get("reason") or "no reason recorded")  # a reason is not markup
                other = "; ".join(x for x in (_other(e), _ray_phrase(e).strip()) if x)
                self.log(f"[red]{e['node']}[/] {st}{f' ({other})' if other else ''}: {why}")
            elif st == "verified":
                parent = e.get("parent")  # "" for the root; absent: not said
                src = f" (from {parent})" if parent else " (the root)" if parent == "" else ""
                self.log(f"{e['node']} verified{src}")
        elif kind == "best":
            self.state["best"] = (
                f"{e['node']} ({e['utility']:.4f})" if e.get("utility") is not None else e["node"]
            )
        elif kind == "log":
            self.log(escape(e["msg"]))  # the engine's plain text, not markup
        elif kind == "stop":
            self.log(f"[bold]stopped:[/] {escape(e['reason'])}")
        self.progress.update(self.task, status=self._status())


def run(
    archive: Path = ArchiveOpt,
    rounds: int | None = typer.Option(
        None,
        "--rounds",
        "-r",
        min=1,
        help="Rounds to run (default 1; with --resume: the interrupted run's).",
    ),
    parents: int | None = typer.Option(
        None, "--parents", "-k", min=1, help="K parents selected per round (default: \\[select].k)."
    ),
    population: int | None = typer.Option(
        None,
        "--population",
        "-n",
        min=1,
        help="N candidates proposed per parent (default: \\[propose].population).",
    ),
    implement: int | None = typer.Option(
        None,
        "--implement",
        "-m",
        min=0,
        help="M of the N screened proposals implemented per parent: 0 all N, 1 the paper's "
        "highest-ranked one (default: \\[propose].implement, 0).",
    ),
    seeds: int | None = typer.Option(
        None,
        "--seeds",
        "-s",
        min=1,
        help="S paired seeds per evaluation (default: \\[evaluation].seeds).",
    ),
    proposer: str | None = typer.Option(
        None, "--proposer", help="offline (no API key) | llm (an OpenAI-compatible endpoint)."
    ),
    backend: str | None = typer.Option(
        None, "--backend", help="proxy (embedded CPU RL proxy) | verl (GPU scale)."
    ),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help="Proxy protocol preset: default | large (a GPU when torch sees one) | smoke | tiny "
        "(default: \\[proxy].preset).",
    ),
    workers: int | None = typer.Option(
        None, "--workers", "-w", min=1, help="Evaluations at once (default: CPU cores / seeds)."
    ),
    ray: str | None = typer.Option(
        None,
        "--ray",
        help="Evaluate on Ray: 'local' (a private instance), 'auto' or a cluster address.",
    ),
    directive: str | None = typer.Option(
        None, "--directive", help="A natural-language research directive for the proposer."
    ),
    objective: str | None = typer.Option(
        None,
        "--objective",
        help="METRIC | 'METRIC - L*mean_length' | 'pareto(overall, -mean_length)'.",
    ),
    budget: list[str] | None = typer.Option(
        None,
        "--budget",
        help="Stop at the first exhausted: candidates=N, wall=90m, tokens=N, cost=USD, gpu-hours=H (repeatable).",
    ),
    eval_timeout: float | None = typer.Option(
        None,
        "--eval-timeout",
        help="Hard wall-clock limit of one evaluation, seconds (default: \\[evaluation].timeout_s).",
    ),
    seed: int | None = typer.Option(
        None, "--seed", help="Seed of selection and proposal (default: \\[select].seed)."
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the interrupted (or budget-stopped) run: finish pending nodes, then its remaining rounds.",
    ),
    config: Path | None = typer.Option(
        None, "--config", help="poise.toml for a new archive (when --archive does not exist yet)."
    ),
    root: Path | None = typer.Option(
        None,
        "--root",
        help="For a new archive: an algorithm.py of your own as its root (as `init --root`).",
    ),
    root_name: str | None = typer.Option(
        None, "--root-name", help="For a new archive: the root node's name (as `init`)."
    ),
    no_report: bool = typer.Option(
        False, "--no-report", help="Do not write the HTML report at the end."
    ),
    replay: bool = typer.Option(
        False,
        "--replay",
        help="Answer LLM calls from the calls recorded in the archive (no endpoint).",
    ),
    confirm_seeds: int | None = typer.Option(
        None,
        "--confirm-seeds",
        min=0,
        help="At the end, measure the best node and the root again on this many held-out seeds "
        "(seeds the search never used) and record that confirmation; 0: none (`poise-git "
        "confirm` does it later; with --resume: the interrupted run's).",
    ),
) -> None:
    """Run the closed loop: select -> propose -> implement -> verify -> evaluate -> reflect, round after round.

    Creates the archive first when --archive does not exist (or is empty). Stops cleanly at the first
    exhausted budget; `--resume` continues after a stop or a crash, from git alone. Exit code 3 (4)
    when the root's verification rejects it (its evaluation fails): the run stops before round 1."""
    from engine.loop.budget import Budget  # lazy: keeps `poise-git --help` fast
    from engine.loop.core import Loop, RunOptions  # lazy: numpy is heavy (only this path needs it)
    from engine.loop.state import run_lock  # lazy: keeps `poise-git --help` fast

    opts = RunOptions(
        plan={
            "rounds": rounds,
            "parents": parents,
            "population": population,
            "implement": implement,
            "seeds": seeds,
            "proposer": proposer,
            "backend": backend,
            "preset": preset,
            "eval_timeout_s": eval_timeout,
            "seed": seed,
            "confirm_seeds": confirm_seeds,
        },
        workers=workers,
        ray=ray,
        directive=directive,
        objective=objective,
        budget=Budget.parse(budget),
        resume=resume,
        replay=replay,
    )
    if objective:
        # lazy: numpy is heavy (only this path needs it)
        from engine.select.objective import parse_objective

        parse_objective(objective)  # a bad objective fails before anything is created
    if proposer is not None and proposer not in ("offline", "llm"):
        raise typer.BadParameter(
            f"must be offline or llm, got {proposer!r}", param_hint="--proposer"
        )
    if backend is not None and backend not in ("proxy", "verl"):
        raise typer.BadParameter(f"must be proxy or verl, got {backend!r}", param_hint="--backend")
    path = Path(archive)
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        if resume:
            raise PoiseError(f"nothing to resume: {path} does not exist")
        arch = create_archive(path, config, root, root_name)
    else:
        arch = Archive(path)
        if root is not None or root_name is not None:
            raise PoiseError(
                f"--root and --root-name make a new archive, and {path} exists (its root is "
                f"{arch.root()!r}); `poise-git init NEW --root FILE` starts another"
            )
    # held to the end: the report and the held-out confirmation belong to the run, and a second
    # run (a `--resume` started meanwhile) would measure and record the confirmation again
    with run_lock(arch):
        with _Display(arch.path / ".poise" / "run.log") as display:
            summary = Loop(arch, opts, on_event=display).run(locked=True)
        _print_summary(arch, summary, report=not no_report, confirm_seeds=summary.confirm_seeds)
    if summary.root_blocked:  # no round could start: the run did not do what was asked
        raise typer.Exit(EXIT_REJECTED if summary.root_blocked == "rejected" else EXIT_FAILED)


def _other(e: dict) -> str:
    """What a node event says of another process that was evaluating the node ("" when none)."""
    return escape(waited_phrase(e.get("other") or "", float(e.get("waited_s") or 0.0)))


def _took(e: dict) -> str:
    """The time an evaluation took, as its log line says it: the run's own (its wait for another
    process apart), or whose result it was."""
    own = float(e.get("wall_s") or 0) - float(e.get("waited_s") or 0)
    other, wall = _other(e), f"{max(own, 0.0):.0f} s" + _ray_phrase(e)
    if other and e.get("other") == USED:
        return other
    return f"{wall}; {other}" if other else wall


def _ray_phrase(e: dict) -> str:
    """`` on ray-node 1a2b3c4d on HOST; re-queued after ray-node 5e6f7a8b died``: where a Ray task
    evaluated the node, and the nodes that died under its earlier tries ("" off Ray)."""
    where = f" on {escape(e['where'])}" if e.get("where") else ""
    lost = e.get("lost") or []
    if lost:
        where += f"; re-queued after {escape(', '.join(lost))} died"
    return where


def _under(protocol: str | None) -> str:
    """`` under proxy/tiny@9d52111c6877``: what measured the run's numbers ("" when unknown)."""
    return f" under {escape(protocol)}" if protocol else ""


def _per_parent(n: int, m: int) -> str:
    """What each parent gets: "N candidates", or "M of N screened proposals" (M implemented)."""
    return f"{n} candidates" if m == n else f"{m} of {n} screened proposals"


def _print_summary(arch, s, report: bool, confirm_seeds: int = 0) -> None:

    c = s.counts
    console.print(
        f"\n[bold]run {s.run_id}[/] rounds {s.rounds[0]}–{s.rounds[1]}: {escape(s.stop_reason)}"
    )
    console.print(
        f"candidates: {c['evaluated']} evaluated, {c['failed']} failed, {c['rejected']} rejected"
        + (
            f", {c['verified'] + c['spawned'] + c['evaluating']} pending (`--resume`)"
            if c["verified"] + c["spawned"] + c["evaluating"]
            else ""
        )
        + f"; wall {s.usage['wall_s']:.0f} s; {s.objective}{_under(s.protocol)}"
    )
    root = arch.root()
    if s.best:
        root_txt = ""
        if s.root_utility is not None and s.best != root:
            # lazy: numpy is heavy (only this path needs it)
            from engine.report.html import report_experiment

            # lazy: numpy is heavy (only this path needs it)
            from engine.select.objective import promotion

            nodes = arch.nodes(s.protocol)
            verdict = promotion(nodes[s.best], nodes[root], report_experiment(arch))
            root_txt = f" (root {s.root_utility:.4f}; {verdict} vs the root)"
        console.print(f"[bold green]best node: {s.best}[/]  U {s.best_utility:.4f}{root_txt}")
    shown = s.best if s.best != root else s.best_candidate
    if shown:
        if shown != s.best:
            console.print(
                f"no candidate beat the root; the best candidate is [bold]{shown}[/] (U {s.best_candidate_utility:.4f})"
            )
        from engine.cli.render import section  # lazy: keeps `poise-git --help` fast

        diff = arch.diff(root, shown, [ALGORITHM])
        section(f"mechanism diff: {root} -> {shown}", diff or "(no change)", "diff")
    if report:
        # lazy: numpy is heavy (only this path needs it)
        from engine.report.html import render_report

        page = render_report(arch)
        console.print(f"report: [bold]{plain(page)}[/]")
    console.print(f"MLflow: `poise-git ui -C {shell_arg(arch.path)}`")
    if shown:
        console.print(discovery_verdict(arch, s.protocol, shown, root))
    if shown and confirm_seeds:
        protocol_id = s.protocol.split("@")[0]
        if not protocol_id.startswith("proxy/"):
            console.print(
                f"no held-out confirmation: it runs on the CPU proxy, and this run ranked under "
                f"{s.protocol}"
            )
            return
        conf = _done_confirmation(arch, shown, root, confirm_seeds, s.protocol)
        if conf is None:
            conf = run_confirmation(
                arch, shown, root, confirm_seeds, None, protocol_id.split("/", 1)[1], None
            )
        console.print(confirmation_line(conf), highlight=False)
        if report:  # the report, written before, gains the confirmation
            # lazy: numpy is heavy (only this path needs it)
            from engine.report.html import render_report

            render_report(arch)


def discovery_verdict(arch, protocol: str, best: str, root: str) -> str:
    """One line: does ``best`` beat ``root`` beyond the 95% interval of their paired difference?"""
    # lazy: numpy is heavy (only this path needs it)
    from engine.report.html import report_experiment

    # lazy: numpy is heavy (only this path needs it)
    from engine.select.objective import paired_difference

    nodes = arch.nodes(protocol)
    d = paired_difference(nodes.get(best), nodes.get(root), report_experiment(arch))
    if d is None:
        return f"{best} and {root} share no evaluated seed: no paired comparison"
    mean, iv, n = d
    if iv is None:
        return (
            f"{best} vs {root}: {mean:+.4f} at {n} seed — no interval; "
            "evaluate with --seeds 2 or more to tell a discovery from noise"
        )
    beats = iv[0] > 0
    line = (
        f"[bold]{'DISCOVERY' if beats else 'no discovery'}:[/] {best} "
        f"{'beats' if beats else 'does not beat'} {root} beyond the 95% interval of their paired "
        f"difference ({mean:+.4f} [{iv[0]:+.4f}, {iv[1]:+.4f}] over {n} paired seeds)"
    )
    if not beats and mean > 0:
        line += "; " + resolve_hint(mean, iv, n)
    return line


def report(
    archive: Path = ArchiveOpt,
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output directory (default: ARCHIVE/.poise/report)."
    ),
    objective: str | None = typer.Option(
        None,
        "--objective",
        help="Override the objective (default: the last run's, else poise.toml's).",
    ),
    top: int = typer.Option(3, "--top", help="Best nodes shown in the training-dynamics figure."),
) -> None:
    """Write an HTML report: lineage, frontier vs depth, training dynamics, accuracy vs length, node table."""
    # lazy: numpy is heavy (only this path needs it)
    from engine.report.html import render_report, report_experiment

    # lazy: numpy is heavy (only this path needs it)
    from engine.select.objective import with_objective

    arch = Archive(archive)
    exp = with_objective(report_experiment(arch), objective) if objective else None
    page = render_report(arch, out, exp, top=top)
    console.print(f"report: [bold]{plain(page)}[/]")


def ui(
    archive: Path = ArchiveOpt,
    port: int = typer.Option(5000, "--port", help="Port on 127.0.0.1."),
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Address to bind (keep 127.0.0.1 unless the network is trusted).",
    ),
) -> None:
    """Start the MLflow UI on the archive's store (one worker, job execution off); Ctrl-C stops the
    server and every process it started. With MLFLOW_TRACKING_URI pointing at a server, print that
    server instead."""
    # lazy: keeps `poise-git --help` fast
    from engine.archive.tracking import artifact_root, shown_uri, tracking_uri

    arch = Archive(archive)
    uri = tracking_uri(arch.path)
    if uri.startswith(("http://", "https://")):
        console.print(f"the archive's runs are on the MLflow server {plain(shown_uri(uri))}")
        return
    exe = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or shutil.which("mlflow")
    cmd = [exe, "server"] if exe else [sys.executable, "-m", "mlflow", "server"]
    cmd += [
        "--backend-store-uri",
        uri,
        "--default-artifact-root",
        artifact_root(arch.path),
        "--artifacts-destination",
        artifact_root(arch.path),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    _check_port(host, port)
    console.print(
        f"MLflow UI for {plain(arch.path)}: http://{plain(host)}:{port}  (Ctrl-C stops it)"
    )
    # its own session: the server and its workers are stopped here, as one tree, however we exit
    # (Ctrl-C, `kill`, a closed terminal), not left to the terminal's signal
    proc = subprocess.Popen(cmd, env=env, cwd=arch.path, start_new_session=True)
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        code = 0
    finally:
        stop_tree(proc.pid)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    raise typer.Exit(code)


def _check_port(host: str, port: int) -> None:
    """Refuse a port another server holds before starting MLflow, which would log the failed bind
    and exit 0 after the URL (of that other server) was printed. Bound as servers bind
    (SO_REUSEADDR), so a port left in TIME_WAIT by a stopped UI still counts as free."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise PoiseError(f"--host {host}: {getattr(exc, 'strerror', None) or exc}") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as exc:
            raise PoiseError(
                f"cannot serve on {host}:{port}: {exc.strerror or exc} (another server? choose "
                "another port with --port)"
            ) from None


def _interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def stop_tree(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM ``pid`` and every descendant, SIGKILL what is left after ``grace_s``; reap ``pid``."""
    import psutil  # lazy: psutil is heavy (only this path needs it)

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def register(app: typer.Typer) -> None:
    for fn in (run, report, ui):
        app.command()(fn)


def _done_confirmation(arch, node: str, against: str, seeds: int, protocol: str):
    """The confirmation of ``node`` against ``against`` on ``seeds`` held-out seeds under
    ``protocol`` (``id@hash12``) already recorded, by this run before it was killed or by an
    earlier ``--resume`` of it: read back rather than measured again (None: none such)."""
    protocol_id = protocol.split("@")[0]
    try:
        conf = read_confirmation(arch, node, protocol_id)
    except PoiseError:
        return None
    if conf is None or conf.against != against or len(conf.seeds) != seeds:
        return None
    return conf if conf.protocol.key == protocol else None
