"""One proxy seed run end to end (``engine.operators.evaluate_seed.run_seed``): the sandboxed training
child and the trusted scorer, on the tiny preset, with candidates that misbehave."""

from __future__ import annotations

from pathlib import Path

from conftest import require_boundary

from engine.operators.evaluate_seed import run_seed
from engine.sandbox.limits import Limits
from trainer_template.proxy.protocol import get_protocol
from trainer_template.proxy.warmstart import ensure_warmstart

ROOT = Path(__file__).resolve().parents[1] / "trainer_template" / "algorithm.py"

# reaches the engine's channel from inside compute_advantages and reports success with the weights
# it holds, before a single RL update
EARLY_DONE = """
_root_advantages = compute_advantages


def compute_advantages(batch, cfg):
    import gc, io, os

    from trainer_template.channel import Channel
    from trainer_template.proxy.model import TinyGPT

    model = next(o for o in gc.get_objects() if isinstance(o, TinyGPT) and o.training is False)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    done = {"type": "done", "status": "ok", "reason": "", "timings": {}, "device": "cpu"}
    Channel.from_env().send(done, blob=buf.getvalue())
    os._exit(0)
"""


def test_a_seed_reported_ok_before_its_last_rl_step_fails():
    """A training child that says 'ok' without having sent every RL step of the protocol did not
    run the protocol: its seed fails with that reason and no metrics, never an evaluated seed."""
    protocol = get_protocol("tiny")
    run = run_seed(
        ROOT.read_text() + EARLY_DONE,
        "early",
        0,
        "tiny",
        protocol.rl.steps,
        ensure_warmstart(protocol),
        Limits(wall_s=60, memory_mb=4096),
        boundary=require_boundary(),
    )
    assert run["status"] == "failed" and run["metrics"] == {}, run
    assert f"success after 0 of {protocol.rl.steps} RL steps" in run["reason"], run["reason"]
