"""Verification: a generated pytest suite, committed into the node's ``tests/``, run in a limited subprocess.

The suite checks interface properties on random and extreme batches (shape, dtype, finite values with
all-correct / all-wrong / all-invalid / singleton groups, inputs not mutated, deterministic, invariant
to group relabelling and batch permutation; the loss a finite differentiable scalar with finite
gradients) plus the proposal's intent tests. Every call into candidate code has a per-call time limit;
the whole run has CPU-time, memory and wall-clock limits (``engine.sandbox.run_limited``).
``verify_node`` records ``verification.json`` and the status ``verified`` / ``rejected``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import PoiseError
from engine.operators.static_check import static_check
from engine.operators.verify_suite import CONFTEST, INTENT_TESTS, INTERFACE_TESTS, intent_suite
from engine.sandbox.process import child_env, run_limited

VERIFICATION = "verification.json"


@dataclass(frozen=True)
class VerifyLimits:
    """Limits of one verification run (env overrides: POISE_VERIFY_TIMEOUT_S, _CPU_S, _MEMORY_MB, _CALL_S)."""

    timeout_s: float = 180.0
    cpu_s: float = 120.0
    memory_mb: int = 3072
    call_s: float = 5.0

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


_RUNNER = r"""
import json, sys
import pytest

class Collect:
    def __init__(self):
        self.rows = []
    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.failed:
            msg = ""
            if report.failed:
                crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
                msg = crash.message if crash is not None else str(report.longrepr)[-400:]
                msg = (msg.strip().splitlines() or [""])[0]
            self.rows.append(
                {"test": report.nodeid, "outcome": report.outcome, "when": report.when, "message": msg[:600]}
            )

c = Collect()
rc = pytest.main(["-q", "--maxfail=2", "-p", "no:cacheprovider", "tests"], plugins=[c])
out = {"returncode": int(rc), "tests": c.rows, "fingerprint": None}
if rc == 0:
    from engine.operators.fingerprint import compute
    from trainer_template.loader import load_algorithm
    out["fingerprint"] = compute(load_algorithm(open("algorithm.py").read(), "verified"))
json.dump(out, open(sys.argv[1], "w"))
"""


def generate_suite(intents: tuple[str, ...] | list[str] = ()) -> dict[str, str]:
    """The generated test files ``{path: text}`` for a node (``tests/...``)."""
    files = {"tests/conftest.py": CONFTEST, "tests/test_interface.py": INTERFACE_TESTS}
    known = [i for i in intents if i in INTENT_TESTS]
    if known:
        files["tests/test_intent.py"] = intent_suite(known)
    return files


def run_suite(
    source: str, files: dict[str, str], limits: VerifyLimits
) -> tuple[bool, str, dict[str, Any]]:
    """Run the suite against ``source`` in a limited subprocess; (ok, reason, report)."""
    with tempfile.TemporaryDirectory(prefix="poise-verify-") as tmp:
        root = Path(tmp)
        (root / "tests").mkdir()
        (root / "algorithm.py").write_text(source, encoding="utf-8")
        for path, text in files.items():
            (root / path).write_text(text, encoding="utf-8")
        out = root / "result.json"
        env = child_env(
            {"POISE_VERIFY_CALL_S": str(limits.call_s), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        )
        res = run_limited(
            [sys.executable, "-c", _RUNNER, str(out)],
            timeout_s=limits.timeout_s,
            cpu_s=limits.cpu_s,
            memory_mb=limits.memory_mb,
            cwd=root,
            env=env,
        )
        report: dict[str, Any] = {"wall_s": round(res.wall_s, 2), "limits": asdict(limits)}
        data = None
        if out.is_file():
            try:
                data = json.loads(out.read_text())
            except json.JSONDecodeError:
                data = None
    if data is None:
        tail = "\n".join((res.stdout + "\n" + res.stderr).strip().splitlines()[-15:])
        report["output_tail"] = tail[-2000:]
        return False, f"the test run died: {res.reason()}", report
    report["tests"] = data["tests"]
    report["passed"] = sum(1 for t in data["tests"] if t["outcome"] == "passed")
    report["failed"] = [
        t["test"].split("::")[-1] for t in data["tests"] if t["outcome"] == "failed"
    ]
    if data["returncode"] == 0 and not report["failed"]:
        report["fingerprint"] = data["fingerprint"]
        return True, "", report
    first = next((t for t in data["tests"] if t["outcome"] == "failed"), None)
    if first is None:
        report["output_tail"] = (res.stdout + res.stderr)[-2000:]
        return False, f"the test suite did not run (pytest exit code {data['returncode']})", report
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
