"""A corpus of hostile / broken candidates that verification must reject, each with the right reason
(the cases: tests/hostile_corpus.py), and benign edits it must accept.

Static cases never execute; runtime cases run the generated suite behind the sandbox (recorded in a
child, judged on the trusted side); BYPASS cases skip the static check, as if it had missed them."""

from __future__ import annotations

import pytest
from conftest import require_boundary
from hostile_corpus import (
    BENIGN,
    BYPASS,
    CANARY,
    LIMITS,
    ROOT,
    RUNTIME,
    RUNTIME_MORE,
    STATIC,
    adv,
)

from engine.errors import PoiseError
from engine.operators.implement import build_source
from engine.operators.verify import VerifyLimits, verify_source


def rejection(edit: str) -> str:
    try:
        src = build_source(ROOT, edit)
    except PoiseError as exc:
        return str(exc)
    res = verify_source(src, ROOT, ("correct_above_wrong",), LIMITS)
    assert not res.ok, "a hostile candidate was verified"
    return res.reason


def test_corpus_size():
    assert len(STATIC) + len(RUNTIME) + len(RUNTIME_MORE) + len(BYPASS) >= 100 and len(BENIGN) >= 5


@pytest.mark.parametrize("name", sorted(BENIGN))
def test_benign_edit_passes_the_static_check(name):
    from engine.operators.static_check import static_check

    static_check(build_source(ROOT, BENIGN[name]), ROOT)


@pytest.fixture(scope="module")
def benign_results():
    from concurrent.futures import ThreadPoolExecutor

    def verify(edit):
        return verify_source(build_source(ROOT, edit), ROOT, (), LIMITS)

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(sorted(BENIGN), pool.map(verify, [BENIGN[n] for n in sorted(BENIGN)])))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BENIGN))
def test_benign_edit_is_verified(benign_results, name):
    res = benign_results[name]
    assert res.ok, res.reason
    assert res.report["fingerprint"] and len(res.report["fingerprint"]) > 100


@pytest.mark.parametrize("edit,why", [c[1:] for c in STATIC], ids=[c[0] for c in STATIC])
def test_static_rejection(edit, why):
    reason = rejection(edit)
    assert why.lower() in reason.lower(), reason


def _reject_all(cases) -> dict[str, str]:
    """Every case verified once, three sandboxes at a time (each pays two torch imports)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip([c[0] for c in cases], pool.map(rejection, [c[1] for c in cases])))


@pytest.fixture(scope="module")
def runtime_reasons():
    return _reject_all(RUNTIME)


@pytest.fixture(scope="module")
def more_runtime_reasons():
    return _reject_all(RUNTIME_MORE)


def _check(reason: str, why: str) -> None:
    """``why``: the expected reason, or alternatives joined by ``|`` (whichever limit hits first)."""
    low = reason.lower()
    assert any(w.lower() in low for w in why.split("|")) or (
        why == "memory" and "allocate" in low
    ), reason


@pytest.mark.slow  # every runtime case in its own sandbox, ~25 s of CPU
@pytest.mark.parametrize("case,why", [(c[0], c[2]) for c in RUNTIME], ids=[c[0] for c in RUNTIME])
def test_runtime_rejection(runtime_reasons, case, why):
    _check(runtime_reasons[case], why)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case,why", [(c[0], c[2]) for c in RUNTIME_MORE], ids=[c[0] for c in RUNTIME_MORE]
)
def test_more_runtime_rejection(more_runtime_reasons, case, why):
    _check(more_runtime_reasons[case], why)


@pytest.mark.parametrize("mode", ["auto", pytest.param("none", marks=pytest.mark.slow)])
def test_the_baseline_itself_passes(monkeypatch, mode):
    """Under the boundary, and in the weak mode (POISE_SANDBOX=none), which warns but works."""
    from engine.operators.fingerprint import compute
    from trainer_template.loader import load_algorithm

    monkeypatch.setenv("POISE_SANDBOX", mode)
    res = verify_source(ROOT, ROOT, ("correct_above_wrong", "rare_success_larger"), LIMITS)
    assert res.ok, res.reason
    assert ("weak mode" in res.report["boundary"]) == (mode == "none")
    assert res.report["fingerprint"] == compute(load_algorithm(ROOT))  # replayed == direct


@pytest.mark.parametrize(
    "tail", ["print('at import')\n", "for i in range(3):\n    pass\n", "if True:\n    import os\n"]
)
def test_whole_file_module_level_code_is_rejected(tail):
    from engine.operators.static_check import StaticCheckError, static_check

    with pytest.raises(StaticCheckError, match="module level"):
        static_check(ROOT + "\n" + tail, ROOT)


@pytest.fixture(scope="module")
def bypass_reasons():
    """The BYPASS cases, run straight through the sandboxed suite (no static check)."""
    require_boundary()
    from concurrent.futures import ThreadPoolExecutor

    from engine.operators.verify import generate_suite, run_suite

    files = generate_suite(())
    mp = pytest.MonkeyPatch()
    mp.setenv("LLM_CRED", CANARY)

    def one(case):
        name, (head, body), _ = case
        src = build_source(ROOT, adv(body)).replace("# ALGO LOGIC", head + "\n\n# ALGO LOGIC", 1)
        limits = VerifyLimits(timeout_s=15, cpu_s=30, memory_mb=1500, call_s=1.0)
        ok, reason, report = run_suite(src, files, limits if name.startswith("slow") else LIMITS)
        assert not ok, f"{name} was verified"
        return reason

    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            return dict(zip([c[0] for c in BYPASS], pool.map(one, BYPASS)))
    finally:
        mp.undo()


@pytest.mark.slow
@pytest.mark.parametrize("case,why", [(c[0], c[2]) for c in BYPASS], ids=[c[0] for c in BYPASS])
def test_static_bypass_is_still_rejected(bypass_reasons, case, why):
    reason = bypass_reasons[case]
    assert why.lower() in reason.lower(), reason
    assert CANARY not in reason


def test_a_scoped_recorder_refuses_the_calls_of_another_scope():
    """A fingerprint's recording child records one source: the parent refuses a call keyed for any
    other (another source's ``fp1#...``, a longer index ``fp10#...``), and accepts its own."""
    from engine.operators.recording import Recorder
    from engine.sandbox.channel import ChannelError
    from engine.sandbox.runner import Session

    rec = Recorder(1.0, scope="fp1")
    rec({"type": "begin", "key": "fp1#load", "digest": ""}, Session())
    rec({"type": "end", "key": "fp1#load"}, Session())
    for key in ("fp0#load", "fp10#load", "fp1", "session#0"):
        with pytest.raises(ChannelError, match="is not one of fp1's"):
            rec({"type": "begin", "key": key, "digest": ""}, Session())
    assert list(rec.calls) == ["fp1#load"]


@pytest.mark.slow  # three recording children and a replay, each importing torch
def test_fingerprinting_survives_a_child_that_dies_or_sends_a_key_of_no_source():
    """The recording child chooses its calls' keys. One that dies with a call of its own open leaves
    its source failed with how it ended; one that sends a key naming no source ('fpx#0') is refused,
    and its source with it; the next source is fingerprinted, not a crash of the engine's screening."""
    require_boundary()
    from engine.operators.fingerprint import fingerprints

    def dying(i: int, key: str) -> str:
        """Source ``i``: its load ends (a forged end frame), a call keyed ``key`` begins, it dies."""
        head = (
            "import os\n"
            "from trainer_template.channel import Channel\n"
            "_c = Channel.from_env()\n"
            f"_c.send({{'type': 'end', 'key': 'fp{i}#load', 'out': {{'t': 'scalar', 'v': None}}}})\n"
            f"_c.send({{'type': 'begin', 'key': '{key}', 'fn': 'x', 'digest': ''}})\n"
            "os._exit(1)\n"
        )
        return ROOT.replace("# ALGO LOGIC", head + "\n\n# ALGO LOGIC", 1)

    died, foreign, good = fingerprints([dying(0, "fp0#0"), dying(1, "fpx#0"), ROOT], timeout_s=60)
    assert isinstance(died, str) and "exited with status 1" in died, died
    assert isinstance(foreign, str) and "'fpx#0' is not one of fp1's" in foreign, foreign
    assert isinstance(good, list) and len(good) > 100


# Source 0's code wraps the channel of the process it runs in: every call it records is sent a second
# time under source 1's key, and source 1's own calls are dropped — a forged recording of source 1
# that makes it behave exactly like source 0 (a near-duplicate that screening would drop).
FORGE_NEXT_SOURCE = """
from trainer_template.channel import Channel

_send = Channel.send
_begin = {"digest": "", "fn": "load"}


def _forge(self, message, blob=None):
    key = str(message.get("key", ""))
    if key.startswith("fp1#"):
        return None
    _send(self, message, blob)
    if message.get("type") == "begin":
        _begin.update(message)
    elif message.get("type") == "end" and key.startswith("fp0#"):
        twin = "fp1#" + key[4:]
        _send(self, {"type": "begin", "key": twin, "fn": _begin["fn"], "digest": _begin["digest"]})
        _send(self, {**message, "key": twin})
    return None


Channel.send = _forge
"""


@pytest.mark.slow  # fingerprints three sources in the sandbox, in two calls
def test_a_source_cannot_forge_the_fingerprint_of_another():
    """Each source is recorded by a process that loaded no other source: source 0's code, which sends
    a recording of itself under source 1's key and drops source 1's own calls, fails itself and
    leaves source 1's fingerprint exactly what it is alone."""
    require_boundary()
    from engine.archive.edit import prior_source
    from engine.operators.fingerprint import DUPLICATE_TOL, distance, fingerprints

    other = prior_source("dr_grpo")
    root_fp, alone = fingerprints([ROOT, other], timeout_s=60)
    assert isinstance(alone, list) and distance(root_fp, alone) > DUPLICATE_TOL  # a real difference
    hostile = ROOT.replace("# ALGO LOGIC", FORGE_NEXT_SOURCE + "\n\n# ALGO LOGIC", 1)
    bad, good = fingerprints([hostile, other], timeout_s=60)
    assert good == alone, "source 1's recording was forged by source 0"
    assert isinstance(bad, str) and "fp1#" in bad, bad
