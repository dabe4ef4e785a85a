"""The closed loop: per round, select K parents -> propose N per parent (screened) -> implement + verify
(bounded correction) -> evaluate (S paired seeds, in parallel) -> reflect; the archive (git) records it.

State lives in git only (``engine.loop.state``): a crash at any point is finished by ``run --resume``.
The loop reports progress through ``on_event(dict)`` and never imports the CLI.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine import secrets
from engine.archive.results import configured_protocol
from engine.archive.store import Archive
from engine.archive.tracking import end_dangling_runs, unreachable
from engine.errors import EvaluationError, PoiseError
from engine.loop.budget import Budget, RunUsage, exhausted, result_device_hours
from engine.loop.executor import SETUP_FAILED, STOPPED, EvalJob, EvalOutcome, make_executor
from engine.loop.plan import resolve_plan
from engine.loop.state import (
    RunRecord,
    last_round,
    load_run,
    new_run_id,
    node_round,
    pending_work,
    run_lock,
    run_nodes,
    save_run,
)
from engine.loop.waiting import waited_phrase
from engine.operators.implement import implement
from engine.operators.llm import LLMEndpointError, make_client
from engine.operators.propose import propose
from engine.operators.reflect import reflect_node
from engine.operators.verify import verify_node
from engine.scratch import remove_abandoned
from engine.select import objective as obj
from engine.select import select_parents

Event = Callable[[dict], None]
log = logging.getLogger(__name__)
PROPOSE_ATTEMPTS = 3
"""proposal calls per parent and round while screening leaves fewer than N candidates"""


@dataclass
class RunOptions:
    """What one ``poise-git run`` invocation asks for. ``plan``: the command line's settings of the
    :class:`RunPlan` (field -> value; None or absent = from the resumed run, else poise.toml); the
    other fields belong to this invocation and are not recorded with the plan."""

    plan: Mapping[str, Any] = field(default_factory=dict)
    workers: int | None = None
    ray: str | None = None
    directive: str | None = None
    objective: str | None = None
    budget: Budget = field(default_factory=Budget)
    resume: bool = False
    replay: bool = False
    """answer LLM calls from the archive's recorded calls (no endpoint)"""


@dataclass
class RunSummary:
    run_id: str
    rounds: tuple[int, int]
    stop_reason: str
    best: str | None
    best_utility: float | None
    best_candidate: str | None
    """the best node the run made (it may trail the root)"""
    best_candidate_utility: float | None
    root_utility: float | None
    counts: dict[str, int]
    usage: dict[str, Any]
    objective: str
    protocol: str = ""
    """the protocol key the run ranked its nodes under"""
    root_blocked: str = ""
    """``rejected`` or ``failed`` when the root's status kept every round from starting"""
    confirm_seeds: int = 0
    """the plan's held-out seeds for the confirmation after the rounds (0: none)"""


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", (text or "candidate").lower()).strip("-")
    return (s or "candidate")[:40].strip("-")


class Loop:
    """One ``poise-git run``. ``executor``: where evaluations run (default: worker processes, or Ray
    with ``opts.ray``; ``engine.loop.inline.InlineExecutor`` evaluates in this process)."""

    def __init__(
        self,
        archive: Archive,
        opts: RunOptions,
        on_event: Event | None = None,
        *,
        executor=None,
    ):
        self.archive = archive
        self.opts = opts
        self._on_event = on_event or (lambda e: None)
        self.t0 = time.monotonic()
        self.futures: dict[cf.Future, tuple[str, int]] = {}
        self.stop_reason: str | None = None
        self.root_blocked = ""  # the root's status when it keeps every round from starting
        self.executor = executor
        self._killed = False  # in-flight evaluations were stopped (wall-time budget): no new ones

    def emit(self, event: dict) -> None:
        """Hand ``event`` to the caller's callback; the same event goes to this module's logger
        (messages and outcomes at INFO, the rest at DEBUG)."""
        _log_event(event)
        self._on_event(event)

    # -- plan ----------------------------------------------------------------------------------
    def _plan(self) -> RunRecord:
        o = self.opts
        rec = load_run(self.archive)
        base = self.archive.config()
        if o.resume:
            if rec is None:
                raise PoiseError(
                    "nothing to resume: no `poise-git run` has started in this archive"
                )
            plan = resolve_plan(base, o.plan, recorded=rec.data.get("plan") or {})
            exp = dataclasses.replace(base.experiment, **rec.data.get("experiment", {}))
            budget = Budget.from_dict(rec.data.get("budget")).merged(o.budget)
        else:
            plan = resolve_plan(base, o.plan, start_round=last_round(self.archive.nodes()) + 1)
            exp, budget = base.experiment, o.budget
            rec = RunRecord(
                {
                    "id": new_run_id(),
                    "selections": {},
                    "done": {},
                    "usage": {},
                    "started": time.time(),
                },
                rec.commit if rec else None,
            )
        exp = obj.with_objective(exp, o.objective, o.directive)
        self.cfg = dataclasses.replace(plan.apply(base), experiment=exp)
        rec.data.update(
            plan=plan.to_dict(),
            experiment=dataclasses.asdict(exp),
            budget=budget.to_dict(),
            status="running",
            stop_reason=None,
        )
        self.plan, self.budget, self.rec = plan, budget, rec
        self.prior_wall = float(rec.data.get("usage", {}).get("wall_s", 0.0))
        self.prior_llm = (
            int(rec.data.get("usage", {}).get("tokens", 0)),
            float(rec.data.get("usage", {}).get("cost_usd", 0.0)),
        )
        self.llm = None
        if plan.proposer == "llm" or o.replay:
            self.llm = make_client(self.cfg, self.archive, replay=o.replay)
            self.llm.check()  # no key: say so before the run starts, not after the root's evaluation
        return save_run(
            self.archive, rec, f"poise: run {rec.id} {'resumed' if o.resume else 'started'}"
        )

    def _nodes(self) -> dict:
        """The archive's nodes with each ``result`` read under this run's protocol (its preset)."""
        return self.archive.nodes(configured_protocol(self.cfg))

    # -- budgets -------------------------------------------------------------------------------
    def usage(self, nodes=None) -> RunUsage:
        nodes = nodes if nodes is not None else self._nodes()
        mine = run_nodes(nodes, self.rec.id)
        tok, cost = _llm_usage(self.llm)
        u = RunUsage(
            candidates=len(mine),
            wall_s=self.prior_wall + time.monotonic() - self.t0,
            tokens=self.prior_llm[0] + tok,
            cost_usd=self.prior_llm[1] + cost,
        )
        gpus = self.plan.gpus_per_eval
        for n in mine.values():
            for r in n.results.values():
                u.device_hours += result_device_hours(r, gpus)
        return u

    def _check_budget(self, paid: bool = False) -> bool:
        """Whether there is room for more. ``paid``: for a candidate of a proposal call already
        made, whose tokens and cost are spent; only the other limits can stop it (a proposal
        dropped here would be asked for, and paid, again on `--resume`)."""
        if self.stop_reason is None:
            budget = (
                dataclasses.replace(self.budget, tokens=None, cost_usd=None)
                if paid
                else self.budget
            )
            self.stop_reason = exhausted(budget, self.usage())
        return self.stop_reason is None

    def _save(self, subject: str) -> None:
        self.rec.data["usage"] = self.usage().to_dict()
        save_run(self.archive, self.rec, subject)

    # -- the run -------------------------------------------------------------------------------
    def run(self, *, locked: bool = False) -> RunSummary:
        """The run, under the archive's run lock: a second run in the same archive is refused
        (:class:`RunStateError`) before it reads or writes anything. ``locked``: the caller holds
        the lock already (``poise-git run`` holds it through the confirmation after the rounds)."""
        if locked:
            return self._run()
        with run_lock(self.archive):
            return self._run()

    def _run(self) -> RunSummary:
        self._plan()
        p = self.plan
        first, last = p.start_round, p.last_round
        workers = self.opts.workers or max(1, (os.cpu_count() or 1) // p.seeds)
        self.emit(
            {
                "kind": "plan",
                "run": self.rec.id,
                "first": first,
                "last": last,
                "parents": p.parents,
                "population": p.population,
                "children": p.children,
                "seeds": p.seeds,
                "budget": self.budget.describe(),
                "objective": obj.describe_objective(self.cfg.experiment),
                "protocol": configured_protocol(self.cfg).key,
                "workers": workers,
                "ray": self.opts.ray or "",
                "resume": self.opts.resume,
                "done": sum(
                    1
                    for n in run_nodes(self._nodes(), self.rec.id).values()
                    if n.status in ("evaluated", "failed", "rejected")
                ),
            }
        )
        problem = unreachable(self.archive.path)
        if problem:  # the workers' own lines never reach this log: said once, here
            self.emit({"kind": "log", "msg": f"warning: {problem}"})
        if self.executor is None:
            self.executor = make_executor(
                workers,
                self.opts.ray,
                p.gpus_per_eval if p.backend == "verl" else 0.0,
                p.seeds,
            )
        try:
            self._finish_pending(resuming=True)
            self.stop_reason = self._unusable_root()
            # the round in progress: from the children's Poise-Round trailers and the recorded selection
            r = max(
                first,
                int(self.rec.data.get("round") or first),
                last_round(run_nodes(self._nodes(), self.rec.id)),
            )
            while r <= last and self.stop_reason is None and self._check_budget():
                self._round(r)
                if self.stop_reason:
                    break
                self.rec.data["completed_round"] = r
                r += 1
                self._save(f"poise: run {self.rec.id} round {r - 1} done")
                self.archive.maintain()  # plumbing never auto-gcs: pack refs and objects between rounds
            if self.stop_reason is None:
                self.stop_reason = f"finished {last - first + 1} round(s)"
                self.rec.data["status"] = "finished"
            else:
                self.rec.data["status"] = "stopped"
        except BaseException as exc:
            why = type(exc).__name__
            if isinstance(exc, PoiseError):  # what went wrong, for the run record (never a key)
                why = f"{why}: {secrets.scrub(str(exc))}"
            self.stop_reason = f"interrupted ({why}); `poise-git run --resume` continues"
            self.rec.data["status"] = "stopped"
            self.executor.shutdown(kill=True)
            self.rec.data["stop_reason"] = self.stop_reason
            self._save(f"poise: run {self.rec.id} stopped")
            raise
        self.executor.shutdown(kill=False)
        self.rec.data["stop_reason"] = self.stop_reason
        self._save(f"poise: run {self.rec.id} {self.rec.data['status']}")
        left = remove_abandoned()  # what killed processes (a kill -9 before a --resume) left
        if left:
            self.emit(
                {
                    "kind": "log",
                    "msg": f"removed {len(left)} temporary director(ies) that killed processes left",
                }
            )
        self.emit({"kind": "stop", "reason": self.stop_reason})
        return self._summary(first, last)

    def _unusable_root(self) -> str | None:
        """Why no round can start: the root was rejected by verification or failed its evaluation,
        and every candidate descends from it (None: it can; also with ``[select].allow_failed``)."""
        if self.cfg.select.allow_failed:
            return None
        root = self.archive.root()
        node = self.archive.node(root)
        if node.status not in ("rejected", "failed"):
            return None
        self.root_blocked = node.status
        what = "was rejected by verification" if node.status == "rejected" else "failed"
        reason = node.trailer("Poise-Reason") or "no reason recorded"
        return (
            f"the root node {root!r} {what} ({reason}), so no round can start: fix its algorithm.py and "
            f"start a new archive from it (`poise-git init DIR --root FIXED.py`)"
        )

    def _round(self, r: int) -> None:
        sel = self.rec.data["selections"].get(str(r))
        if sel is None:
            self.emit({"kind": "stage", "round": r, "stage": "select", "node": ""})

            s = select_parents(self.archive, self.cfg, k=self.plan.parents, seed=self.plan.seed + r)
            if not s.chosen:
                self.stop_reason = "no node can be a parent (nothing evaluated successfully)"
                return
            scores = {row["node"]: row.get("score") for row in s.rows}
            sel = [
                {"node": c, "rank": i + 1, "score": scores.get(c)} for i, c in enumerate(s.chosen)
            ]
            self.rec.data["selections"][str(r)] = sel
            self.rec.data["round"] = r
            self._save(f"poise: run {self.rec.id} round {r} selected {', '.join(s.chosen)}")
            self.emit(
                {
                    "kind": "round",
                    "round": r,
                    "parents": len(sel),
                    "planned": self.plan.parents,
                }
            )
            self.emit(
                {
                    "kind": "log",
                    "msg": f"round {r}: parents "
                    + ", ".join(f"{e['node']} (s={_f(e['score'])})" for e in sel),
                }
            )
        done = self.rec.data["done"].setdefault(str(r), [])
        for entry in sel:
            if entry["node"] in done:
                continue
            self._expand(r, entry)
            if self.stop_reason:
                break
            done.append(entry["node"])
            self._save(f"poise: run {self.rec.id} round {r} parent {entry['node']} expanded")
        self._drain(block=True)
        if not self.stop_reason:
            self._finish_pending(resuming=False)

    def _expand(self, r: int, entry: dict) -> None:
        """Bring ``entry``'s parent to M children this round (:attr:`RunPlan.children`): N proposals
        are screened and the best M implemented (with M = N, the N still missing are asked for).
        Screening may return fewer proposals than asked, so the proposer is asked again (new seed)
        up to PROPOSE_ATTEMPTS times."""
        parent = entry["node"]
        for attempt in range(PROPOSE_ATTEMPTS):
            nodes = self._nodes()
            have = [
                n
                for n in run_nodes(nodes, self.rec.id).values()
                if node_round(n) == r and parent in n.parents
            ]
            need = self.plan.children - len(have)
            if need <= 0 or not self._check_budget():
                return
            self.emit({"kind": "stage", "round": r, "stage": "propose", "node": parent})
            seed = self.plan.seed * 100_000 + r * 1000 + len(have) * 10 + attempt
            ask = self.plan.population if self.plan.implement else need
            self._implement_all(r, entry, self._propose(parent, ask, seed)[:need])
            if self.stop_reason:
                return

    def _propose(self, parent: str, n: int, seed: int) -> list:
        try:
            return propose(
                self.archive,
                parent,
                self.cfg,
                n=n,
                proposer=self.plan.proposer,
                seed=seed,
                **self._llm_kw(),
            )
        except LLMEndpointError:
            raise  # no later call would fare better: stop, resumable, rather than run empty rounds
        except PoiseError as exc:  # e.g. one reply that stayed malformed: this parent's proposals
            self.emit({"kind": "log", "msg": f"{parent}: proposal failed: {exc}"})
            return []

    def _implement_all(self, r: int, entry: dict, proposals: list) -> None:
        parent = entry["node"]
        for prop in proposals:
            if not self._check_budget(paid=True):
                return
            name = self._name(prop.name)
            self.emit(
                {"kind": "stage", "round": r, "stage": "implement", "node": name, "parent": parent}
            )
            trailers = {
                "Poise-Round": str(r),
                "Poise-Selection-Rank": str(entry["rank"]),
                "Poise-Selection-Score": _f(entry["score"]),
                "Poise-Proposer": str(prop.proposer or self.plan.proposer),
                "Poise-Run": self.rec.id,
            }
            try:
                node = implement(
                    self.archive,
                    parent,
                    prop,
                    self.cfg,
                    name=name,
                    trailers=trailers,
                    **self._llm_kw(),
                )
            except PoiseError as exc:
                self.emit({"kind": "log", "msg": f"{name}: not implemented: {exc}"})
                continue
            self.emit(
                {
                    "kind": "node",
                    "node": node.name,
                    "status": node.status,
                    "round": r,
                    "parent": parent,
                    "reason": node.trailer("Poise-Reason") or "",
                }
            )
            if node.status == "verified":
                self._submit(node.name, r)
            self._drain(block=False)

    def _llm_kw(self) -> dict:
        return {"llm": self.llm} if self.llm is not None else {}

    def _name(self, proposal_name: str) -> str:
        base, i = _slug(proposal_name), 1
        name = base
        while self.archive.exists(name):
            i += 1
            name = f"{base}-{i}"
        return name

    # -- evaluation, reflection, recovery ------------------------------------------------------
    def _submit(self, name: str, r: int | None) -> None:
        if self._killed:
            return  # left verified / evaluating: `--resume` evaluates it
        p = self.plan
        job = EvalJob(
            str(self.archive.path),
            name,
            p.backend,
            p.seeds,
            p.preset,
            p.eval_timeout_s,
            # the root, evaluated before the first round, has no round
            tags={"poise.run": self.rec.id, **({"poise.round": str(r)} if r is not None else {})},
            devices=p.gpus_per_eval if p.backend == "verl" else float(p.seeds),
        )
        self.emit({"kind": "stage", "round": r, "stage": "evaluate", "node": name})
        self.futures[self.executor.submit(job)] = (name, r)

    def _drain(self, block: bool) -> None:
        """Collect finished evaluations (all of them when ``block``), reflect on each."""
        while self.futures:
            done, _ = cf.wait(
                list(self.futures), timeout=1.0 if block else 0, return_when=cf.FIRST_COMPLETED
            )
            for fut in done:
                name, r = self.futures.pop(fut)
                # not the candidate's doing, and every evaluation after it would fail alike: the
                # executor itself failed, or the evaluation's trusted set-up did; stop the run
                try:
                    out: EvalOutcome = fut.result()
                    why = out.reason if out.status == SETUP_FAILED else ""
                except Exception as exc:
                    if not self.archive.exists(name):  # `poise-git drop` took it meanwhile
                        self.emit(
                            {
                                "kind": "log",
                                "msg": f"{name} was dropped while the run evaluated it; "
                                "nothing recorded (`poise-git restore` brings it back)",
                            }
                        )
                        continue
                    why = f"{name}: the evaluation could not run ({type(exc).__name__}: {exc})"
                if why:
                    raise EvaluationError(
                        f"{why}; nothing was recorded on {name}, which `poise-git run --resume` "
                        "evaluates once that is fixed"
                    )
                if out.status != STOPPED:
                    self._after_eval(out, r)
            if not block:
                return
            self.emit({"kind": "tick", "elapsed": time.monotonic() - self.t0})
            if self.budget.wall_s is not None and self.usage().wall_s >= self.budget.wall_s:
                self.stop_reason = exhausted(self.budget, self.usage())
                left = [n for n, _ in self.futures.values()]
                self._killed = True
                self.executor.shutdown(kill=True)
                self.futures.clear()
                self.emit(
                    {
                        "kind": "log",
                        "msg": f"stopped {len(left)} evaluation(s) in flight ({', '.join(left)}); "
                        "`--resume` finishes them",
                    }
                )
                return

    def _after_eval(self, out: EvalOutcome, r: int | None) -> None:
        nodes = self._nodes()  # the run's protocol (its preset)
        node = nodes.get(out.node)
        parent = nodes.get(node.parent) if node is not None and node.parent else None
        verdict = obj.promotion(node, parent, self.cfg.experiment) if parent is not None else ""
        u = obj.node_utility(node, self.cfg.experiment)
        self.emit(
            {
                "kind": "node",
                "node": out.node,
                "status": out.status,
                "round": r,
                "utility": u,
                "verdict": verdict,
                "parent": parent.name if parent is not None else "",
                "reason": out.reason,
                "wall_s": out.wall_s,
                # another process was evaluating the node: whose result this is (waiting.py)
                "other": out.other,
                "waited_s": out.waited_s,
                # on Ray: the node that evaluated it, and those that died under its evaluation
                "where": out.where,
                "lost": list(out.lost),
            }
        )
        if out.status == "evaluated" and node is not None and node.parents:
            self._reflect(out.node, r)
        best = obj.best_node(nodes, self.cfg.experiment)
        if best:
            self.emit(
                {
                    "kind": "best",
                    "node": best,
                    "utility": obj.node_utility(nodes[best], self.cfg.experiment),
                }
            )

    def _reflect(self, name: str, r: int | None) -> None:
        self.emit({"kind": "stage", "round": r, "stage": "reflect", "node": name})
        try:
            reflect_node(self.archive, name, self.cfg, llm=self.llm)
        except PoiseError as exc:
            self.emit({"kind": "log", "msg": f"{name}: reflection failed: {exc}"})

    def _finish_pending(self, resuming: bool) -> None:
        nodes = self._nodes()
        todo = pending_work(self.archive, nodes)
        if not todo:
            return
        if resuming:
            self.emit(
                {
                    "kind": "log",
                    "msg": f"finishing {todo.count()} pending node(s): verify {todo.verify}, "
                    f"evaluate {todo.evaluate}, reflect {todo.reflect}",
                }
            )
        for name in todo.verify:
            self.emit(
                {"kind": "stage", "round": node_round(nodes[name]), "stage": "verify", "node": name}
            )
            res = verify_node(self.archive, name, self.cfg)
            status = self.archive.node(name).status
            self.emit(
                {
                    "kind": "node",
                    "node": name,
                    "status": status,
                    "round": node_round(nodes[name]),
                    "parent": nodes[name].parent or "",
                    "reason": "" if res.ok else res.reason,
                }
            )
            if status == "verified":
                todo.evaluate.append(name)
        if todo.evaluate and resuming:
            _close_dangling_runs(self.archive, todo.evaluate)
        for name in todo.evaluate:
            self._submit(name, node_round(nodes[name]) if name in nodes else None)
        self._drain(block=True)
        for name in todo.reflect:
            self._reflect(name, node_round(nodes[name]))

    def _summary(self, first: int, last: int) -> RunSummary:
        nodes = self._nodes()
        exp = self.cfg.experiment
        best = obj.best_node(nodes, exp)
        root = nodes.get(self.archive.root())
        mine = run_nodes(nodes, self.rec.id)
        counts = {
            s: sum(1 for n in mine.values() if n.status == s)
            for s in ("evaluated", "failed", "rejected", "verified", "spawned", "evaluating")
        }
        cand = obj.best_node({k: n for k, n in nodes.items() if n.parents}, exp)
        return RunSummary(
            self.rec.id,
            (first, last),
            self.stop_reason or "",
            best,
            obj.node_utility(nodes[best], exp) if best else None,
            cand,
            obj.node_utility(nodes[cand], exp) if cand else None,
            obj.node_utility(root, exp),
            counts,
            self.usage(nodes).to_dict(),
            obj.describe_objective(exp),
            configured_protocol(self.cfg).key,
            self.root_blocked,
            self.plan.confirm_seeds,
        )


def _log_event(e: dict) -> None:
    kind = e.get("kind")
    if kind == "log":
        log.info("%s", e.get("msg", ""))
    elif kind == "node" and e.get("status") in ("evaluated", "failed", "rejected"):
        reason = f": {e['reason']}" if e.get("reason") else ""
        other = waited_phrase(e.get("other", ""), e.get("waited_s", 0.0))
        log.info(
            "%s %s%s%s", e.get("node"), e.get("status"), f" ({other})" if other else "", reason
        )
    elif kind == "stop":
        log.info("stopped: %s", e.get("reason"))
    elif kind != "tick":
        log.debug("%s", e)


def _f(v: Any) -> str:
    return "—" if v is None else f"{float(v):.4g}"


def _llm_usage(llm) -> tuple[int, float]:
    """(tokens, USD) the run's LLM client has spent in this process."""
    u = getattr(llm, "usage", None)
    if u is None:
        return 0, 0.0
    return int(u.prompt_tokens + u.completion_tokens), float(u.cost_usd)


def _close_dangling_runs(archive: Archive, names: list[str]) -> None:
    """MLflow runs a killed evaluation left RUNNING are marked KILLED, so none is counted twice."""
    try:
        for name in names:
            end_dangling_runs(archive, name)
    except Exception as exc:  # tracking is best effort here; the node's own state is in git
        log.warning("could not close the MLflow runs a stopped evaluation left: %s", exc)
