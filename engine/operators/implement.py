"""Implementation (Phase II): a proposal becomes a node — static checks, LibCST spawn, verification,
and a bounded correction loop feeding failures back to the proposer that wrote the code.

Static checks (``engine.operators.static_check``) run before any candidate code executes. A candidate
that never passes in R rounds is archived ``rejected`` with its reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from engine.archive.edit import apply_edit
from engine.errors import PoiseError
from engine.operators.proposers import get_proposer
from engine.operators.static_check import static_check
from engine.operators.verify import generate_suite, verify_node


def build_source(
    parent_source: str,
    edit: str,
    hyperparameters: Mapping | None = None,
    drop: Sequence[str] = (),
) -> str:
    """The candidate's algorithm.py: the LibCST edit applied, then hyperparameter defaults set and the
    ``drop`` fields removed (every other line of the dataclass kept)."""
    src = apply_edit(parent_source, edit) if edit.strip() else parent_source
    if hyperparameters or drop:
        # lazy: libcst is heavy (only this path needs it)
        from engine.operators.proposers.hyperparams import set_defaults

        src = set_defaults(src, hyperparameters or {}, drop=drop)
    return src


def implement(
    archive,
    parent,
    proposal,
    cfg,
    name: str | None = None,
    trailers: Mapping | None = None,
    *,
    rounds: int | None = None,
    llm=None,
    limits=None,
    progress=None,
):
    """Spawn ``proposal`` off ``parent`` (str, or a list for a crossover), verify it, correct it for at most
    R rounds (``[propose].correction_rounds``); return the Node, ``verified`` or ``rejected``.

    Every failed attempt is kept on the node's branch under ``attempts/<r>/`` (see
    :func:`attempt_files`): its edit and algorithm.py, the failure with the failing tests, and the
    correction prompt that went back to the proposer, so ``git log poise/NODE`` shows the loop."""
    parents = [parent] if isinstance(parent, str) else list(parent)
    parents += [p for p in getattr(proposal, "parents", ()) if p not in parents]
    rounds = max(1, rounds if rounds is not None else cfg.propose.correction_rounds)
    name = name or unique_name(archive, proposal.name)
    parent_src = archive.algorithm(parents[0])
    proposer = get_proposer(proposal.proposer, llm=llm)
    tr = {"Poise-Proposer": proposal.proposer, "Poise-Event": "spawn"}
    tr.update({k: v for k, v in (trailers or {}).items()})
    failures: list[str] = []
    notes: list[str] = []
    node_made = False
    pending: dict[str, str] = {}  # attempt records written before the node exists
    current = proposal
    for r in range(1, rounds + 1):
        if progress:
            progress(f"{name}: implementation round {r}/{rounds}")
        src, problem, result = None, "", None
        try:
            src = build_source(
                parent_src, current.edit, current.hyperparameters, current.drop_hyperparameters
            )
            static_check(src, parent_src)
        except PoiseError as exc:
            problem = f"static check: {exc}"
        if not problem:
            files = {
                "records/proposal.json": json.dumps(current.to_record(), indent=1, sort_keys=True),
                **pending,
            }
            if not node_made:
                archive.spawn(
                    parents,
                    name,
                    algorithm=src,
                    proposal=current.markdown(),
                    files=files,
                    trailers=tr,
                )
                node_made = True
            else:
                archive.commit_files(
                    name,
                    {"algorithm.py": src, "PROPOSAL.md": current.markdown(), **files},
                    subject=f"poise: correction {r} of {name}",
                    status="spawned",
                    trailers={
                        "Poise-Event": "correction",
                        "Poise-Correction": str(r),
                        "Poise-Reason": [],
                    },
                )
            pending = {}
            result = verify_node(archive, name, cfg, proposal=current, limits=limits)
            if result.ok:
                _record_usage(archive, name, llm, proposal)
                return archive.node(name)
            problem = f"verification: {result.reason}"
        failures.append(f"round {r}: {problem}")
        prompt = None
        if r < rounds and hasattr(proposer, "correction_messages"):
            try:
                prompt = proposer.correction_messages(archive, parents[0], current, problem)
            except PoiseError:
                prompt = None
        record = attempt_files(r, current, src, problem, result, prompt)
        if node_made:
            archive.commit_files(
                name,
                record,
                subject=f"poise: attempt {r} of {name} failed",
                trailers={"Poise-Event": "attempt", "Poise-Attempt": str(r)},
            )
        else:
            pending.update(record)
        try:
            revised = (
                proposer.revise(archive, parents[0], current, problem, cfg, node=name)
                if r < rounds
                else None
            )
        except (
            PoiseError
        ) as exc:  # e.g. the endpoint went away: the node is still archived with its reason
            notes.append(f"correction after round {r} failed: {exc}")
            break
        if revised is None:
            break
        current = replace(revised, proposer=proposal.proposer, parents=proposal.parents)
    reason = failures[-1].split(": ", 1)[1] if failures else "no candidate"
    if notes:  # the correction could not be asked (the endpoint failed): say so, not only the test
        reason = f"{notes[-1]}; before it, {reason}"  # first: the reason is cut at 300 characters
    log = "\n".join(failures + notes) + "\n"
    if not node_made:
        files = {
            "records/rejected_edit.py": current.edit or "",
            "records/failures.txt": log,
            **pending,
        }
        archive.spawn(
            parents,
            name,
            algorithm=parent_src,
            proposal=current.markdown(),
            files=files,
            trailers=tr,
        )
        archive.set_status(name, "rejected", reason)
    else:
        archive.set_status(name, "rejected", reason, files={"records/failures.txt": log})
    _record_usage(archive, name, llm, proposal)
    return archive.node(name)


def attempt_files(
    r: int, proposal, source: str | None, problem: str, result=None, prompt=None
) -> dict[str, str]:
    """The record of failed attempt ``r``: ``attempts/<r>/edit.py`` (what the proposer wrote),
    ``algorithm.py`` (when the edit applied), ``failure.txt`` (the reason and every failing test
    with its message), ``verification.json`` and the generated ``tests/`` (when tests ran), and
    ``correction_prompt.md`` (the messages sent back to the proposer, when it was asked)."""
    base = f"attempts/{r}/"
    files = {base + "edit.py": proposal.edit or ""}
    if source is not None:
        files[base + "algorithm.py"] = source
    lines = [f"attempt {r} failed: {problem}"]
    report = getattr(result, "report", None) or {}
    failed = [t for t in report.get("tests", []) if t.get("outcome") == "failed"]
    if failed:
        lines += ["", "failing tests:"]
        lines += [f"- {t['test']}: {' '.join((t.get('message') or '').split())}" for t in failed]
    if report.get("output_tail"):
        lines += ["", "output tail:", report["output_tail"]]
    files[base + "failure.txt"] = "\n".join(lines) + "\n"
    if report:
        files[base + "verification.json"] = json.dumps(
            {"ok": False, "reason": problem, **report}, indent=1, sort_keys=True, default=str
        )
        for path, text in generate_suite(tuple(proposal.intents)).items():
            files[base + path] = text
    if prompt:
        files[base + "correction_prompt.md"] = (
            "\n\n".join(f"## {m['role']}\n\n{m['content']}" for m in prompt) + "\n"
        )
    return files


def _record_usage(archive, name: str, llm, proposal) -> None:
    if llm is None or proposal.proposer != "llm":
        return
    usage = llm.node_usage(name)
    record = {"propose_call": proposal.llm_usage, "corrections": usage, "model": llm.model}
    if usage["calls"] or proposal.llm_usage:
        archive.commit_files(
            name,
            {"records/llm_usage.json": json.dumps(record, indent=1, sort_keys=True)},
            subject=f"poise: LLM usage of {name}",
            trailers={"Poise-Event": "llm-usage"},
        )


def unique_name(archive, base: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", base or "candidate").strip("-.")[:60] or "candidate"
    nodes = archive.nodes()
    if base not in nodes:
        return base
    i = 2
    while f"{base}-{i}" in nodes:
        i += 1
    return f"{base}-{i}"
