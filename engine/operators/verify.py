"""Verification: a generated pytest suite, committed into the node's ``tests/``, decided on the trusted side.

The suite checks interface properties on random and extreme batches (shape, dtype, finite values with
all-correct / all-wrong / all-invalid / singleton groups, inputs not mutated, deterministic, invariant
to group relabelling and batch permutation; the loss a finite differentiable scalar with finite
gradients) plus the proposal's intent tests. The candidate runs only in a sandboxed child that
records its calls (``engine.operators.probe``; each call within a per-call deadline the parent
enforces, the whole child under CPU, memory, process and wall-clock limits); the suite's verdict and
the behavioural fingerprint come from a replay of that recording that loads no candidate code.
``verify_node`` records ``verification.json`` and the status ``verified`` / ``rejected``.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.archive.edit import prior_source
from engine.errors import EvaluationError, PoiseError
from engine.operators import recording
from engine.operators.recording import Recorder
from engine.operators.static_check import static_check
from engine.operators.verify_suite import CONFTEST, INTENT_TESTS, INTERFACE_TESTS, intent_suite
from engine.sandbox import boundary as _boundary
from engine.sandbox import live
from engine.sandbox.channel import ChannelError
from engine.sandbox.limits import Limits
from engine.sandbox.runner import Feed, run_sandboxed
from trainer_template import ALGORITHM_FILE
from trainer_template.priors import list_priors

VERIFICATION = "verification.json"


@dataclass(frozen=True)
class VerifyLimits:
    """Limits of one verification run (env overrides: POISE_VERIFY_TIMEOUT_S, _CPU_S, _MEMORY_MB, _CALL_S)."""

    timeout_s: float = 180.0
    cpu_s: float = 120.0
    memory_mb: int = 3072
    call_s: float = 5.0

    def sandbox(self):
        """The sandbox limits of one verification child."""
        return Limits(wall_s=self.timeout_s, cpu_s=self.cpu_s, memory_mb=self.memory_mb)

    @classmethod
    def from_env(cls) -> VerifyLimits:
        kw: dict[str, Any] = {}
        for f, conv in (
            ("timeout_s", float),
            ("cpu_s", float),
            ("memory_mb", int),
            ("call_s", float),
        ):
            v = os.environ.get(f"POISE_VERIFY_{f.upper()}")
            if v:
                try:
                    kw[f] = conv(v)
                except ValueError:
                    raise PoiseError(
                        f"POISE_VERIFY_{f.upper()} must be a number, got {v!r}"
                    ) from None
        return cls(**kw)


@dataclass
class VerifyResult:
    ok: bool
    reason: str
    report: dict[str, Any] = field(default_factory=dict)


def generate_suite(intents: tuple[str, ...] | list[str] = ()) -> dict[str, str]:
    """The generated test files ``{path: text}`` for a node (``tests/...``)."""
    files = {"tests/conftest.py": CONFTEST, "tests/test_interface.py": INTERFACE_TESTS}
    known = [i for i in intents if i in INTENT_TESTS]
    if known:
        files["tests/test_intent.py"] = intent_suite(known)
    return files


VERIFY_PRELOAD = ("torch", "pytest")
"""what both children of a verification import before they run (``run_sandboxed``'s ``preload``)"""

PYTEST_INI = "[pytest]\n"
"""the suite's own (empty) settings, so that no configuration around the scratch directory applies"""


def run_suite(
    source: str, files: dict[str, str], limits: VerifyLimits, boundary=None
) -> tuple[bool, str, dict[str, Any]]:
    """Record the candidate's calls in the sandbox, then decide on the trusted side; (ok, reason, report).

    1. A sandboxed child runs the suite against ``source`` and streams every call into the candidate
       (raw outputs; each call within ``limits.call_s``, the parent's deadline).
    2. A second sandboxed child that loads no candidate code runs the same suite against the
       recording; its result is the verdict. Nothing either child writes to a file is read back."""
    b = boundary or _boundary.resolve()
    box = limits.sandbox()
    tests = {path: text.encode() for path, text in files.items()}
    result: dict[str, Any] = {}

    def on_result(frame: dict, _session) -> None:
        if frame.get("type") != "result" or result:
            raise ChannelError("the replay sent an unexpected frame")
        result.update(frame)

    feed = Feed()
    judging: dict[str, Any] = {}
    judge = threading.Thread(  # starts now: its imports overlap the recording
        target=lambda: judging.update(
            run=run_sandboxed(
                "engine.operators.verify_child",
                ["replay", "{input}"],
                limits=box.with_(wall_s=2 * box.wall_s, cpu_s=box.wall_s),
                inputs={"pytest.ini": PYTEST_INI.encode(), **tests},
                env={"POISE_VERIFY_MODE": "replay", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
                on_frame=on_result,
                boundary=b,
                stdin=feed,
                preload=VERIFY_PRELOAD,
            )
        ),
        name="poise-verify-replay",
    )
    judge.start()
    rec = Recorder(limits.call_s)
    try:
        run = run_sandboxed(
            "engine.operators.verify_child",
            ["record", "{input}"],
            limits=box.with_(channel_mb=recording.RECORDING_CHANNEL_MB),
            inputs={"algorithm.py": source.encode(), "pytest.ini": PYTEST_INI.encode(), **tests},
            env={"POISE_VERIFY_MODE": "record", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
            on_frame=rec,
            boundary=b,
            preload=VERIFY_PRELOAD,
        )
        ended = rec.finish(run)
        feed.put(None if run.protocol_error else rec.to_json(ended).encode())
    finally:
        feed.put(None)
        live.join(judge)
    judged = judging["run"]
    report: dict[str, Any] = {
        "wall_s": round(max(run.wall_s, judged.wall_s), 2),
        "limits": asdict(limits),
        "boundary": b.describe(),
        "calls": len(rec.calls),
    }
    if run.protocol_error:
        report["output_tail"] = run.output_tail[-2000:]
        return False, f"the candidate's process {run.reason()}", report
    rows = result.get("tests")
    if not judged.ok or not isinstance(rows, list):  # a recording that breaks the judge is refused
        report["output_tail"] = judged.output_tail[-2000:]
        return False, f"the recording could not be judged: {judged.reason()}", report
    report["tests"] = rows
    report["passed"] = sum(1 for t in rows if t["outcome"] == "passed")
    report["failed"] = [t["test"].split("::")[-1] for t in rows if t["outcome"] == "failed"]
    if ended:
        report["ended"] = ended
        report["output_tail"] = run.output_tail[-2000:]
    if result.get("returncode") == 0 and not report["failed"]:
        fp = result.get("fingerprint")
        report["fingerprint"] = fp if isinstance(fp, list) else None
        return True, "", report
    first = next((t for t in rows if t["outcome"] == "failed"), None)
    if first is None:
        report["output_tail"] = (run.output_tail + judged.output_tail)[-2000:]
        code = result.get("returncode")
        return False, f"the test suite did not run (pytest exit code {code})", report
    msg = " ".join(first["message"].split())[:240]
    return False, f"{first['test'].split('::')[-1]} failed: {msg}", report


def verify_source(
    source: str, parent_source: str | None, intents=(), limits: VerifyLimits | None = None
) -> VerifyResult:
    """Static checks, then the generated suite in a sandbox (nothing recorded)."""
    limits = limits or VerifyLimits.from_env()
    files = generate_suite(tuple(intents))
    try:
        static_check(source, parent_source)
    except PoiseError as exc:
        return VerifyResult(False, f"static check: {exc}", {"static": str(exc), "files": files})
    ok, reason, report = run_suite(source, files, limits)
    report["static"] = "ok"
    report["files"] = files
    return VerifyResult(ok, reason, report)


def verify_node(
    archive, name: str, cfg=None, *, proposal=None, limits: VerifyLimits | None = None
) -> VerifyResult:
    """Verify node ``name``; commit ``tests/`` + ``verification.json`` and set verified | rejected.

    A node already past verification (evaluating / evaluated / failed) keeps its status; only the
    record is added."""
    node = archive.node(name)
    source = archive.algorithm(name)
    parent_source = (
        archive.algorithm(node.parent) if node.parent and archive.exists(node.parent) else None
    )
    if proposal is None:
        rec = archive.read_file(name, "records/proposal.json")
        intents = tuple(json.loads(rec).get("intents", ())) if rec else ()
    else:
        intents = tuple(proposal.intents)
    result = verify_source(source, parent_source, intents, limits)
    files = result.report.pop("files")
    record = {
        "ok": result.ok,
        "reason": result.reason,
        "algorithm_sha256": hashlib.sha256(source.encode("utf-8")).hexdigest(),
        "intents": [i for i in intents if i in INTENT_TESTS],
        **result.report,
    }
    payload = {
        VERIFICATION: json.dumps(record, indent=1, sort_keys=True, allow_nan=False) + "\n",
        **files,
    }
    status = (
        ("verified" if result.ok else "rejected")
        if node.status in ("spawned", "verified", "rejected")
        else node.status
    )
    if result.ok:
        archive.commit_files(
            name,
            payload,
            subject=f"poise: {name} verified",
            status=status,
            trailers={"Poise-Event": "verified", "Poise-Reason": []},
        )
    else:
        archive.set_status(name, status, result.reason, files=payload)
    return result


def is_template(source: str) -> bool:
    """True for code shipped with poise-git: the root's algorithm.py, or a published mechanism (its
    edit applied to the root, as ``poise-git spawn --prior`` makes it)."""
    if source == ALGORITHM_FILE.read_text(encoding="utf-8"):
        return True
    for name in list_priors():
        try:
            if source == prior_source(name):
                return True
        except PoiseError:
            continue
    return False


def evaluation_gate(archive, name: str, *, unsandboxed: bool = False) -> str:
    """'' when ``name`` may be evaluated, else why not.

    Template code (``is_template``) is trusted as shipped: the root GRPO node needs no verification
    run. Any other algorithm.py must carry a passing ``verification.json`` made for exactly this
    source (its sha256). ``unsandboxed`` (verl runs the code outside the sandbox): the static check
    is run again here, since the record is a file in the archive that anyone who can push a branch
    can write."""
    source = archive.algorithm(name)
    if is_template(source):
        return ""
    raw = archive.read_file(name, VERIFICATION)
    if raw is None:
        return f"it was never verified; run `poise-git verify {name}` first"
    try:
        rec = json.loads(raw)
    except json.JSONDecodeError:
        return f"its {VERIFICATION} is unreadable; run `poise-git verify {name}` again"
    if not isinstance(rec, dict) or not rec.get("ok"):
        why = rec.get("reason", "") if isinstance(rec, dict) else ""
        return f"verification rejected it ({why})" if why else "verification rejected it"
    if rec.get("algorithm_sha256") != hashlib.sha256(source.encode("utf-8")).hexdigest():
        return f"its algorithm.py is not the one verified; run `poise-git verify {name}` again"
    if unsandboxed:
        try:
            static_check(source)
        except PoiseError as exc:
            return (
                f"its algorithm.py fails the static check, whatever its {VERIFICATION} says ({exc})"
            )
    return ""


def refuse_unverified(archive, name: str, verb: str, *, unsandboxed: bool = False) -> None:
    """Raise ``EvaluationError`` ("<verb> refuses NAME: why") unless :func:`evaluation_gate` passes."""
    why = evaluation_gate(archive, name, unsandboxed=unsandboxed)
    if why:
        raise EvaluationError(f"{verb} refuses {name!r}: {why}")
