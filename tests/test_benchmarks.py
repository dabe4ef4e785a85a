"""The proxy benchmarks run end to end, as their one command each, on the tests-only ``tiny`` preset:
real worker processes, real sandbox limits, a per-seed cache in tmp_path. Their figures at this
preset mean nothing; what is checked is that every figure is printed and written, also where a
single seed gives no interval."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.archive.store import Archive

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # each runs several tiny RL seeds in worker processes


def _bench(script: str, args: list[str], tmp_path: Path) -> str:
    env = {**os.environ, "POISE_EVAL_CACHE": str(tmp_path / "cache")}
    env["POISE_CACHE_DIR"] = str(tmp_path / "warmstarts")  # a variant's own warm start goes here
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def _worker_grpo_overall(tmp_path: Path, seed: int) -> float:
    """GRPO's Overall at ``seed`` on the tiny preset through the proxy worker's own ``run``: what a
    result records, for the benchmarks that train in process to be checked against."""
    from engine.archive.edit import prior_source

    algo = tmp_path / "grpo.py"
    algo.write_text(prior_source("grpo"))
    res = tmp_path / "run.json"
    cmd = [sys.executable, "-m", "trainer_template.proxy.worker", "run", "--preset", "tiny"]
    cmd += ["--algorithm", str(algo), "--seed", str(seed), "--out", str(res)]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=600)
    return json.loads(res.read_text())["metrics"]["overall"]


def test_bench_proxy_prints_every_figure_with_one_seed(tmp_path):
    out = _bench(
        "bench_proxy.py",
        ["--preset", "tiny", "--seeds", "1", "--noise-seeds", "2", "--only", "grpo,dr_grpo"]
        + ["--parallel", "2", "--json", str(tmp_path / "proxy.json")],
        tmp_path,
    )
    for figure in ("\n1. one seed", "\n2. regressions", "\n3. paired-seed noise", "\n4. published"):
        assert figure in out
    assert "peak RSS" in out and "minimum detectable difference at 6 paired seeds" in out
    # one seed has no interval: printed as "-", not a crash
    assert "warm start alone (no RL): overall" in out and "| grpo |" in out
    assert " -; GRPO's paired gain over it" in out and "| grpo | 0." in out
    runs = json.loads((tmp_path / "proxy.json").read_text())
    labels = {(r["label"], r["seed"]) for r in runs}
    assert {
        ("grpo", 0),
        ("grpo", 1),
        ("dr_grpo", 1),
        ("sign_flip", 0),
        ("invalid_sign", 0),
    } <= labels


def test_bench_calibration_writes_its_table_and_reuses_the_cache(tmp_path):
    args = ["--preset", "tiny", "--seeds", "2", "--only", "sa_grpo,dace_grpo", "--parallel", "2"]
    out = _bench("bench_calibration.py", args + ["--json", str(tmp_path / "a.json")], tmp_path)
    assert "Spearman rank correlation" in out and "(6 run, 0 cached)" in out
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["preset"] == "tiny" and data["protocol_hash"].startswith("sha256:")
    assert data["seeds"] == [0, 1] and data["unit"].startswith("Overall")
    assert {r["mechanism"] for r in data["rows"] if "overall" in r} == {
        "grpo",
        "sa_grpo",
        "dace_grpo",
    }
    grpo = next(r for r in data["rows"] if r["mechanism"] == "grpo")
    assert grpo["diff_vs_grpo"] == 0.0 and grpo["verdict"] == "reference"
    # the table and each seed run name the machine that measured them
    import torch

    assert data["machine"]["torch"] == torch.__version__ and data["machine"]["cores"] >= 1
    assert data["rows_measured_on"] == [data["machine"]]
    runs = [r for by_seed in data["per_seed"].values() for r in by_seed.values()]
    assert len(runs) == 6 and all(r["machine"] == data["machine"] for r in runs)
    # the same command again trains nothing: every seed run comes from the cache, same numbers,
    # and the machine the cached runs were measured on
    again = _bench("bench_calibration.py", args + ["--json", str(tmp_path / "b.json")], tmp_path)
    assert "(0 run, 6 cached)" in again
    cached = json.loads((tmp_path / "b.json").read_text())
    assert cached["rows"] == data["rows"] and cached["machine"] == data["machine"]
    assert cached["per_seed"] == data["per_seed"]


def test_bench_discovery_runs_both_searches_resumes_and_confirms_on_held_out_seeds(tmp_path):
    work, out, fig = tmp_path / "work", tmp_path / "d.json", tmp_path / "d.png"
    # one candidate per search: every stage (search, resume, held-out confirmation) still runs
    args = ["--preset", "tiny", "--candidates", "1", "--seeds", "2", "--search-seeds", "1"]
    args += ["--workdir", str(work), "--json", str(out), "--figure", str(fig)]
    # an ablation of the proposer's diagnosis: the loop's archive carries it in its poise.toml
    args += ["--remedies", "entropy_control,entropy", "--directed", "0.8", "--learned", "0.3"]
    args += ["--explore", "--min-gain", "0.004", "--remedy-trials", "3"]
    text = _bench("bench_discovery.py", args, tmp_path)
    assert "| loop | 0 |" in text and "| random | 0 |" in text
    propose = Archive(work / "loop-s0").config().propose
    assert propose.remedies == ("entropy_control", "entropy") and propose.directed == 0.8
    assert propose.learned == 0.3 and propose.explore and propose.min_gain == 0.004
    assert propose.remedy_trials == 3
    data = json.loads(out.read_text())
    assert data["protocol_hash"].startswith("sha256:") and data["unit"].startswith("Overall")
    for method in ("loop", "random"):
        search = data["results"][method]["0"]
        assert len(search["candidates"]) == 1
        assert all(c["status"] in ("evaluated", "failed") for c in search["candidates"])
        curve = search["curve"]  # best Overall so far, starting from the root's
        assert curve == sorted(curve) and min(curve) >= search["root_overall"]
        assert data["summary"][method]["search_seeds"] == 1
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second invocation reads the finished searches instead of running them again
    again = _bench("bench_discovery.py", args, tmp_path)
    assert again.count("finished earlier") == 2
    assert json.loads(out.read_text())["results"] == data["results"]
    # the searches drawn together, with their table; a search under another protocol is refused
    plot, other = tmp_path / "p.png", tmp_path / "other.json"
    text = _bench(
        "plot_discovery.py", ["--figure", str(plot), f"a={out}", f"b={out}:random"], tmp_path
    )
    assert "| a | 1 |" in text and "| b | 1 |" in text and plot.read_bytes()[:4] == b"\x89PNG"
    other.write_text(json.dumps({**data, "protocol_hash": "sha256:" + "0" * 64}))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "plot_discovery.py"), "--figure", str(plot)]
    res = subprocess.run(cmd + [f"a={out}", f"b={other}"], capture_output=True, text=True)
    assert res.returncode == 1 and "different protocols" in res.stderr
    # held-out confirmation: the best nodes re-measured on seeds the searches never saw, in copies
    conf = tmp_path / "c.json"
    args = ["--preset", "tiny", "--seeds", "2", "--first-seed", "2", "--workdir", str(work)]
    text = _bench("confirm_discovery.py", args + ["--json", str(conf)], tmp_path)
    confirmed = json.loads(conf.read_text())
    rows, summary = confirmed["rows"], confirmed["summary"]
    assert {r["method"] for r in rows} == {"loop", "random"} and "| loop | 0 |" in text
    # the unbiased comparison: each method's mean held-out difference, and the loop's minus random's
    for method in ("loop", "random"):
        (r,) = (r for r in rows if r["method"] == method)
        assert summary[method]["mean_held_out_diff"] == pytest.approx(r["diff"])
        assert summary[method]["interval"] is None  # one search seed: no interval over them
        assert summary[method]["beats_root_in"] == int(r["beats_root"])
        assert f"{method}: mean held-out difference to the root" in text
    assert summary["loop_minus_random"] == pytest.approx(
        summary["loop"]["mean_held_out_diff"] - summary["random"]["mean_held_out_diff"]
    )
    for r in rows:
        assert r["seeds"] == [2, 3] and r["best"] == data["results"][r["method"]]["0"]["best"]
        assert r["diff_interval"] is not None and r["search_diff"] == pytest.approx(
            data["results"][r["method"]]["0"]["best_diff"]
        )
    # the searches' own archives still hold the results of the search's seeds only, and the
    # confirmation (the product's, as `poise-git confirm` records it) beside them
    from engine.archive.confirmation import read_confirmation

    for method in ("loop", "random"):
        arch = Archive(work / f"{method}-s0")
        name = data["results"][method]["0"]["best"]
        best = arch.nodes("proxy/tiny")[name]
        assert sorted(int(p["seed"]) for p in best.result.per_seed) == [0, 1]
        conf = read_confirmation(arch, name, "proxy/tiny")
        (r,) = (r for r in rows if r["method"] == method)
        assert conf.seeds == (2, 3) and conf.search_seeds == (0, 1)
        assert conf.difference == pytest.approx(r["diff"]) and arch.fsck()
    # the best nodes as sweep sources for the transfer check: their code byte for byte, the root's
    # once, a provenance line each; a second run finds the same code, other code is refused
    src = tmp_path / "sources"
    args = ["--workdir", str(work), "--label", "t", "--out", str(src), "--methods", "loop,random"]
    text = _bench("transfer_sources.py", args, tmp_path)
    assert "| t_s0.py |" in text and "| t_random_s0.py |" in text
    assert sorted(p.name for p in src.glob("*.py")) == ["grpo.py", "t_random_s0.py", "t_s0.py"]
    prov = {}
    for line in (src / "provenance.jsonl").read_text().splitlines():
        rec = json.loads(line)
        prov[rec["file"]] = rec
    for method, file in (("loop", "t_s0.py"), ("random", "t_random_s0.py")):
        arch, name = Archive(work / f"{method}-s0"), data["results"][method]["0"]["best"]
        assert (src / file).read_text() == arch.algorithm(name)
        assert prov[file]["node"] == name and prov[file]["commit"] == arch.nodes()[name].commit
        assert (src / "grpo.py").read_text() == arch.algorithm("grpo")
    assert _bench("transfer_sources.py", args, tmp_path).count("| same code |") == 2
    (src / "t_s0.py").write_text("# other code\n")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "transfer_sources.py"), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 1 and "already holds other code" in res.stderr
    # the loop's children read the way their reflections read them; each seed's tail means in the
    # results are the same numbers as that seed's MLflow history (the script's fallback for
    # results recorded before the tails)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import training_vs_parent
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from engine.operators.reflect import seed_tails

    arch = Archive(work / "loop-s0")
    root = arch.nodes("proxy/tiny")["grpo"].result
    recorded, logged = seed_tails(root), training_vs_parent.mlflow_tails(arch, root)
    # the search's seeds only: the held-out confirmation's runs of seeds 2 and 3 are not the result's
    assert sorted(recorded) == sorted(logged) == [0, 1] and "train/entropy" in recorded[0]
    for seed, tails in recorded.items():
        assert tails.keys() >= logged[seed].keys()
        assert all(tails[k] == pytest.approx(v) for k, v in logged[seed].items())
    tvp = tmp_path / "tvp.json"
    args = ["--workdir", str(work), "--preset", "tiny", "--json", str(tvp)]
    text = _bench("training_vs_parent.py", args, tmp_path)
    children = json.loads(tvp.read_text())["children"]
    evaluated = [
        c for c in data["results"]["loop"]["0"]["candidates"] if c["status"] == "evaluated"
    ]
    assert [c["node"] for c in children] == [c["node"] for c in evaluated]
    assert all(c["reading"] in training_vs_parent.READINGS and c["seeds"] == 2 for c in children)
    assert not any(c["kind"].startswith("retune") for c in children)  # each changed something


def test_bench_eval_noise_scores_each_policy_as_the_protocol_does_and_under_larger_evaluations(
    tmp_path,
):
    out = tmp_path / "noise.json"
    args = ["--preset", "tiny", "--seeds", "2", "--eval-seeds", "2", "--mechanisms", "sa_grpo"]
    args += ["--big-prompts", "8", "--big-samples", "8", "--parallel", "2", "--json", str(out)]
    text = _bench("bench_eval_noise.py", args, tmp_path)
    assert "1. evaluation sampling noise" in text and "| sa_grpo |" in text
    data = json.loads(out.read_text())
    assert data["protocol"] == "proxy/tiny" and data["unit"].startswith("Overall")
    assert {(r["mechanism"], r["seed"]) for r in data["rows"]} == {
        (m, s) for m in ("grpo", "sa_grpo") for s in (0, 1)
    }
    for r in data["rows"]:
        assert len(r["by_eval_seed"]) == 2 and r["protocol"] == r["by_eval_seed"][0]
        assert r["eval_mean"] == pytest.approx(sum(r["by_eval_seed"]) / 2)
    assert set(data["paired"]["sa_grpo"]) == {"protocol", "eval_mean", "large"}
    # the "protocol" column is the Overall a result records: the worker's own run, same seed
    grpo1 = next(r for r in data["rows"] if r["mechanism"] == "grpo" and r["seed"] == 1)
    assert _worker_grpo_overall(tmp_path, seed=1) == grpo1["protocol"]


def test_bench_protocol_sweep_trains_each_variant_resumes_and_refuses_bad_variants(tmp_path):
    out, rows = tmp_path / "sweep.json", tmp_path / "rows.jsonl"
    args = ["--preset", "tiny", "--variant", "base:", "--variant", "longer:steps=6,eval.samples=8"]
    args += ["--mechanisms", "sa_grpo", "--seeds", "2", "--parallel", "2"]
    args += ["--json", str(out), "--rows", str(rows)]
    text = _bench("bench_protocol_sweep.py", args, tmp_path)
    assert "## base" in text and "## longer" in text and "| sa_grpo |" in text
    data = json.loads(out.read_text())
    assert data["protocol"] == "proxy/tiny"
    base, longer = data["variants"]["base"], data["variants"]["longer"]
    assert longer["changes"] == {"rl": {"steps": 6}, "eval": {"samples": 8}}
    assert longer["settings"]["rl"]["steps"] == 6 and base["settings"]["rl"]["steps"] == 4
    assert base["protocol_hash"] != longer["protocol_hash"]
    lines = [json.loads(x) for x in rows.read_text().splitlines()]
    assert {(r["variant"], r["mechanism"], r["seed"]) for r in lines} == {
        (v, m, s) for v in ("base", "longer") for m in ("grpo", "sa_grpo") for s in (0, 1)
    }
    assert {r["steps_run"] for r in lines if r["variant"] == "longer"} == {6}
    # every row names the protocol it was measured under, resolved where it trained
    for v in ("base", "longer"):
        mine = {(r["protocol_hash"], r["device"]) for r in lines if r["variant"] == v}
        assert mine == {(data["variants"][v]["protocol_hash"], "cpu")}
    # every figure names the machine that measured it (some mechanisms' runs differ across machines)
    import torch

    assert {r["machine"]["torch"] for r in lines} == {torch.__version__}
    assert data["machine"] == lines[0]["machine"] and data["machine"]["cores"] >= 1
    # the paired difference is the mean of the per-seed differences of the rows it read
    ov = {(r["variant"], r["mechanism"], r["seed"]): r["overall"] for r in lines}
    sa = next(r for r in base["table"] if r["mechanism"] == "sa_grpo")
    want = sum(ov["base", "sa_grpo", s] - ov["base", "grpo", s] for s in (0, 1)) / 2
    assert sa["diff"] == pytest.approx(want)
    # the base variant is the preset itself: its GRPO seed 0 is the worker's own run
    assert _worker_grpo_overall(tmp_path, seed=0) == ov["base", "grpo", 0]
    # a re-run reads every finished job back and runs none
    again = _bench("bench_protocol_sweep.py", args, tmp_path)
    assert "0 runs to do (8 read back)" in again
    # a report over a variant no run finished yet (a sweep cut short before its first) says so
    none = _bench(
        "bench_protocol_sweep.py", [*args, "--variant", "later:steps=5", "--report-only"], tmp_path
    )
    assert "## later" in none and "no finished runs" in none and "| sa_grpo |" in none
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_protocol_sweep.py"), "--preset", "tiny"]
        + ["--variant", "x:stepz=3", "--json", str(tmp_path / "bad.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "unknown rl setting 'stepz'" in bad.stderr


def test_bench_protocol_sweep_builds_pins_and_trains_a_variants_own_warm_start(tmp_path):
    out = tmp_path / "sweep.json"
    small = "small:warmstart.d_model=16,warmstart.heads=2,warmstart.layers=1,"
    small += "warmstart.skill_steps=4,warmstart.habit_steps=2,warmstart.batch=8"
    args = ["--preset", "tiny", "--variant", "base:", "--variant", small, "--mechanisms", "sa_grpo"]
    text = _bench("bench_protocol_sweep.py", [*args, "--seeds", "1", "--json", str(out)], tmp_path)
    assert "small: building its warm start" in text
    data = json.loads(out.read_text())
    base, own = data["variants"]["base"], data["variants"]["small"]
    assert own["settings"]["warmstart"]["d_model"] == 16
    assert own["settings"]["warmstart_sha256"].startswith("sha256:")
    assert own["settings"]["warmstart_sha256"] != base["settings"]["warmstart_sha256"]
    assert own["protocol_hash"] != base["protocol_hash"]
    assert len(list((tmp_path / "warmstarts").glob("warmstart-*.pt"))) == 1
    rows = [json.loads(x) for x in out.with_suffix(".rows.jsonl").read_text().splitlines()]
    assert {(r["variant"], r["mechanism"]) for r in rows} == {
        (v, m) for v in ("base", "small") for m in ("grpo", "sa_grpo")
    }
    assert {r["steps_run"] for r in rows} == {4}


def test_bench_cpu_kernels_runs_each_capability_in_its_own_process(tmp_path):
    out = tmp_path / "kernels.json"
    args = ["--preset", "tiny", "--mechanisms", "grpo,sa_grpo", "--capabilities", "default,avx2"]
    text = _bench("bench_cpu_kernels.py", [*args, "--json", str(out)], tmp_path)
    assert "| sa_grpo | avx2 |" in text
    data = json.loads(out.read_text())
    runs = {(r["mechanism"], r["asked"]): r for r in data["runs"]}
    assert set(runs) == {(m, c) for m in ("grpo", "sa_grpo") for c in ("default", "avx2")}
    assert {r["capability"] for (_, c), r in runs.items() if c == "default"} == {"DEFAULT"}
    assert all(r["steps"] == 4 and 0.0 <= r["overall"] <= 1.0 for r in runs.values())
    assert runs["grpo", "default"]["max_logit_diff_step0"] == 0.0  # the reference against itself
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_cpu_kernels.py"), "--mechanisms", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "unknown mechanism(s) nope" in bad.stderr


def test_bench_fingerprint_times_the_fingerprints_of_published_mechanisms(tmp_path):
    text = _bench("bench_fingerprint.py", ["--sources", "2", "--repeats", "1"], tmp_path)
    assert "repeat 1:" in text and "fingerprints() of 2 sources" in text
    assert "2 recording children at a time: median" in text


def _fails(script: str, args: list[str], tmp_path: Path) -> str:
    """A benchmark's command that must fail: its stderr, after checking it failed."""
    env = {**os.environ, "POISE_EVAL_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stdout + res.stderr
    return res.stderr


def test_bench_calibration_and_discovery_refuse_bad_arguments_in_one_line(tmp_path):
    d = ["--workdir", str(tmp_path / "w"), "--json", str(tmp_path / "d.json")]
    for script, args, says in [
        ("bench_calibration.py", ["--preset", "nope"], "invalid choice: 'nope'"),
        ("bench_calibration.py", ["--only", "sa_grpp"], "unknown mechanism sa_grpp"),
        ("bench_calibration.py", ["--seeds", "0"], "at least 1"),
        ("bench_discovery.py", ["--preset", "nope", *d], "invalid choice: 'nope'"),
        ("bench_discovery.py", ["--methods", "lop", *d], "unknown method lop"),
        ("bench_discovery.py", ["--candidates", "0", *d], "must be >= 1"),
    ]:
        assert says in _fails(script, args, tmp_path)
    assert not (tmp_path / "w").exists() and not (tmp_path / "d.json").exists()
    bad = tmp_path / "calibration.json"
    bad.write_text(json.dumps({"rows": []}))
    err = _fails("plot_discovery.py", ["--figure", str(tmp_path / "p.png"), f"a={bad}"], tmp_path)
    assert "not a bench_discovery.py JSON" in err


def test_bench_discovery_reads_the_calibrations_cache_and_refuses_other_settings(tmp_path):
    # the calibration's GRPO seed run fills the shared cache from the worker's own `run` (no
    # trajectory): the discovery's root evaluation must run that seed again, not crash on it
    cal = ["--preset", "tiny", "--seeds", "1", "--only", "grpo", "--parallel", "1"]
    _bench("bench_calibration.py", cal + ["--json", str(tmp_path / "c.json")], tmp_path)
    work = tmp_path / "work"
    args = ["--preset", "tiny", "--candidates", "1", "--search-seeds", "1", "--methods", "random"]
    args += ["--workdir", str(work), "--json", str(tmp_path / "d.json")]
    args += ["--figure", str(tmp_path / "d.png")]
    _bench("bench_discovery.py", args + ["--seeds", "1"], tmp_path)
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["results"]["random"]["0"]["root_overall"] is not None and data["seeds"] == [0]
    # a finished search measured at other seeds is not combined with this run's
    err = _fails("bench_discovery.py", args + ["--seeds", "2"], tmp_path)
    assert "searched with other settings: seeds 1 (now 2)" in err


def test_bench_calibration_interrupted_says_so_and_resumes_from_the_cache(tmp_path):
    import signal

    # one seed: GRPO's seed run finishes and is cached, SA-GRPO's is interrupted and runs again
    args = ["--preset", "tiny", "--seeds", "1", "--only", "sa_grpo", "--parallel", "1"]
    args += ["--json", str(tmp_path / "a.json")]
    env = {**os.environ, "POISE_EVAL_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_calibration.py"), *args]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    for line in proc.stdout:  # progress arrives line by line, also through a pipe
        if " seed 0: ok" in line:
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130 and "interrupted: " in err and "resumes" in err, out + err
    assert not (tmp_path / "a.json").exists()
    again = _bench("bench_calibration.py", args, tmp_path)
    assert ", 0 cached)" not in again and " cached); mean" in again


def test_bench_discovery_interrupted_says_what_was_kept_and_resumes(tmp_path):
    import signal

    work = tmp_path / "work"
    args = ["--preset", "tiny", "--candidates", "1", "--seeds", "1", "--search-seeds", "2"]
    args += ["--methods", "random", "--workdir", str(work), "--json", str(tmp_path / "d.json")]
    args += ["--figure", str(tmp_path / "d.png")]
    env = {**os.environ, "POISE_EVAL_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_discovery.py"), *args]
    # started with SIGINT ignored, as a background job of a script is: Ctrl-C must still stop it
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    for line in proc.stdout:  # search seed 0 finished, seed 1 under way
        if "random search seed 1: searching" in line:
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130 and "Traceback" not in err, out + err
    last = err.strip().splitlines()[-1]  # after MLflow's own start-up lines
    assert last.startswith("interrupted: 1 of 2 searches finished"), err
    assert f"kept in {work}; random search seed 1 stopped, to be searched again" in err
    assert "nothing written to" in err and "the same command resumes" in err
    assert not (tmp_path / "d.json").exists() and (work / "random-s0.json").is_file()
    assert not (work / "random-s1.json").exists()
    again = _bench("bench_discovery.py", args, tmp_path)
    assert again.count("finished earlier") == 1 and "| random | 1 |" in again


def test_bench_archive_measures_every_size_and_writes_its_figures(tmp_path):
    out = tmp_path / "archive.json"
    text = _bench(
        "bench_archive.py", ["--sizes", "20,60", "--spawns", "2", "--json", str(out)], tmp_path
    )
    assert "60 vs 20 nodes (3x): read cold" in text and "targets at 60 nodes:" in text
    assert "git fsck --strict: clean" in text
    sizes = json.loads(out.read_text())["sizes"]
    assert [s["nodes"] for s in sizes] == [20, 60]
    for s in sizes:
        assert set(s["lineage_read_s"]) == {"cold", "warm", "warm_in_memory"}
        assert s["spawn_median_ms"] > 0 and s["select_s"] > 0 and s["duplicate_check_median_ms"] > 0
    assert "--sizes takes" in _fails("bench_archive.py", ["--sizes", "x"], tmp_path)
