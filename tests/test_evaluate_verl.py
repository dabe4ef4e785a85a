"""The verl evaluation backend: says which recorded results it replaces, then refuses cleanly without
a GPU; finds verl's final HF checkpoint."""

from __future__ import annotations

import subprocess

import pytest
from conftest import node_lock_holder
from results_util import record_verl_outcome

from engine.errors import EvaluationError
from engine.operators.evaluate import evaluate_node
from engine.operators.evaluate_verl import final_checkpoint


def test_verl_backend_without_gpu_is_one_clear_error(archive, cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the refusal path does not apply")
    before = subprocess.run(
        ["git", "-C", str(archive.path), "for-each-ref"], capture_output=True, text=True
    ).stdout
    with pytest.raises(EvaluationError, match="needs a CUDA GPU"):
        evaluate_node(archive, "grpo", backend="verl")
    p = cli("evaluate", "grpo", "--backend", "verl", "-C", str(archive.path))
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        "error: the verl backend needs a CUDA GPU and none is visible here; use --backend proxy on the CPU"
    ]
    after = subprocess.run(
        ["git", "-C", str(archive.path), "for-each-ref"], capture_output=True, text=True
    ).stdout
    assert after == before and archive.node("grpo").status == "spawned"


def test_unknown_backend(archive):
    with pytest.raises(EvaluationError, match="unknown backend 'tpu'"):
        evaluate_node(archive, "grpo", backend="tpu")


def test_final_checkpoint_is_the_last_step_with_an_hf_copy(tmp_path):
    assert final_checkpoint(tmp_path) is None
    for step, hf in ((10, True), (20, True), (30, False)):
        d = tmp_path / f"global_step_{step}" / "actor" / "huggingface"
        d.mkdir(parents=True)
        if hf:
            (d / "config.json").write_text("{}")
    assert final_checkpoint(tmp_path) == tmp_path / "global_step_20" / "actor" / "huggingface"


def test_verl_evaluation_says_which_results_it_replaces_before_the_gpu_check(archive, cli):
    """Which result a verl evaluation replaces is known before training (docs/cli.md, evaluating a
    node again): the suite result under math6/paper, whichever the outcome (a scored checkpoint or
    a failed training, both recorded there); and a failure an earlier version recorded under
    verl/paper is removed once the outcome is recorded. Both are said before the GPU check, which
    leaves them as they were."""
    import torch

    from engine.operators.evaluate_suite import suite_protocol
    from engine.operators.evaluate_verl import SCORING, VERL_PAPER

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the refusal path does not apply")
    scored = suite_protocol(**SCORING)
    assert (scored.id, scored.settings["generator"]) == ("math6/paper", "vllm")
    record_verl_outcome(archive, scored, "evaluated")
    record_verl_outcome(archive, VERL_PAPER, "failed")
    before = archive.node("grpo")
    refs = subprocess.run(
        ["git", "-C", str(archive.path), "for-each-ref"], capture_output=True, text=True
    ).stdout
    lines = [
        f"replaces the evaluated result under {scored.key} (seeds 0) with this evaluation's "
        "outcome: the trained checkpoint's score, or the failure if training fails",
        "removes the failed result under verl/paper (no seeds), an earlier training's, once this "
        "evaluation's outcome is recorded",
    ]
    said: list[str] = []
    with pytest.raises(EvaluationError, match="needs a CUDA GPU"):
        evaluate_node(archive, "grpo", backend="verl", on_event=said.append)
    assert said == lines
    p = cli("evaluate", "grpo", "--backend", "verl", "-C", str(archive.path))
    assert p.returncode == 1, p.stdout + p.stderr
    told = [
        ln.strip() for ln in p.stdout.splitlines() if ln.strip().startswith(("replaces", "removes"))
    ]
    assert told == lines
    assert "needs a CUDA GPU" in p.stderr
    after = archive.node("grpo")
    assert after.results == before.results and after.status == before.status
    assert (
        subprocess.run(
            ["git", "-C", str(archive.path), "for-each-ref"], capture_output=True, text=True
        ).stdout
        == refs
    )
    assert archive.fsck()


def test_verl_evaluation_names_another_version_of_the_suite_protocol(archive):
    """A math6/paper result under other settings (another generator, a --limit) is another version
    of the protocol the verl scoring records under: replaced all the same, and said so."""
    import torch

    from engine.operators.evaluate_suite import suite_protocol

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the refusal path does not apply")
    other = suite_protocol("math6", generator="openai", limit=2)
    record_verl_outcome(archive, other, "evaluated")
    said: list[str] = []
    with pytest.raises(EvaluationError, match="needs a CUDA GPU"):
        evaluate_node(archive, "grpo", backend="verl", on_event=said.append)
    assert said == [
        f"replaces the evaluated result under {other.key} (seeds 0; another version of "
        "math6/paper) with this evaluation's outcome: the trained checkpoint's score, or the "
        "failure if training fails"
    ]
    assert archive.node("grpo").results["math6/paper"].protocol == other and archive.fsck()


def test_an_objective_math6_does_not_measure_is_refused_before_the_gpu_check(tmp_path, cli):
    """A verl evaluation scores its checkpoint on math6: an experiment ranking by a metric math6 does
    not record (a proxy metric) would train for hours and then be refused. It is refused first,
    before the GPU check, with the archive as it was."""
    from engine.archive.store import Archive
    from engine.config import DEFAULT_TOML

    toml = DEFAULT_TOML.replace('objective = "overall" ', 'objective = "hard/accuracy" ', 1)
    arch = Archive.init(tmp_path / "exp", config_toml=toml)
    refs = subprocess.run(
        ["git", "-C", str(arch.path), "for-each-ref"], capture_output=True, text=True
    ).stdout
    with pytest.raises(EvaluationError, match="ranks by 'hard/accuracy', which the math6 suite"):
        evaluate_node(arch, "grpo", backend="verl")
    p = cli("evaluate", "grpo", "--backend", "verl", "-C", str(arch.path))
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "ranks by 'hard/accuracy'" in lines[0], p.stderr
    assert "GPU" not in p.stdout + p.stderr
    after = subprocess.run(
        ["git", "-C", str(arch.path), "for-each-ref"], capture_output=True, text=True
    ).stdout
    assert after == refs and arch.node("grpo").status == "spawned" and arch.fsck()


def test_a_verl_evaluation_of_a_node_another_process_evaluates_stops_before_the_gpu_check(
    archive, cli
):
    """`evaluate --backend verl` takes the node's evaluation lock as the proxy's does, before the
    GPU check: a node another process is evaluating is one line naming it (not the GPU error), and
    nothing changes. Before, both evaluated it and the later result silently replaced the other."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the refusal path does not apply")
    tip = archive.node("grpo").commit
    holder = node_lock_holder(archive.path)
    try:
        with pytest.raises(EvaluationError, match="being evaluated by another process"):
            evaluate_node(archive, "grpo", backend="verl")
        p = cli("evaluate", "grpo", "--backend", "verl", "-C", str(archive.path))
    finally:
        holder.kill()
        holder.wait()
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert f"grpo is being evaluated by another process (pid {holder.pid}, since" in lines[0]
    assert "GPU" not in p.stdout + p.stderr
    assert archive.node("grpo").commit == tip and archive.fsck()
    # the lock is released with its holder: the GPU check comes again
    with pytest.raises(EvaluationError, match="needs a CUDA GPU"):
        evaluate_node(archive, "grpo", backend="verl")


def test_a_loop_worker_on_verl_waits_and_takes_the_result_the_other_processrecord_verl_outcome(
    archive,
):
    """A loop worker (``wait_for_other``) whose node a hand verl evaluation holds waits for it, then
    returns the math6/paper result that evaluation recorded (its own would be the same: hours of
    training saved) without training; when the other recorded nothing, it evaluates the node itself
    (here: the GPU check)."""
    import threading
    import time

    import torch

    from engine.operators.evaluate_suite import suite_protocol
    from engine.operators.evaluate_verl import SCORING

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the refusal path does not apply")

    def worker(got: dict) -> threading.Thread:
        def work() -> None:
            try:
                got["r"] = evaluate_node(
                    archive,
                    "grpo",
                    backend="verl",
                    wait_for_other=True,
                    on_wait=lambda what, detail: got.setdefault("told", []).append(what),
                )
            except Exception as exc:  # noqa: BLE001 - reported by the assertions below
                got["error"] = exc

        t = threading.Thread(target=work)
        t.start()
        return t

    for records in (True, False):
        got: dict = {}
        holder = node_lock_holder(archive.path)
        try:
            t = worker(got)
            time.sleep(0.5)
            assert t.is_alive() and "r" not in got and "error" not in got  # waiting
            if records:
                record_verl_outcome(
                    archive, suite_protocol(**SCORING), "evaluated"
                )  # the holder's result
            holder.stdin.write("\n")
            holder.stdin.flush()
            t.join(timeout=60)
            assert not t.is_alive()
        finally:
            holder.kill()
            holder.wait()
        if records:
            assert "error" not in got, got
            assert got["r"].metrics == {"overall": 41.5} and got["told"] == ["waiting", "used"]
        else:
            assert "needs a CUDA GPU" in str(got.get("error")), got
            assert got["told"] == ["waiting", "evaluating"]
    assert archive.fsck()


def test_a_scored_checkpoint_removes_the_failure_an_earlier_trainingrecord_verl_outcome(
    archive, cli
):
    """A node whose verl training failed once under an earlier version (verl/paper) and then
    succeeded (math6/paper) held both: `show` printed the failure and its reason beside the success
    under status evaluated. Once a checkpoint is scored, the old failure is removed (the step after
    the scoring, run here on the results it leaves: the scoring itself needs a GPU)."""
    from engine.operators.evaluate_suite import suite_protocol
    from engine.operators.evaluate_verl import SCORING, VERL_PAPER, _drop_stale_failure

    scored = suite_protocol(**SCORING)
    record_verl_outcome(archive, VERL_PAPER, "failed")
    record_verl_outcome(archive, scored, "evaluated")
    where = ("-C", str(archive.path))
    before = cli("show", "grpo", *where).stdout
    assert "verl training failed" in before  # the stale failure, shown as the node's
    assert archive.nodes("verl/paper")["grpo"].result.status == "failed"
    said: list[str] = []
    _drop_stale_failure(archive, "grpo", scored, said.append)
    assert said == [
        "removed the failed result under verl/paper (an earlier training's: verl training failed: "
        f"exit status 1): this evaluation's outcome is under {scored.key}"
    ]
    node = archive.node("grpo")
    assert list(node.results) == ["math6/paper"] and node.status == "evaluated"
    assert node.trailer("Poise-Reason") is None
    after = cli("show", "grpo", *where)
    assert after.returncode == 0 and "failed" not in after.stdout, after.stdout
    assert archive.nodes("verl/paper")["grpo"].result is None and archive.fsck()
    # nothing left to remove: nothing happens
    _drop_stale_failure(archive, "grpo", scored, said.append)
    assert len(said) == 1 and archive.node("grpo").commit == node.commit
