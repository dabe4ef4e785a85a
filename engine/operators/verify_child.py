"""The children of verification and fingerprinting (``python -m engine.operators.verify_child``):

    record INPUT            run the suite in INPUT/tests against INPUT/algorithm.py, streaming every
                            call (sandboxed, candidate code), then the fingerprint probes
    replay INPUT            run the suite against the recording on stdin (trusted: no candidate
                            code); sends {"type": "result", "returncode", "tests", "fingerprint"}
    fp-record INPUT I       fingerprint probes of INPUT/src<I>.py, the one source this child loads
                            (candidate code; calls keyed ``fp<I>#...``)
    fp-replay INPUT N       the fingerprint vectors of sources 0..N-1 from the recording on stdin

The replays start together with their recording child: they import pytest and torch, then block
on stdin until the engine writes the recording (nothing: the recording was refused, exit quietly).

The mode (``$POISE_VERIFY_MODE``) is set by the parent; see ``engine.operators.probe``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch  # noqa: F401

import engine.operators.fingerprint  # noqa: F401
from engine.operators import probe
from engine.operators.fingerprint import compute
from trainer_template.channel import Channel


def _pytest(root: Path, extra: list[str], plugins: list) -> int:
    import pytest  # lazy: pytest is heavy (only this path needs it)

    args = ["-q", "-p", "no:cacheprovider", "-c", str(root / "pytest.ini")]
    args += ["--rootdir", str(root), *extra, str(root / "tests")]
    return int(pytest.main(args, plugins=plugins))


class _Collect:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or report.failed:
            msg = ""
            if report.failed:
                crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
                msg = crash.message if crash is not None else str(report.longrepr)[-400:]
                msg = (msg.strip().splitlines() or [""])[0]
            self.rows.append(
                {
                    "test": report.nodeid,
                    "outcome": report.outcome,
                    "when": report.when,
                    "message": msg[:600],
                }
            )


def _fingerprint(ns, key: str) -> list[float]:
    cfg = probe.config(ns, key=key)
    probe.set_scope(key)
    return compute(ns, cfg)


def record(root: Path) -> None:
    _pytest(root, [], [])
    ns = probe.loaded()
    if ns is not None:
        try:
            _fingerprint(ns, "fingerprint")
        except Exception:  # noqa: BLE001 - recorded call by call; the trusted side decides
            pass
    Channel.from_env().send({"type": "done"})


def _recording_from_stdin() -> bool:
    # lazy: pytest is heavy (only this path needs it)
    import pytest  # noqa: F401 - imported while the recording child runs

    data = sys.stdin.buffer.read()
    if not data:
        return False
    path = Path(os.environ.get("HOME", "/tmp")) / "recording.json"  # the child's own scratch
    path.write_bytes(data)
    os.environ[probe.RECORDING_ENV] = str(path)
    return True


def replay(root: Path) -> None:
    if not _recording_from_stdin():
        return
    collect = _Collect()
    rc = _pytest(root, ["--maxfail=2"], [collect])
    fingerprint = None
    if rc == 0:
        try:
            ns = probe.load_candidate(root / "algorithm.py")
            fingerprint = _fingerprint(ns, "fingerprint")
        except Exception as exc:  # noqa: BLE001
            fingerprint = f"{type(exc).__name__}: {exc}"[:300]
    Channel.from_env().send(
        {"type": "result", "returncode": rc, "tests": collect.rows, "fingerprint": fingerprint}
    )


def fp_record(root: Path, i: int) -> None:
    try:
        ns = probe.load_candidate(root / f"src{i}.py", key=f"fp{i}")
        _fingerprint(ns, f"fp{i}")
    except Exception:  # noqa: BLE001 - recorded call by call; the trusted side decides
        pass
    Channel.from_env().send({"type": "done"})


def fp_replay(root: Path, n: int) -> None:
    if not _recording_from_stdin():
        return
    out: list = []
    for i in range(n):
        try:
            ns = probe.load_candidate(root / f"src{i}.py", key=f"fp{i}")
            out.append(_fingerprint(ns, f"fp{i}"))
        except Exception as exc:  # noqa: BLE001
            out.append(f"{type(exc).__name__}: {exc}"[:300])
    Channel.from_env().send({"type": "fingerprints", "values": out})


def main(argv: list[str]) -> None:
    cmd, root = argv[0], Path(argv[1])
    if cmd == "record":
        record(root)
    elif cmd == "replay":
        replay(root)
    elif cmd == "fp-record":
        fp_record(root, int(argv[2]))
    elif cmd == "fp-replay":
        fp_replay(root, int(argv[2]))
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
