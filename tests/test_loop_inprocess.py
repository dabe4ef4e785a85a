"""The loop in this process, no CLI: the offline proposer (or one scripted through the proposer
registry), the proxy's ``tiny`` preset, evaluations in a thread (``engine.loop.inline``) that run the
real proxy workers. A run interrupted mid-round resumes; a failed candidate does not stop its round
and a budget stops the run cleanly; the archive's work tree stays clean and MLflow writes only inside
the archive. (The CLI tests in test_loop.py, marked slow, run the same through worker processes.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from engine.archive.store import Archive
from engine.loop.budget import Budget
from engine.loop.core import Loop, RunOptions
from engine.loop.inline import InlineExecutor
from engine.loop.plan import RunPlan, resolve_plan
from engine.loop.state import RUN_REF, load_run, pending_work
from engine.operators.propose import Proposal
from engine.operators.proposers import register

PLAN = {"preset": "tiny", "seeds": 1, "parents": 1, "eval_timeout_s": 300}
FINAL = ("evaluated", "failed", "rejected")


def git_status(arch: Archive) -> str:
    return subprocess.run(
        ["git", "-C", str(arch.path), "status", "--porcelain"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def archive_with_root(tmp_path: Path) -> Archive:
    """A new archive whose root carries a recorded proxy/tiny result (the candidates the loop makes
    are evaluated for real; the root's figure only has to exist for the selection)."""
    from results_util import record

    arch = Archive.init(tmp_path / "exp")
    record(arch, "grpo", {"overall": 0.5}, preset="tiny")
    assert git_status(arch) == ""
    return arch


def run(arch: Archive, on_event=None, budget=(), resume=False, **plan):
    opts = RunOptions(plan={**PLAN, **plan}, budget=Budget.parse(list(budget)), resume=resume)
    return Loop(arch, opts, on_event, executor=InlineExecutor(1)).run()


def children(arch: Archive) -> dict:
    return {k: n for k, n in arch.nodes("proxy/tiny").items() if n.parents}


def check_reflections_logged_inside(arch: Archive, kids: dict) -> None:
    """Every reflected node's REFLECTION.md is an MLflow artifact under <archive>/mlruns."""
    reflected = [n for n in kids.values() if n.status == "evaluated"]
    artifacts = list((arch.path / "mlruns").rglob("REFLECTION.md"))
    assert len(artifacts) >= len(reflected)
    for n in reflected:
        assert arch.read_file(n.name, "REFLECTION.md")


@pytest.mark.slow  # a real loop with tiny evaluations: 20-40 s in the suite
def test_resume_after_an_interrupted_round(tmp_path):
    arch = archive_with_root(tmp_path)

    def interrupt_before_evaluating(event: dict) -> None:
        if event["kind"] == "stage" and event["stage"] == "evaluate":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(arch, on_event=interrupt_before_evaluating, rounds=1, population=1)
    rec = load_run(arch)
    assert rec.data["status"] == "stopped" and "interrupted" in rec.data["stop_reason"]
    (kid,) = children(arch).values()
    assert kid.status == "verified" and pending_work(arch, arch.nodes("proxy/tiny")).evaluate == [
        kid.name
    ]
    assert git_status(arch) == ""

    events: list[dict] = []
    summary = run(arch, on_event=events.append, resume=True)
    assert summary.run_id == rec.id and summary.stop_reason == "finished 1 round(s)"
    kids = children(arch)
    assert list(kids) == [kid.name]  # finished, not proposed again
    assert kids[kid.name].status in ("evaluated", "failed")
    assert any(e["kind"] == "log" and "finishing 1 pending" in e["msg"] for e in events)
    assert load_run(arch).data["status"] == "finished"
    subjects = arch.git.text("log", "--format=%s", RUN_REF).splitlines()
    assert any("resumed" in s for s in subjects) and any("stopped" in s for s in subjects)
    assert not pending_work(arch, arch.nodes("proxy/tiny"))
    check_reflections_logged_inside(arch, kids)
    assert git_status(arch) == "" and arch.fsck()


_LOSS_SIGNATURE = """def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cfg: Hyperparameters,
    ref_log_prob: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    state: TrainingState | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
"""
_LOSS_BODY = """    pg_losses, _ = ppo_clip_loss(
        log_prob, old_log_prob, advantages, cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.clip_ratio_c
    )
    loss = {scale} * agg_loss(pg_losses, response_mask, cfg.loss_agg_mode)
"""
DIVERGES_LATE = (
    _LOSS_SIGNATURE
    + '    """GRPO\'s loss x1.5 that turns NaN at the last step of a training run."""\n'
    + _LOSS_BODY.format(scale="1.5")
    + "    if state is not None and state.total_steps > 1 and state.step == state.total_steps - 1:\n"
    + '        loss = loss * float("nan")\n'
    + '    return loss, {"pg_loss": float(loss.detach())}\n'
)
HALF_STEP = (
    _LOSS_SIGNATURE
    + '    """GRPO\'s loss at half the step size."""\n'
    + _LOSS_BODY.format(scale="0.5")
    + '    return loss, {"pg_loss": float(loss.detach())}\n'
)


@register("scripted-for-tests")
class ScriptedProposer:
    """Two fixed proposals through the real registry: one diverges in training, one is sound."""

    def __init__(self, llm=None):
        pass

    def propose(self, archive, parent, context, cfg, n, seed):
        return [
            Proposal(
                name="late-divergence",
                motivation="a loss that breaks only in real training",
                mechanism="GRPO loss x1.5, NaN at the last step",
                expected_effect="fails its evaluation",
                edit=DIVERGES_LATE,
                expected_gain=0.9,
            ),
            Proposal(
                name="half-step",
                motivation="a smaller step",
                mechanism="GRPO loss x0.5",
                expected_effect="slower, stable learning",
                edit=HALF_STEP,
                expected_gain=0.1,
            ),
        ][:n]

    def revise(self, archive, parent, proposal, failure, cfg, node=None):
        return None


@pytest.mark.slow  # a real loop with tiny evaluations: 20-40 s in the suite
def test_a_failed_candidate_does_not_stop_the_round_and_a_budget_stops_the_run(tmp_path):
    arch = archive_with_root(tmp_path)
    summary = run(
        arch, rounds=2, population=2, proposer="scripted-for-tests", budget=["candidates=2"]
    )
    # round 1 went on past the failure; the budget then stopped the run before round 2
    kids = children(arch)
    assert {n: k.status for n, k in kids.items()} == {
        "late-divergence": "failed",
        "half-step": "evaluated",
    }
    failed = kids["late-divergence"]
    assert "NaN" in failed.trailer("Poise-Reason") and failed.results["proxy/tiny"].reason
    assert summary.counts["failed"] == 1 and summary.counts["evaluated"] == 1
    assert summary.stop_reason == "candidate budget exhausted: used 2 of 2"
    rec = load_run(arch)
    assert rec.data["status"] == "stopped" and rec.data["completed_round"] == 1
    assert rec.data["stop_reason"] == summary.stop_reason
    # the plan is recorded whole and reads back as the same RunPlan
    assert resolve_plan(arch.config(), {}, recorded=rec.data["plan"]) == RunPlan(
        rounds=2,
        parents=1,
        population=2,
        seeds=1,
        preset="tiny",
        eval_timeout_s=300.0,
        proposer="scripted-for-tests",
    )
    assert not pending_work(arch, arch.nodes("proxy/tiny"))  # nothing left half done
    check_reflections_logged_inside(arch, kids)
    assert git_status(arch) == "" and arch.fsck()


def test_the_work_tree_stays_clean_through_spawn_and_record(tmp_path):
    """init checks the root out detached; records move the branches only (evaluations: above)."""
    from results_util import record

    arch = Archive.init(tmp_path / "exp")
    assert git_status(arch) == ""
    arch.spawn("grpo", "kid", edit=HALF_STEP)
    assert git_status(arch) == ""
    record(arch, "grpo", {"overall": 0.5})
    record(arch, "kid", {"overall": 0.6})
    arch.set_status("kid", "evaluated")
    assert git_status(arch) == "" and arch.fsck()
    assert (arch.path / "algorithm.py").read_text() == arch.read_file(
        "grpo", "algorithm.py", arch.spawn_commit("grpo")
    )


def test_an_old_archive_gets_a_clean_work_tree_when_opened(tmp_path):
    """Archives made before the detached checkout had HEAD on poise/grpo: opening one detaches it at
    the commit that was checked out, leaving the files as they are."""
    from results_util import record

    arch = Archive.init(tmp_path / "exp")
    first = arch.tip("grpo")
    arch.git.run("symbolic-ref", "HEAD", "refs/heads/poise/grpo")  # the old layout
    record(arch, "grpo", {"overall": 0.5})
    assert git_status(arch) != ""  # the old symptom: the record shows as a staged change
    reopened = Archive(arch.path)
    assert git_status(reopened) == ""
    assert reopened.git.text("rev-parse", "HEAD").strip() == first


def _scaled_step(scale: str) -> str:
    return (
        _LOSS_SIGNATURE
        + f'    """GRPO\'s loss x{scale}."""\n'
        + _LOSS_BODY.format(scale=scale)
        + '    return loss, {"pg_loss": float(loss.detach())}\n'
    )


@register("three-ranked-for-tests")
class ThreeRankedProposer(ScriptedProposer):
    """Three distinct proposals; screening ranks them by their expected gain (all equally novel)."""

    def propose(self, archive, parent, context, cfg, n, seed):
        return [
            Proposal(
                name=f"step-x{scale}",
                motivation="a different step size",
                mechanism=f"GRPO loss x{scale}",
                expected_effect="another learning speed",
                edit=_scaled_step(scale),
                expected_gain=gain,
            )
            for scale, gain in (("0.5", 0.2), ("0.7", 0.9), ("0.9", 0.5))
        ][:n]


@pytest.mark.slow  # a real loop with one tiny evaluation
def test_implement_one_keeps_only_the_highest_ranked_of_n_proposals(tmp_path):
    """The paper's step: N proposals screened, the highest-ranked one implemented (--implement 1)."""
    arch = archive_with_root(tmp_path)
    events: list[dict] = []
    summary = run(
        arch, events.append, rounds=1, population=3, implement=1, proposer="three-ranked-for-tests"
    )
    assert list(children(arch)) == ["step-x0-7"], list(children(arch))
    assert summary.counts["evaluated"] == 1
    (plan,) = [e for e in events if e["kind"] == "plan"]
    assert (plan["population"], plan["children"]) == (3, 1)
    assert load_run(arch).data["plan"]["implement"] == 1
    assert arch.fsck()


def test_implement_is_bounded_by_the_population():
    from engine.errors import PoiseError

    assert RunPlan(population=4).children == 4  # 0: all N, the default
    assert RunPlan(population=4, implement=1).children == 1
    with pytest.raises(
        PoiseError, match="--implement must be between 0 .all. and --population .4."
    ):
        RunPlan(population=4, implement=5)


@pytest.mark.slow  # a real loop: proposing, verifying, then the tiny evaluation on resume
def test_a_failed_warm_start_stops_the_run_and_fails_no_candidate(tmp_path, monkeypatch):
    """The proxy's warm start is the engine's trusted set-up, not the candidate's code: when it fails,
    the run stops with one clear error and the candidate stays pending (not `failed`, which would
    cost it for good and every candidate after it), and `--resume` evaluates it once it works."""
    import shutil

    from engine.errors import EvaluationError
    from engine.operators import evaluate

    arch = archive_with_root(tmp_path)
    monkeypatch.setattr(evaluate, "_WARM", {})  # no warm start known to this process
    monkeypatch.setattr(evaluate, "_python", lambda: shutil.which("false"))  # exits 1
    with pytest.raises(EvaluationError, match=r"warm start failed.*`poise-git run --resume`"):
        run(arch, rounds=1, population=1)
    (kid,) = children(arch).values()
    assert kid.status == "verified" and not kid.results
    rec = load_run(arch)
    assert rec.data["status"] == "stopped" and "warm start failed" in rec.data["stop_reason"]
    assert pending_work(arch, arch.nodes("proxy/tiny")).evaluate == [kid.name]
    monkeypatch.undo()
    run(arch, resume=True, rounds=1, population=1)
    assert children(arch)[kid.name].status == "evaluated" and arch.fsck()


@pytest.mark.slow  # a real loop: proposing and verifying before the evaluation fails to start
def test_an_evaluation_that_cannot_start_stops_the_run_and_fails_no_candidate(
    tmp_path, monkeypatch
):
    """An error of the evaluation machinery itself (here: the interpreter it starts is missing) is
    not the candidate's: the run stops with one clear error, instead of carrying on and ending
    "finished" with the node silently pending, and nothing is recorded on the node."""
    from engine.errors import EvaluationError
    from engine.operators import evaluate

    arch = archive_with_root(tmp_path)
    monkeypatch.setattr(evaluate, "_WARM", {})
    monkeypatch.setattr(evaluate, "_python", lambda: str(tmp_path / "no-such-python"))
    with pytest.raises(EvaluationError, match=r"could not run \(FileNotFoundError.*--resume"):
        run(arch, rounds=1, population=1)
    (kid,) = children(arch).values()
    assert kid.status == "verified" and not kid.results
    assert load_run(arch).data["status"] == "stopped" and arch.fsck()


def test_an_unreachable_tracking_server_is_said_when_the_run_starts(tmp_path, monkeypatch):
    """The evaluations log in their own worker processes, whose lines the loop does not show: a
    dead tracking server went unmentioned for a whole run. The run says so when it starts."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    arch = archive_with_root(tmp_path)
    events: list[dict] = []
    summary = run(arch, events.append, budget=["candidates=0"], rounds=1, population=1)
    said = [e["msg"] for e in events if e["kind"] == "log"]
    assert any(f"MLflow tracking server {uri} is unreachable" in m for m in said), said
    assert summary.stop_reason.startswith("candidate budget exhausted"), summary.stop_reason
    assert arch.fsck()


@pytest.mark.slow  # a verification and an evaluation of the candidate (~11 s)
def test_proposals_paid_for_are_implemented_before_a_token_budget_stops(tmp_path, monkeypatch):
    """The token budget was checked again between the proposal call and its first candidate: the
    proposals just paid for were thrown away, and `--resume` asked (and paid) for them again, so a
    resume whose budget had room for less than a proposal and its candidate never made one. The
    candidates of a paid proposal call are made; the budget stops the run before the next call."""
    import openai_server
    from results_util import record

    edit = (
        "def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:\n"
        "    scores = batch.rewards.to(torch.float32)\n"
        "    stats = group_stats(scores, batch.group)\n"
        "    return scores - torch.where(stats.count < 2, torch.zeros_like(scores), stats.mean)\n"
    )
    reply = openai_server.proposal_reply("centred", edit)
    monkeypatch.setenv("POISE_BUDGET_KEY", "sk-test")
    with openai_server.ScriptedOpenAI(default=lambda _body: reply) as srv:
        toml = (
            '[propose]\nproposer = "llm"\npopulation = 1\n'
            f'[llm]\nbase_url = "{srv.base_url}"\napi_key_env = "POISE_BUDGET_KEY"\n'
        )
        arch = Archive.init(tmp_path / "exp", config_toml=toml)
        record(arch, "grpo", {"overall": 0.5}, preset="tiny")
        summary = run(arch, budget=["tokens=1"], rounds=2, population=1, proposer="llm")
        asked = sum(  # proposal calls (the reflection asks the LLM too)
            "\n## Parent node\n" in r["messages"][-1]["content"] for r in srv.requests
        )
    kids = children(arch)
    assert asked == 1, asked  # one proposal call; the budget stopped the run before a second
    assert [k.trailer("Poise-Proposer") for k in kids.values()] == ["llm"], kids
    assert all(k.status in FINAL for k in kids.values()), {n: k.status for n, k in kids.items()}
    assert summary.stop_reason.startswith("LLM-token budget exhausted"), summary.stop_reason
    assert not pending_work(arch, arch.nodes("proxy/tiny")) and arch.fsck()


@pytest.mark.slow  # the root's evaluation at the tiny preset: about 7 s
def test_the_roots_evaluation_carries_no_round_tag(tmp_path):
    """The root is evaluated before the first round: its MLflow run was tagged poise.round="None"
    (a round named None, matched by a filter on that string). It carries the run's tag and no round."""
    from engine.archive.tracking import find_runs

    arch = Archive.init(tmp_path / "exp")  # the root unevaluated: the run evaluates it first
    run(arch, budget=["candidates=0"], rounds=1, population=1)
    runs = find_runs(arch, "grpo")
    assert runs and arch.node("grpo").status == "evaluated"
    for r in runs:
        assert "poise.round" not in r.data.tags, r.data.tags
        assert r.data.tags["poise.run"] == load_run(arch).id


def test_a_run_removes_the_temporary_directories_a_killed_run_left(tmp_path, monkeypatch):
    """A run killed with SIGKILL leaves its sandbox directories in $TMPDIR (nothing runs to remove
    them); the next run removes them when it ends, and keeps one a live process holds."""
    import os
    import tempfile

    from conftest import scratch_left_by_a_killed_process

    from engine.scratch import IN_USE, SANDBOX_PREFIX, scratch_dir

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    left = scratch_left_by_a_killed_process(tmp)
    past = os.stat(left / IN_USE).st_mtime - 30  # killed a while before the next run ends
    os.utime(left / IN_USE, (past, past))
    arch = archive_with_root(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    events = []
    with scratch_dir(SANDBOX_PREFIX, dir=tmp) as held:
        os.utime(Path(held) / IN_USE, (past, past))
        run(arch, on_event=events.append, budget=["candidates=0"])
        assert Path(held).is_dir()
    assert not left.exists()
    assert any("removed 1 temporary" in e.get("msg", "") for e in events)


def test_a_resumed_run_keeps_the_held_out_confirmation_it_was_started_with(tmp_path):
    """`run --confirm-seeds M` confirms the best node after the loop; a run killed before (or
    during) that step and resumed with a bare `--resume` still owes it: M is in the run's plan."""
    arch = archive_with_root(tmp_path)
    first = run(arch, budget=["candidates=0"], confirm_seeds=2)
    assert first.confirm_seeds == 2
    assert load_run(arch).data["plan"]["confirm_seeds"] == 2
    again = run(arch, resume=True)  # no confirm_seeds given: the recorded plan's
    assert again.confirm_seeds == 2
    assert run(arch, resume=True, confirm_seeds=0).confirm_seeds == 0  # given again: overrides


@pytest.mark.slow  # a real spawn and verification: 10-60 s on 2 busy cores
def test_a_candidate_dropped_while_the_run_evaluates_it_is_skipped_not_the_runs_end(tmp_path):
    """`poise-git drop` beside a run may take a candidate the run is about to evaluate: its
    evaluation finds no node, and the run says so and goes on (before, it stopped with an error
    asking to fix what was never broken); the dropped node stays restorable, nothing recorded."""
    from engine.archive import cleanup

    arch = archive_with_root(tmp_path)
    events, dropped = [], []

    def on_event(e: dict) -> None:
        events.append(e)
        if (
            e.get("kind") == "stage"
            and e.get("stage") == "evaluate"
            and e.get("round")
            and not dropped
        ):
            dropped.append(e["node"])
            cleanup.drop(arch, [e["node"]])

    summary = run(arch, on_event=on_event, rounds=1, population=1)
    assert len(dropped) == 1 and dropped[0] not in arch.nodes()
    assert summary.stop_reason == "finished 1 round(s)"
    assert any(f"{dropped[0]} was dropped" in e.get("msg", "") for e in events)
    (gone,) = cleanup.dropped(arch)  # (the round may have filled its place with another)
    assert gone.name == dropped[0] and gone.status == "verified"
    assert arch.fsck()
