"""Reflection: computed diagnostics from a trajectory and metrics vs the parent, an LLM narrative via the
OpenAI-protocol server, REFLECTION.md committed, and the text logged to the node's MLflow run."""

from __future__ import annotations

import openai_server  # tests/openai_server.py (tests/ is on pythonpath)
import pytest
from results_util import per_seed_rows, proxy_result, record

from engine.config import LLMConfig
from engine.errors import PoiseError
from engine.operators.llm import LLMClient
from engine.operators.reflect import (
    compare_trajectories,
    metric_diagnostics,
    reflect_node,
    trajectory_diagnostics,
)

STEPS = list(range(0, 100, 10))
HEALTHY = {
    "step": STEPS,
    "train/entropy": [1.0 - 0.03 * i for i in range(10)],
    "train/kl": [0.01] * 10,
    "train/reward_mean": [0.1 + 0.05 * i for i in range(10)],
    "train/response_length": [200 + i for i in range(10)],
    "train/valid_rate": [0.9] * 10,
}
SICK = {
    "step": STEPS,
    "train/entropy": [1.0, 0.8, 0.5, 0.3, 0.2, 0.1, 0.08, 0.05, 0.05, 0.04],
    "train/kl": [0.01, 0.01, 0.012, 0.011, 0.4, 0.01, 0.012, 0.01, 0.011, 0.01],
    "train/reward_mean": [0.1, 0.3, 0.4, 0.45, 0.46, 0.46, 0.46, 0.46, 0.465, 0.46],
    "train/response_length": [200, 230, 260, 300, 340, 380, 400, 420, 430, 440],
    "train/valid_rate": [0.95, 0.9, 0.85, 0.8, 0.78, 0.76, 0.75, 0.74, 0.73, 0.72],
}


def trajectory_vs_parent(traj, parent_traj, tails=None, parent_tails=None):
    """(findings, table rows) of the comparison, as the reflection writes them."""
    c = compare_trajectories(traj, parent_traj, tails, parent_tails)
    return c.findings(), list(c.rows)


def results(overall, lo, hi, traj, valid=0.9, length=200.0, run_ids=()):
    return {
        "status": "evaluated",
        "metrics": {"overall": overall, "valid_rate": valid, "mean_length": length},
        "intervals": {"overall": [lo, hi]},
        "trajectory": traj,
        "mlflow_run_ids": list(run_ids),
    }


def test_trajectory_diagnostics():
    assert trajectory_diagnostics(HEALTHY) == []
    found = "\n".join(trajectory_diagnostics(SICK))
    for what in (
        "entropy collapse",
        "KL spike: 0.4 at step 40",
        "reward plateau",
        "length drift",
        "valid-rate change",
    ):
        assert what in found, found


def test_one_dip_in_entropy_is_no_collapse_a_sustained_fall_is():
    """The collapse rule reads the last third's mean entropy: a single low step between steps near
    the start read as a collapse when it took the last third's lowest step."""
    steps = list(range(9))
    dip = {"step": steps, "train/entropy": [1, 1, 1, 1, 1, 1, 1, 0.2, 1]}
    assert trajectory_diagnostics(dip) == []
    fell = {"step": steps, "train/entropy": [1, 0.8, 0.6, 0.4, 0.3, 0.25, 0.2, 0.2, 0.2]}
    (finding,) = trajectory_diagnostics(fell)
    assert finding == "entropy collapse: policy entropy fell from 1 to 0.2 (20% of its start)"


def test_one_noisy_step_is_no_drift_and_a_fall_then_flat_is_a_decline():
    """Length, reward and valid rate are read by the means of their thirds: a last step of 140
    after five near 100 read as a length drift of x1.40, and a reward that fell at once and then
    stayed flat read as a plateau, not a decline."""
    steps = list(range(6))
    noisy = {"step": steps, "train/response_length": [100, 101, 99, 100, 102, 140]}
    assert trajectory_diagnostics(noisy) == []
    fell = {"step": steps, "train/reward_mean": [0.5, 0.1, 0.1, 0.1, 0.1, 0.1]}
    (finding,) = trajectory_diagnostics(fell)
    assert finding.startswith("reward decline: reward_mean fell 0.3 -> 0.1")
    blip = {"step": steps, "train/valid_rate": [0.9, 0.9, 0.9, 0.9, 0.9, 0.82]}
    assert trajectory_diagnostics(blip) == []
    drift = {"step": steps, "train/response_length": [100, 110, 120, 130, 140, 150]}
    assert trajectory_diagnostics(drift) == [
        "length drift: mean response length 105 -> 145 tokens (x1.38, first to last third)"
    ]


def test_trajectory_vs_parent_says_what_the_child_changed():
    """An entropy collapse fires on a parent and its child alike; against the parent's trajectory
    the reflection says which of them collapsed further, and by how much, over the last third."""
    assert trajectory_diagnostics(SICK) and trajectory_diagnostics(HEALTHY) == []
    # the child keeps twice the entropy of a collapsing parent: still an absolute collapse
    kid = {**SICK, "train/entropy": [2 * v for v in SICK["train/entropy"]]}
    assert any("entropy collapse" in f for f in trajectory_diagnostics(kid))
    found, rows = trajectory_vs_parent(kid, SICK)
    assert found == [
        "vs parent: kept more entropy (policy entropy x2.00 over the last third of training: "
        "0.055 -> 0.11)"
    ]
    assert ("policy entropy", pytest.approx(0.11), pytest.approx(0.055), "x2.00", None, 0) in rows
    assert {r[0] for r in rows} == {
        "policy entropy",
        "KL to the reference",
        "response length",
        "valid rate",
        "reward",
    }  # no clip fraction recorded: no row
    assert all(r[3] in ("x1.00", "+0") for r in rows if r[0] != "policy entropy")
    # every series moved, each beyond what its finding needs, both ways
    found, _ = trajectory_vs_parent(SICK, HEALTHY)
    text = "\n".join(found)
    for what in (
        "lost more entropy (policy entropy x0.07 over the last third of training: 0.775 -> 0.055)",
        "longer (response length x2.04",
        "fewer valid (valid rate -0.165",
    ):
        assert what in text, text
    assert "reward" not in text and len(found) == 3  # -0.014 is below the 0.02 a finding needs
    assert trajectory_vs_parent(SICK, SICK)[0] == []
    assert trajectory_vs_parent({}, SICK) == ([], [])  # nothing recorded: nothing compared


def tails(entropy: list[float], reward: float = 0.46) -> dict[int, dict[str, float]]:
    """Per-seed tail means, as an evaluation records them: seed -> {series: mean}."""
    return {s: {"train/entropy": e, "train/reward_mean": reward} for s, e in enumerate(entropy)}


def test_trajectory_vs_parent_pairs_the_seeds():
    """With per-seed tails for both, a change is compared seed by seed: a finding needs its size
    and a paired difference beyond its 95% interval; the table carries that interval."""
    parent = tails([0.05, 0.06, 0.055, 0.05])
    steady = tails([0.10, 0.12, 0.11, 0.10])  # twice the entropy at every seed
    found, rows = trajectory_vs_parent(SICK, SICK, steady, parent)
    assert len(found) == 1 and found[0].startswith(
        "vs parent: kept more entropy (policy entropy x2.00 over the last third of training: "
        "0.0537 -> 0.107; paired difference +0.0537 ["
    ), found
    assert found[0].endswith("] over 4 seeds)")
    c = compare_trajectories(SICK, SICK, steady, parent)
    assert (c.verdict("train/entropy"), c.verdict("train/reward_mean")) == ("up", "alike")
    assert c.verdict("train/clipfrac") is None  # not recorded: not compared
    ent = next(r for r in rows if r[0] == "policy entropy")
    assert ent[1:4] == (pytest.approx(0.1075), pytest.approx(0.05375), "x2.00")
    assert ent[5] == 4 and 0 < ent[4][0] < 0.05375 < ent[4][1]
    # the reward is compared at the seeds too: no change, an interval of zero width, no finding
    assert next(r for r in rows if r[0] == "reward")[3:] == ("+0", (0.0, 0.0), 4)
    # the same x2 on average, from one seed that rose sharply while the others fell: no finding
    erratic = tails([0.29, 0.03, 0.04, 0.07])
    found, rows = trajectory_vs_parent(SICK, SICK, erratic, parent)
    ent = next(r for r in rows if r[0] == "policy entropy")
    assert ent[3] == "x2.00" and ent[4][0] < 0 < ent[4][1] and found == []  # nor "like it"
    assert compare_trajectories(SICK, SICK, erratic, parent).verdict("train/entropy") == "unclear"
    # close on the two series the tails hold, but the others read without an interval: no claim
    assert trajectory_vs_parent(SICK, SICK, tails([0.05] * 4), parent)[0] == []
    # every series within a finding's size of the parent's, interval and all: trained like it
    rest = {"train/kl": 0.01, "train/response_length": 422.5, "train/valid_rate": 0.735}
    close = {s: {**t, **rest} for s, t in tails([0.051, 0.061, 0.054, 0.052]).items()}
    found, _ = trajectory_vs_parent(
        SICK, SICK, close, {s: {**t, **rest} for s, t in parent.items()}
    )
    assert found == [
        "vs parent: trained like its parent (each series' paired difference lies, with its 95% "
        "interval, within a finding's size, over 4 paired seeds): a metric's difference is the "
        "training noise of two runs unless beyond that metric's interval"
    ]
    # 10% more entropy at every seed: beyond the interval, below the x1.2 a finding needs
    more = {s: {**t, **rest} for s, t in tails([0.055, 0.066, 0.0605, 0.055]).items()}
    found, _ = trajectory_vs_parent(SICK, SICK, more, {s: {**t, **rest} for s, t in parent.items()})
    assert len(found) == 1 and found[0].startswith(
        "vs parent: changed training slightly but consistently, below a finding's size "
        "(policy entropy x1.10, paired difference +0.00537 [+0."
    ), found
    assert found[0].endswith("; over 4 paired seeds)")
    par = {s: {**t, **rest} for s, t in parent.items()}
    assert compare_trajectories(SICK, SICK, more, par).verdict("train/entropy") == "up"
    # 2% more at every seed: consistent, but under a quarter of a finding's size: still alike
    tiny = {s: {**t, **rest} for s, t in tails([0.051, 0.0612, 0.0561, 0.051]).items()}
    found, _ = trajectory_vs_parent(SICK, SICK, tiny, {s: {**t, **rest} for s, t in parent.items()})
    assert len(found) == 1 and found[0].startswith("vs parent: trained like its parent"), found
    assert compare_trajectories(SICK, SICK, tiny, par).verdict("train/entropy") == "alike"
    # series the tails lack, or one shared seed, fall back to the mean trajectories' reading
    _, rows = trajectory_vs_parent(
        SICK, HEALTHY, {0: {"train/entropy": 0.1}}, {0: {"train/entropy": 0.2}}
    )
    assert all(r[4] is None and r[5] == 0 for r in rows)
    # read without an interval, a finding's size is a finding, but no series gets a verdict
    c = compare_trajectories(
        SICK, HEALTHY, {0: {"train/entropy": 0.1}}, {0: {"train/entropy": 0.2}}
    )
    assert c.large and c.verdict("train/entropy") == c.verdict("train/reward_mean") == "unclear"
    assert next(r for r in rows if r[0] == "policy entropy")[1] == pytest.approx(0.055)


def test_metric_diagnostics_intervals():
    findings, rows = metric_diagnostics(
        proxy_result(results(0.60, 0.57, 0.63, {})), proxy_result(results(0.50, 0.47, 0.53, {}))
    )
    assert any("overall 0.5 -> 0.6" in f and "beyond" in f for f in findings)
    assert ("overall", 0.60, 0.50, pytest.approx(0.10), True) in rows
    findings, _ = metric_diagnostics(
        proxy_result(results(0.51, 0.47, 0.55, {})), proxy_result(results(0.50, 0.46, 0.54, {}))
    )
    assert findings[0] == "no metric moved beyond its 95% interval"
    # a parent measured under another protocol (the smoke preset) is not compared with
    findings, _ = metric_diagnostics(
        proxy_result(results(0.61, 0.58, 0.64, {})),
        proxy_result(results(0.50, 0.47, 0.53, {}), preset="smoke"),
    )
    assert "not compared" in findings[0] and "proxy/smoke" in findings[0]


def test_reflect_command_commits_reflection(archive, cli):
    record(archive, "grpo", results(0.50, 0.47, 0.53, HEALTHY))
    archive.spawn("grpo", "kid", proposal="# kid\n")
    record(archive, "kid", results(0.40, 0.37, 0.43, SICK, valid=0.72, length=440.0))
    r = cli("reflect", "kid", "--no-llm", "-C", str(archive.path))
    assert r.returncode == 0, r.stderr
    text = archive.read_file("kid", "REFLECTION.md")
    assert (
        "entropy collapse" in text and "overall 0.5 -> 0.4" in text and "mean length x2.20" in text
    )
    # the trajectory against the parent's: a table and what the child changed
    assert "## Training trajectory vs parent grpo" in text
    assert "| policy entropy | 0.055 | 0.775 | x0.07 |" in text
    assert "- vs parent: lost more entropy (policy entropy x0.07" in text
    assert archive.node("kid").trailer("Poise-Event") == "reflection"
    r = cli("reflect", "grpo", "--no-llm", "-C", str(archive.path))
    assert r.returncode == 0 and "no evaluated parent" in archive.read_file("grpo", "REFLECTION.md")
    archive.spawn("grpo", "fresh")
    r = cli("reflect", "fresh", "-C", str(archive.path))
    assert r.returncode == 1 and "evaluate it first" in r.stderr and "Traceback" not in r.stderr
    assert archive.fsck()


def test_reflection_table_carries_the_paired_intervals(archive):
    """Results that carry per-seed tails (as evaluations now record them) get a table of paired
    differences with their intervals, and findings only where the seeds agree."""

    def with_seeds(overall, traj, entropy):
        tails = [{"train/entropy": e, "train/reward_mean": 0.46} for e in entropy]
        rows = per_seed_rows([overall] * len(entropy), tails)
        return {
            **results(overall, overall - 0.03, overall + 0.03, traj),
            "per_seed": rows,
            "seeds": list(range(len(entropy))),
        }

    record(archive, "grpo", with_seeds(0.50, SICK, [0.05, 0.06, 0.055, 0.05]))
    archive.spawn("grpo", "kid", proposal="# kid\n")
    record(archive, "kid", with_seeds(0.51, SICK, [0.10, 0.12, 0.11, 0.10]))
    text = reflect_node(archive, "kid", archive.config())
    assert "at each of 4 paired seeds, with the 95% interval of the paired difference" in text
    assert "| policy entropy | 0.1075 | 0.05375 | x2.00 | +0.0537 [+0.0" in text
    assert "| response length | 422.5 | 422.5 | x1.00 | — |" in text  # not in the tails: read
    assert "- vs parent: kept more entropy (policy entropy x2.00" in text
    assert "over 4 seeds)" in text


@pytest.mark.slow
def test_llm_narrative_and_mlflow(archive, monkeypatch, tmp_path):
    from engine.archive.tracking import find_runs, node_run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("POISE_TEST_KEY", "sk-test")
    record(archive, "grpo", results(0.50, 0.47, 0.53, HEALTHY))
    archive.spawn("grpo", "kid", "def helper_scale():\n    return 2.0\n", proposal="# kid\n")
    with node_run(archive, "kid") as run:
        run_id = run.info.run_id
    record(archive, "kid", results(0.40, 0.37, 0.43, SICK, run_ids=[run_id]))
    S = openai_server
    with S.ScriptedOpenAI(
        ["The helper doubles the scale, which sharpens updates and collapses entropy."]
    ) as srv:
        llm = LLMClient(LLMConfig(base_url=srv.base_url, api_key_env="POISE_TEST_KEY"), archive)
        text = reflect_node(archive, "kid", archive.config(), llm=llm)
    assert "## Mechanism-level analysis" in text and "collapses entropy" in text
    prompt = srv.requests[0]["messages"][1]["content"]
    assert (
        "entropy collapse" in prompt and "helper_scale" in prompt
    )  # diagnostics and the diff went to the model
    assert llm.usage_by_node["kid"].calls == 1
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    assert [a.path for a in client.list_artifacts(run_id)] == ["REFLECTION.md"]
    assert find_runs(archive, "kid")[0].data.tags["poise.reflected"] == "yes"


def test_rejected_node_reflection(archive):
    archive.spawn("grpo", "bad")
    archive.set_status("bad", "rejected", "static check: import of 'os' is not allowed")
    assert "import of 'os'" in reflect_node(archive, "bad", archive.config())
    with pytest.raises(PoiseError):
        reflect_node(archive, "grpo", archive.config())


def test_kl_spike_names_the_step_it_was_recorded_at():
    """A series with a missing entry (a step no seed recorded) keeps each number at its own step."""
    traj = {
        "step": [0, 10, 20, 30, 40, 50],
        "train/kl": [None, 0.01, 0.012, 0.011, 0.01, 0.5],
    }
    assert "KL spike: 0.5 at step 50 (median 0.011)" in trajectory_diagnostics(traj)


def test_reflection_of_a_failed_node_says_it_failed(archive):
    """A failed evaluation is no measurement: its reflection says why it failed, not that its
    metrics did not move or that the parent's protocol differs."""
    record(archive, "grpo", results(0.50, 0.47, 0.53, HEALTHY))
    archive.spawn("grpo", "kid", proposal="# kid\n")
    record(
        archive,
        "kid",
        {
            "status": "failed",
            "reason": "training diverged: NaN loss",
            "metrics": {},
            **{"trajectory": SICK},
        },
    )
    text = reflect_node(archive, "kid", archive.config())
    assert "- evaluation under proxy/default@" in text and "failed: training diverged" in text
    assert "not compared" not in text and "no metric moved" not in text, text
    assert "## Metrics vs parent" not in text and "entropy collapse" in text


def test_reflection_names_a_parent_measured_only_elsewhere_or_failed(archive):
    """A parent measured under another protocol id is named as such (not 'no evaluated parent'),
    and one whose evaluation failed is named as failed; neither is compared with."""
    record(archive, "grpo", results(0.50, 0.47, 0.53, HEALTHY))
    archive.spawn("grpo", "kid", proposal="# kid\n")
    record(archive, "kid", results(0.40, 0.37, 0.43, SICK), preset="smoke")
    text = reflect_node(archive, "kid", archive.config())
    assert "- the parent was evaluated under proxy/default@" in text, text
    assert "not proxy/smoke@" in text and "## Training trajectory vs parent" not in text
    archive.spawn("grpo", "bad", proposal="# bad\n")
    record(archive, "bad", {"status": "failed", "reason": "timed out", "metrics": {}})
    archive.spawn("bad", "kid2", proposal="# kid2\n")
    record(archive, "kid2", results(0.40, 0.37, 0.43, SICK))
    text = reflect_node(archive, "kid2", archive.config())
    assert "- the parent's evaluation under proxy/default@" in text and "(timed out)" in text


def test_a_negative_kl_estimate_is_no_ratio_to_the_parents():
    """The harness's KL is the mean log-ratio (k1), negative on some batches: a negative tail over
    a positive one is no 'x-1.00, stayed closer to the reference'."""
    c = compare_trajectories({"train/kl": [0.01, -0.02, -0.02, -0.02]}, {"train/kl": [0.01] * 4})
    assert c.large == () and c.findings() == [] and c.verdict("train/kl") is None
    c = compare_trajectories({"train/kl": [0.01, 0.0, 0.0, 0.0]}, {"train/kl": [0.04] * 4})
    assert c.large == (("stayed closer to the reference", c.large[0][1]),)


def test_a_trajectory_edited_into_no_series_is_read_as_none(archive):
    """A results file edited by hand whose trajectory holds a number where a series belongs: the
    reflection reads that series as not recorded instead of stopping with a TypeError."""
    bad = {"step": 3, "train/kl": 0.5, "train/entropy": [1.0, 0.5, 0.1, 0.05]}
    assert trajectory_diagnostics(bad)[0].startswith("entropy collapse")
    assert [r[0] for r in compare_trajectories(bad, bad).rows] == ["policy entropy"]
    record(archive, "grpo", results(0.50, 0.47, 0.53, HEALTHY))
    archive.spawn("grpo", "kid", proposal="# kid\n")
    record(archive, "kid", results(0.40, 0.37, 0.43, bad))
    assert "entropy collapse" in reflect_node(archive, "kid", archive.config())


def test_a_reflection_with_an_unreachable_tracking_server_is_recorded_without_error(
    archive, monkeypatch
):
    """The reflection is attached to the node's MLflow runs after it is committed; a tracking
    server that does not answer (now refused within seconds) must not turn the committed reflection
    into an error for `poise-git reflect` or 'reflection failed' in the loop."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    record(archive, "grpo", results(0.50, 0.47, 0.53, HEALTHY))
    archive.spawn("grpo", "kid", proposal="# kid\n")
    record(archive, "kid", results(0.40, 0.37, 0.43, SICK, run_ids=["0123abcd"]))
    text = reflect_node(archive, "kid", archive.config())
    assert "entropy collapse" in text
    assert archive.read_file("kid", "REFLECTION.md") == text
    assert archive.fsck()


def test_a_tracking_server_that_died_after_its_probe_costs_the_reflection_one_try(
    archive, monkeypatch, caplog
):
    """A server that answered the probe and died before the reflection was attached: the first
    failed call probes again, the dead server is said once, and the other runs are not tried (each
    try is MLflow's retries: seconds each, for every seed's run)."""
    import logging
    import socket
    import time

    from engine.archive import tracking

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for name, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0"),) + tuple(
        (n, v) for n, v in tracking.HTTP_BOUNDS.items() if n != "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(tracking._probed, uri, (time.monotonic(), ""))  # it answered, then died
    monkeypatch.setattr(tracking, "PROBE_TTL_S", 3600.0)
    record(archive, "grpo", results(0.50, 0.47, 0.53, HEALTHY))
    archive.spawn("grpo", "kid", proposal="# kid\n")
    record(archive, "kid", results(0.40, 0.37, 0.43, SICK, run_ids=["0123abcd", "4567ef", "89ab"]))
    with caplog.at_level(logging.WARNING, logger="engine.operators.reflect"):
        text = reflect_node(archive, "kid", archive.config())
    warned = [r.getMessage() for r in caplog.records if "MLflow" in r.getMessage()]
    assert len(warned) == 1 and f"MLflow tracking server {uri} is unreachable" in warned[0], warned
    assert archive.read_file("kid", "REFLECTION.md") == text
    assert archive.fsck()
