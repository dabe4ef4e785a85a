"""Behavioural fingerprints: what a mechanism DOES on a fixed bank of synthetic batches.

The fingerprint of a candidate is its advantages on seven fixed reward batches (mixed, all-correct,
all-wrong, rare success, invalid samples, long/short responses, singleton groups) followed by its
policy loss and gradient norm on fixed log-prob probes, and what the KL / entropy terms add to them.
Two candidates whose fingerprints agree within ``DUPLICATE_TOL`` in every part (advantages up to a
constant positive scale; loss probes in relative L2) are near-duplicates, whatever their code looks like.

Computing a fingerprint executes candidate code: the engine runs it only behind the sandbox, after
the static checks, as recorded calls (``engine.operators.probe``) replayed on the trusted side, where
``compute`` assembles the vector (``fingerprints(...)`` and ``verify``). ``fingerprints`` records each
source in a child that loads that source alone and accepts only calls keyed for it, so one source's
code cannot forge or overwrite another's recording.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from engine.operators import recording
from engine.operators.recording import Recorder
from engine.sandbox import boundary, live
from engine.sandbox.channel import ChannelError
from engine.sandbox.limits import Limits
from engine.sandbox.runner import Feed, run_sandboxed
from trainer_template.loader import make_config

DUPLICATE_TOL = 1e-3
RECORDERS = 2
"""recording children at a time: a child's start (Python and torch) is most of its cost"""
BANK_NAMES = (
    "mixed",
    "all_correct",
    "all_wrong",
    "rare_success",
    "invalid",
    "long_short",
    "singleton",
)


def bank():
    """The fixed synthetic batches: ``{name: RolloutBatch}`` (groups of 8; deterministic)."""
    import torch  # lazy: torch is heavy (only this path needs it)

    # lazy: torch is heavy (only this path needs it)
    from trainer_template.interface import RolloutBatch

    def mk(correct, valid=None, lengths=None, group=None, g=8):
        c = torch.tensor(correct, dtype=torch.bool)
        n = c.numel()
        v = (
            torch.ones(n, dtype=torch.bool)
            if valid is None
            else torch.tensor(valid, dtype=torch.bool)
        )
        ln = torch.tensor(
            lengths if lengths is not None else [100 + 37 * (i % 5) for i in range(n)],
            dtype=torch.long,
        )
        grp = torch.tensor(
            group if group is not None else [i // g for i in range(n)], dtype=torch.long
        )
        ent = torch.tensor([0.3 + 0.1 * (i % 7) for i in range(n)], dtype=torch.float32)
        return RolloutBatch(
            rewards=(c & v).to(torch.float32),
            group=grp,
            valid=v,
            correct=c & v,
            lengths=ln,
            token_entropy=ent,
        )

    mixed = (
        [1, 0, 1, 1, 0, 0, 1, 0]
        + [0, 0, 0, 1, 0, 0, 0, 0]
        + [1, 1, 1, 1, 1, 1, 0, 1]
        + [0, 1, 0, 1, 0, 1, 0, 1]
    )
    inv_c = [1, 0, 0, 0, 1, 0, 0, 0] * 2
    inv_v = [1, 1, 0, 0, 1, 1, 0, 1] + [1, 0, 1, 0, 1, 1, 1, 0]
    ls_c = [1, 1, 0, 0, 1, 0, 1, 0] * 2
    ls_len = [20, 900, 20, 900, 60, 500, 300, 40] + [1500, 15, 800, 30, 250, 250, 2000, 5]
    return {
        "mixed": mk(mixed),
        "all_correct": mk([1] * 16),
        "all_wrong": mk([0] * 16),
        "rare_success": mk([1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]),
        "invalid": mk(inv_c, inv_v),
        "long_short": mk(ls_c, lengths=ls_len),
        "singleton": mk([1, 0, 1, 0], group=[0, 1, 2, 3]),
    }


def loss_probes():
    """Fixed [B=4, T=6] probes: log-probs whose ratios cross both clip edges, advantages of both signs."""
    import torch  # lazy: torch is heavy (only this path needs it)

    g = torch.Generator().manual_seed(1234)
    old = -torch.rand(4, 6, generator=g) * 3 - 0.1
    delta = torch.tensor([[0.5], [-0.5], [0.05], [-0.05]]) + 0.02 * torch.randn(4, 6, generator=g)
    ref = old + 0.1 * torch.randn(4, 6, generator=g)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 4:] = False
    mask[3, 2:] = False
    adv = torch.tensor([[1.0], [-1.0], [0.5], [-2.0]]).expand(4, 6).contiguous()
    ent = torch.rand(4, 6, generator=g) + 0.5
    return old + delta, old, adv, mask, ref, ent


def compute(module, cfg=None) -> list[float]:
    """The fingerprint vector of a loaded algorithm module (NaN/inf kept as large sentinels)."""
    import torch  # lazy: torch is heavy (only this path needs it)

    # lazy: torch is heavy (only this path needs it)
    from trainer_template.interface import TrainingState, call_policy_loss

    # mid-training, entropy below a typical target: loss-side controllers show their effect
    probe_state = TrainingState(progress=0.5, step=50, total_steps=101, entropy=0.05)
    cfg = make_config(module) if cfg is None else cfg
    out: list[float] = []
    with torch.no_grad():
        for name in BANK_NAMES:
            adv = module.compute_advantages(bank()[name], cfg)
            out += [float(x) for x in torch.as_tensor(adv, dtype=torch.float32).reshape(-1)]
    logp, old, adv, mask, ref, ent = loss_probes()
    probe = []
    for with_extras in (False, True):
        lp = logp.clone().requires_grad_(True)
        loss, _ = call_policy_loss(
            module.policy_loss,
            lp,
            old,
            adv,
            mask,
            cfg,
            ref_log_prob=ref if with_extras else None,
            entropy=ent if with_extras else None,
            state=probe_state if with_extras else None,
        )
        loss.backward()
        probe += [float(loss.detach()), float(lp.grad.norm()) if lp.grad is not None else 0.0]
    # the surrogate alone, then what the KL / entropy terms add (a part of its own: small but real)
    out += [probe[0], probe[1], probe[2] - probe[0], probe[3] - probe[1]]
    return [x if math.isfinite(x) else (1e30 if x > 0 else -1e30) for x in out]


def _rel(a: Sequence[float], b: Sequence[float]) -> float:
    num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    den = math.sqrt(sum(x * x for x in a)) + math.sqrt(sum(y * y for y in b)) + 1e-8
    return num / den


def _direction(a: Sequence[float], b: Sequence[float]) -> float:
    """||a/|a| - b/|b||| / 2 in [0, 1]: blind to a constant positive scale of the advantages, which an
    Adam-style optimizer ignores (e.g. analytic vs sample std with binary rewards and a fixed G)."""
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    if na < 1e-12 or nb < 1e-12:
        return 0.0 if na < 1e-12 and nb < 1e-12 else 1.0
    return math.sqrt(sum((x / na - y / nb) ** 2 for x, y in zip(a, b))) / 2


def part_distances(a: Sequence[float], b: Sequence[float]) -> tuple[float, ...]:
    """Distances of the fingerprint's parts: advantages (direction only), then relative L2
    ||a - b|| / (||a|| + ||b|| + 1e-8) of the surrogate-loss probes and of the KL/entropy-term probes."""
    if len(a) != len(b):
        return (math.inf,)
    if len(a) < 4:
        return (_rel(a, b),)
    cut = len(a) - 4
    return (
        _direction(a[:cut], b[:cut]),
        _rel(a[cut : cut + 2], b[cut : cut + 2]),
        _rel(a[cut + 2 :], b[cut + 2 :]),
    )


def distance(a: Sequence[float], b: Sequence[float]) -> float:
    """The largest part distance: below DUPLICATE_TOL, two mechanisms behave alike in every part."""
    return max(part_distances(a, b))


def novelty(a: Sequence[float], b: Sequence[float]) -> float:
    """Graded novelty in [0, 1]: 0.6 x advantage part + 0.2 x each loss part (inf when lengths differ)."""
    d = part_distances(a, b)
    return d[0] if len(d) == 1 else 0.6 * d[0] + 0.2 * d[1] + 0.2 * d[2]


def nearest(
    fp: Sequence[float], others: dict[str, Sequence[float]]
) -> tuple[str | None, float, float]:
    """(the behaviourally closest node, its distance, the novelty against it)."""
    best, dist = None, math.inf
    for name, other in others.items():
        d = distance(fp, other)
        if d < dist:
            best, dist = name, d
    return best, dist, (novelty(fp, others[best]) if best is not None else math.inf)


def _record(
    i: int, source: str, limits: Limits, call_s: float, b: boundary.Boundary
) -> tuple[dict, str, str]:
    """Source ``i``'s recording from a sandboxed child that loads it alone: (its calls, why the child
    stopped early or '', why the recording was refused or ''). A call keyed for another source is
    refused (``Recorder``'s scope), and the source with it."""
    rec = Recorder(call_s, scope=f"fp{i}")
    run = run_sandboxed(
        "engine.operators.verify_child",
        ["fp-record", "{input}", str(i)],
        limits=limits,
        inputs={f"src{i}.py": source.encode("utf-8")},
        env={"POISE_VERIFY_MODE": "record"},
        on_frame=rec,
        boundary=b,
        preload=("torch",),
    )
    if run.protocol_error:
        return {}, "", f"fingerprinting failed: {run.reason()}"
    ended = rec.finish(run)  # the call open when the child stopped keeps the error
    return rec.calls, ended, ""


def fingerprints(
    sources: Sequence[str],
    *,
    timeout_s: float = 120.0,
    memory_mb: int = 4096,
    call_s: float = 10.0,
    parallel: int = RECORDERS,
) -> list[list[float] | str]:
    """Fingerprint many (statically checked) sources; an error string per failure.

    Each source is recorded by a sandboxed child of its own that loads no other source (``parallel``
    of them at a time), which streams each call's raw output, keyed for that source alone: no source's
    code runs in the process that records another's. The vectors are computed by one more sandboxed
    child that replays the recordings and loads no candidate code. A source whose child crashes, is
    killed or sends a malformed frame (one keyed for another source) gets its error; the others are
    fingerprinted."""
    if not sources:
        return []

    b = boundary.resolve()
    n = len(sources)
    limits = Limits(wall_s=timeout_s, cpu_s=timeout_s, memory_mb=memory_mb)
    # what the recording children of one call may send in all (each at least 1 MiB; a source's
    # recording is about 8 KB): the engine holds the recordings in memory until the replay reads them
    per_child = limits.with_(channel_mb=max(1, recording.RECORDING_CHANNEL_MB // n))
    workers = max(1, min(parallel, n))
    values: list = []

    def on_result(frame: dict, _session) -> None:
        if frame.get("type") != "fingerprints" or not isinstance(frame.get("values"), list):
            raise ChannelError("the replay sent an unexpected frame")
        values.extend(frame["values"])

    feed = Feed()
    judging: dict = {}
    judge = threading.Thread(  # starts now: its imports overlap the recording
        target=lambda: judging.update(
            run=run_sandboxed(
                "engine.operators.verify_child",
                ["fp-replay", "{input}", str(n)],
                # it waits on stdin while the recording children run, one batch after another
                limits=limits.with_(wall_s=(math.ceil(n / workers) + 1) * timeout_s),
                env={"POISE_VERIFY_MODE": "replay"},
                on_frame=on_result,
                boundary=b,
                stdin=feed,
                preload=("torch",),
            )
        ),
        name="poise-fingerprint-replay",
    )
    judge.start()
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="poise-fingerprint-record") as pool:
            recorded = live.results(
                [pool.submit(_record, i, sources[i], per_child, call_s, b) for i in range(n)]
            )
        calls = {k: v for part, _, _ in recorded for k, v in part.items()}
        ended = {f"fp{i}": why for i, (_, why, _) in enumerate(recorded) if why}
        feed.put(recording.recording_json(calls, ended).encode())
    finally:
        feed.put(None)
        live.join(judge)
    refused = [why for _, _, why in recorded]
    judged = judging["run"]
    if not judged.ok or len(values) != n:
        return [why or f"fingerprinting failed: {judged.reason()}" for why in refused]
    return [
        why or ([float(x) for x in v] if isinstance(v, list) else f"{v}"[:300])
        for v, why in zip(values, refused)
    ]
