"""The GPU-scale evaluation of a node: verl training under the paper's protocol, then the math6 suite
with vLLM on the trained checkpoint (the same protocol the paper's Overall comes from).

Needs a CUDA machine with the ``verl`` and ``vllm`` extras; on a CPU machine it refuses with one line.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from engine.archive.results import EvaluationResult, now
from engine.archive.results import Protocol as ResultProtocol
from engine.archive.scoring import SCORING, suite_identity
from engine.errors import EvaluationError, PoiseError
from engine.operators.evaluate_suite import (
    evaluate_node_on_suite,
    require_suite_objective,
    suite_identity_protocol,
)
from engine.operators.evaluation_lock import evaluation_turn
from engine.operators.reevaluation import replaced_line, verl_replaced_lines
from engine.operators.verl_launch import node_launch
from engine.sandbox.process import run_limited, trusted_env
from trainer_template.loader import AlgorithmLoadError
from trainer_template.verl_backend.launch import VerlProtocol

VERL_PAPER = ResultProtocol("verl/paper", backend="verl", preset="paper")
"""where earlier versions recorded a failed training (no checkpoint to score). A verl evaluation now
records its outcome, scored or failed, under ``suite_protocol(**SCORING)`` (``SCORING``: how it
scores its checkpoint, :data:`engine.archive.scoring.SCORING`), the protocol a verl experiment
ranks under; a failure under verl/paper is still read and shown, and removed once a later verl
evaluation of the node records its outcome"""

# verl saves at the last step when save_freq > 0; a huge period means "only at the end". The HF copy is
# what vLLM loads for the evaluation.
_SAVE_OVERRIDES = (
    "trainer.save_freq=100000000",
    "actor_rollout_ref.actor.checkpoint.save_contents=['model','optimizer','extra','hf_model']",
)


def final_checkpoint(ckpt_dir: str | Path) -> Path | None:
    """The HF-format actor of the last ``global_step_N`` under verl's ``default_local_dir``, or None."""
    steps = []
    for d in Path(ckpt_dir).glob("global_step_*"):
        m = re.fullmatch(r"global_step_(\d+)", d.name)
        hf = d / "actor" / "huggingface"
        if m and (hf / "config.json").is_file():
            steps.append((int(m.group(1)), hf))
    return max(steps)[1] if steps else None


def evaluate_node_verl(
    archive,
    name: str,
    *,
    timeout_s: float,
    model: str | None = None,
    gpus: int | None = None,
    tags: Mapping[str, str] | None = None,
    on_event=None,
    wait_for_other: bool = False,
    on_wait: Callable[[str, str], None] | None = None,
):
    """Train ``name`` with verl, then score the checkpoint on math6 (vLLM); records like the proxy.
    Before anything runs (the GPU check included), an experiment objective math6 does not record is
    refused (:func:`~engine.operators.evaluate_suite.require_suite_objective`); then the node's
    evaluation lock is taken (:func:`~engine.operators.evaluation_lock.node_evaluation`, as the
    proxy's: held by another process, an EvaluationError at once, or with ``wait_for_other`` a wait,
    after which the result the other recorded is returned when it is this evaluation's, ``on_wait``
    told as by ``evaluate_node``); then ``on_event`` is told which recorded result the outcome
    replaces (:func:`~engine.operators.reevaluation.verl_replaced_lines`), told again when it is.
    Either outcome is recorded under the scoring protocol: the scored checkpoint (its details say
    what the training took), or the training's failure with its reason."""
    # the checkpoint is scored on math6: an objective it does not record is refused before training
    ident = suite_identity(**SCORING)
    require_suite_objective(archive.config(), ident)
    scored = suite_identity_protocol(ident)
    seeds = (scored.settings["seed"],)
    with evaluation_turn(
        archive, name, scored, seeds, wait=wait_for_other, on_wait=on_wait
    ) as done:
        if done is not None:
            return done
        return _train_and_score(archive, name, scored, timeout_s, model, gpus, tags, on_event)


def _train_and_score(archive, name, scored, timeout_s, model, gpus, tags, on_event):
    """:func:`evaluate_node_verl` once the node's evaluation lock is held."""
    say = on_event or (lambda _m: None)
    results = archive.node(name).results
    for line in verl_replaced_lines(results, scored, (scored.settings["seed"],), VERL_PAPER):
        say(line)
    try:
        import torch  # lazy: torch is heavy (only this path needs it)

        n_visible = torch.cuda.device_count()
    except Exception:  # pragma: no cover - torch is a core dependency
        n_visible = 0
    if n_visible == 0:
        raise EvaluationError(
            "the verl backend needs a CUDA GPU and none is visible here; use --backend proxy on the CPU"
        )

    proto = VerlProtocol(
        **{k: v for k, v in {"model": model, "n_gpus": gpus or n_visible}.items() if v}
    )
    prior = archive.node(name).status
    try:
        launch = node_launch(archive, name, protocol=proto, extra=_SAVE_OVERRIDES, tags=tags)
    except AlgorithmLoadError as exc:  # its settings could not be read: one line, no run opened
        raise EvaluationError(str(exc)) from None
    archive.set_status(name, "evaluating")
    t0 = time.monotonic()
    say(
        f"{name}: verl training ({proto.model}, {proto.n_gpus} GPU(s)), MLflow run {launch.env['MLFLOW_RUN_ID']}"
    )

    res = run_limited(launch.cmd, timeout_s=timeout_s, env=trusted_env(launch.env))
    run_id, wall_s = launch.env["MLFLOW_RUN_ID"], round(time.monotonic() - t0, 3)
    training = {"gpus": proto.n_gpus, "wall_time_s": wall_s, "mlflow_run_id": run_id}
    ckpt = final_checkpoint(launch.files["ckpt"]) if res.ok else None
    if ckpt is None:
        reason = (
            f"verl training failed: {res.reason()}"
            if not res.ok
            else "verl training saved no HF checkpoint"
        )
        return _record_training_failure(archive, name, scored, reason, training, say)
    say(f"{name}: scoring {ckpt} on math6 with vLLM")
    try:
        result = evaluate_node_on_suite(
            archive, name, **SCORING, model=str(ckpt), on_event=say, lock=False, training=training
        )
    except PoiseError:
        archive.set_status(name, prior)
        raise
    _drop_stale_failure(archive, name, scored, say)
    return result


def _record_training_failure(
    archive, name: str, scored, reason: str, training: Mapping, say
) -> EvaluationResult:
    """Record the node's failed verl training under ``scored``, the protocol its checkpoint would
    have been scored under (the one a verl experiment ranks under): the node's verl outcome, with
    its reason and what the ``training`` took (``gpus``, ``wall_time_s``, ``mlflow_run_id``,
    measured around the training process)."""
    node = archive.node(name)
    seeds = (scored.settings["seed"],)
    replaced = replaced_line(node.results.get(scored.id), scored.hash, seeds)
    if replaced:
        say(replaced)
    result = EvaluationResult(
        protocol=scored,
        status="failed",
        reason=reason,
        seeds=seeds,
        utility=archive.config().experiment.objective,
        mlflow_run_ids=(training["mlflow_run_id"],),
        wall_time_s=training["wall_time_s"],
        node_commit=node.commit,
        recorded_at=now(),
        details={"training": dict(training)},
    )
    _drop_stale_failure(archive, name, scored, say)  # first: its Poise-Reason may read as this one
    archive.record_result(name, result)
    return result


def _drop_stale_failure(archive, name: str, scored, say) -> None:
    """A node whose verl evaluation has now recorded its outcome under ``scored`` no longer holds
    the failure an earlier version recorded under verl/paper: ``show`` and ``log`` would present it
    beside the node's current outcome."""
    old = archive.node(name).results.get(VERL_PAPER.id)
    if old is None or old.ok:
        return
    archive.drop_result(name, VERL_PAPER.id, f"a later verl evaluation recorded under {scored.id}")
    say(
        f"removed the failed result under {VERL_PAPER.id} (an earlier training's: "
        f"{' '.join(old.reason.split())[:120]}): this evaluation's outcome is under {scored.key}"
    )
