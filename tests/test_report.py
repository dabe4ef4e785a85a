"""`poise-git report`: figures and table from recorded results; the page renders in headless Chromium."""

from __future__ import annotations

import dataclasses
import html as html_mod
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from results_util import collapsing_root, per_seed_rows, proxy_result, record, remedied_child

STEPS = list(range(0, 50, 5))


def _traj(reward0: float, slope: float, length0: float) -> dict:
    return {
        "step": STEPS,
        "train/reward_mean": [reward0 + slope * i for i in range(len(STEPS))],
        "train/entropy": [1.5 - 0.05 * i for i in range(len(STEPS))],
        "train/response_length": [length0 - 0.3 * i for i in range(len(STEPS))],
    }


def _payload(overall: float, half: float | None, length: float, slope: float = 0.02) -> dict:
    p = {
        "status": "evaluated",
        "metrics": {"overall": overall, "mean_length": length, "valid_rate": 0.9},
        "backend": "proxy",
        "seeds": [0, 1, 2],
        "trajectory": _traj(0.2, slope, length + 3),
        "wall_time_s": 60.0,
    }
    if half is not None:
        p["intervals"] = {"overall": [overall - half, overall + half]}
    return p


def _build(tmp_path: Path):
    from engine.archive.store import Archive

    arch = Archive.init(tmp_path / "exp")
    record(arch, "grpo", _payload(0.50, 0.02, 22.0))
    arch.spawn(
        "grpo",
        "dr-grpo",
        trailers={"Poise-Round": "1", "Poise-Proposer": "offline"},
        status="verified",
    )
    record(arch, "dr-grpo", _payload(0.60, 0.02, 18.0, 0.03))  # clears the root's interval
    arch.spawn("grpo", "clip-higher", trailers={"Poise-Round": "1"}, status="verified")
    record(arch, "clip-higher", _payload(0.52, 0.03, 25.0))  # overlaps: within noise
    arch.spawn("dr-grpo", "dr-grpo-kl", trailers={"Poise-Round": "2"}, status="verified")
    record(arch, "dr-grpo-kl", _payload(0.40, 0.02, 15.0, -0.01))  # below the parent's interval
    arch.spawn("dr-grpo", "no-iv", trailers={"Poise-Round": "2"}, status="verified")
    record(arch, "no-iv", _payload(0.61, None, 19.0))  # one seed: no interval
    arch.spawn("clip-higher", "broken", trailers={"Poise-Round": "2"}, status="verified")
    record(
        arch,
        "broken",
        {"status": "failed", "reason": "NaN loss at step 3", "metrics": {}},
        status="failed",
    )
    arch.spawn("clip-higher", "hostile", trailers={"Poise-Round": "2"})
    arch.set_status("hostile", "rejected", reason="imports os")
    return arch


def test_rows_give_deltas_and_noise_aware_verdicts(tmp_path):
    from engine.report.html import node_rows, report_experiment

    arch = _build(tmp_path)
    rows = {r["node"]: r for r in node_rows(arch.nodes(), report_experiment(arch))}
    assert rows["dr-grpo"]["vs_parent"] == "better"
    assert rows["dr-grpo"]["delta_root"] == pytest.approx(0.10)
    assert rows["clip-higher"]["vs_parent"] == "within noise"
    assert rows["dr-grpo-kl"]["vs_parent"] == "worse"
    assert rows["dr-grpo-kl"]["delta_parent"] == pytest.approx(-0.20)
    assert rows["dr-grpo-kl"]["delta_root"] == pytest.approx(-0.10)
    assert rows["no-iv"]["vs_parent"] == "no interval"
    assert rows["broken"]["utility"] is None and rows["broken"]["reason"] == "NaN loss at step 3"
    assert rows["hostile"]["status"] == "rejected" and rows["hostile"]["reason"] == "imports os"


@pytest.mark.parametrize(
    ("half", "phrase"),
    [
        (0.03, "within noise of the root"),  # 0.52 ± 0.03 overlaps the root's 0.50 ± 0.005
        (0.01, "better than the root"),  # 0.52 ± 0.01 clears it
        (None, "no interval to compare with the root"),  # one seed: no interval
    ],
)
def test_the_best_line_reads_its_verdict_against_the_root(tmp_path, half, phrase):
    from engine.archive.store import Archive
    from engine.report.html import render_report

    arch = Archive.init(tmp_path / "exp")
    record(arch, "grpo", _payload(0.50, 0.005, 22.0))
    arch.spawn("grpo", "child", status="verified")
    record(arch, "child", _payload(0.52, half, 20.0))
    page = render_report(arch, tmp_path / "out").read_text()
    best = re.search(r"<b>best</b></td><td>([^<]*)", page).group(1)
    assert best == f"child: U 0.5200 (root 0.5000; {phrase})"
    assert " than the root" not in best.replace("better than", "").replace("worse than", "")


def test_every_promotion_verdict_reads_as_a_phrase():
    from engine.select import objective as obj

    assert obj.promotion_phrase(obj.BETTER, "its parent") == "better than its parent"
    assert obj.promotion_phrase(obj.WORSE, "the root") == "worse than the root"
    assert obj.promotion_phrase(obj.WITHIN, "the root") == "within noise of the root"
    assert (
        obj.promotion_phrase(obj.UNRESOLVED, "the root") == "no interval to compare with the root"
    )
    assert obj.promotion_phrase(obj.NOT_EVALUATED, "the root") == "not evaluated vs the root"


def test_rows_say_what_training_did_differently_from_the_parent(tmp_path):
    """The node table's "training vs parent": the reflection's reading of the trajectory against
    the parent's, seed by seed where the results carry per-seed tails."""
    from engine.report.html import node_rows, report_experiment

    arch = _build(tmp_path)
    rows = {r["node"]: r for r in node_rows(arch.nodes(), report_experiment(arch))}
    # recorded without per-seed tails: the mean trajectories, read without an interval
    assert rows["dr-grpo"]["training"] == "shorter; higher reward (a reading, no interval)"
    assert rows["grpo"]["training"] == "" and rows["broken"]["training"] == ""

    def seeded(overall: float, entropy: list[float]) -> dict:
        rest = {"train/reward_mean": 0.3, "train/response_length": 20.0}
        tails = [{"train/entropy": e, **rest} for e in entropy]
        per_seed = per_seed_rows([overall] * len(entropy), tails)
        return {**_payload(overall, 0.02, 22.0), "per_seed": per_seed}

    record(arch, "grpo", seeded(0.50, [0.20, 0.22, 0.21]))
    arch.spawn("grpo", "ent", trailers={"Poise-Round": "1"}, status="verified")
    record(arch, "ent", seeded(0.51, [0.30, 0.33, 0.32]))  # x1.5 at every seed
    arch.spawn("grpo", "same", trailers={"Poise-Round": "1"}, status="verified")
    record(arch, "same", seeded(0.49, [0.201, 0.221, 0.209]))
    rows = {r["node"]: r for r in node_rows(arch.nodes(), report_experiment(arch))}
    assert rows["ent"]["training"] == "kept more entropy"
    assert rows["same"]["training"] == "like its parent"


def test_length_penalty_shifts_utility_and_interval(tmp_path):
    from engine.config import ExperimentConfig
    from engine.report.html import node_rows

    arch = _build(tmp_path)
    exp = ExperimentConfig(objective="overall", length_penalty=0.01)
    rows = {r["node"]: r for r in node_rows(arch.nodes(), exp)}
    assert rows["dr-grpo-kl"]["utility"] == pytest.approx(0.40 - 0.15)
    assert rows["dr-grpo-kl"]["interval"] == pytest.approx((0.38 - 0.15, 0.42 - 0.15))


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


_CHECK = """<script>
window.addEventListener('load', function () {
  var out = {images: document.images.length, svgs: [], labels: []};
  Array.prototype.forEach.call(document.querySelectorAll('.fig > svg'), function (svg) {
    var r = svg.getBoundingClientRect();
    out.svgs.push([r.width, r.height, svg.querySelectorAll('path, use').length]);
  });
  var names = JSON.parse(document.body.getAttribute('data-labels') || '[]');
  var first = document.querySelector('.fig > svg');
  Array.prototype.forEach.call(first ? first.querySelectorAll('text') : [], function (t) {
    var axis = t.closest('[id^="matplotlib.axis"], [id^="xtick"], [id^="ytick"]');
    if (!axis && names.indexOf(t.textContent.trim()) >= 0) {
      var r = t.getBoundingClientRect();
      out.labels.push([t.textContent.trim(), r.left, r.top, r.right, r.bottom]);
    }
  });
  var pre = document.createElement('pre'); pre.id = 'poise-imgcheck';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""


def _render_in_chromium(page: Path, labels: list[str] = ()) -> dict:
    exe = _chromium()
    if exe is None:
        pytest.skip(
            "no Chromium binary on PATH (apt-get install chromium) — the page-render check needs one"
        )
    probe = page.with_name("_render_check.html")
    text = page.read_text(encoding="utf-8").replace("</body>", _CHECK + "</body>")
    text = text.replace("<body>", f"<body data-labels='{json.dumps(list(labels))}'>", 1)
    probe.write_text(text, encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="poise-chromium-") as profile:
        cmd = [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--allow-file-access-from-files",
            "--virtual-time-budget=10000",
            "--dump-dom",
            probe.as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    probe.unlink()
    m = re.search(r'<pre id="poise-imgcheck">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"Chromium did not render the page: rc={proc.returncode} {proc.stderr[-500:]}"
    return json.loads(m.group(1).replace("&quot;", '"'))


@pytest.mark.slow  # several CLI processes / a sandboxed verification: seconds of CPU each
def test_report_command_writes_figures_and_renders(tmp_path, cli):
    arch = _build(tmp_path)
    # one node recorded through the real `poise-git record` entry point
    res = tmp_path / "r.json"
    res.write_text(json.dumps(_payload(0.55, 0.01, 21.0)))
    arch.spawn("dr-grpo", "recorded", trailers={"Poise-Round": "2"}, status="verified")
    p = cli("record", "recorded", "--results", str(res), "-C", str(arch.path))
    assert p.returncode == 0, p.stderr
    out = tmp_path / "rep"
    p = cli(
        "report",
        "-C",
        str(arch.path),
        "--out",
        str(out),
        "--objective",
        "pareto(overall, -mean_length)",
    )
    assert p.returncode == 0, p.stderr
    page = out / "index.html"
    html = page.read_text()
    # one self-contained file: the four figures inline, nothing else written or referenced
    assert [f.name for f in out.iterdir()] == ["index.html"]
    assert html.count("<svg") == 4 and "<img" not in html
    assert not re.search(r"""(src|href)=["'](?!#|data:)""", html), "an external reference"
    for node in (
        "grpo",
        "dr-grpo",
        "clip-higher",
        "dr-grpo-kl",
        "no-iv",
        "broken",
        "hostile",
        "recorded",
    ):
        assert f"<td>{node}</td>" in html
    assert "NaN loss at step 3" in html and "within noise" in html and "better" in html
    assert "Mechanism of the best node: no-iv vs the root" in html
    assert (
        "<h2>Rounds</h2>" in html
        and "<td>dr-grpo-kl (0.4000)</td>" not in html
        and "no-iv (0.6100)" in html
    )
    loaded = _render_in_chromium(page)
    assert loaded["images"] == 0 and len(loaded["svgs"]) == 4, loaded
    assert all(w > 200 and h > 100 and n > 5 for w, h, n in loaded["svgs"]), loaded


def test_report_on_fresh_archive_says_no_data(tmp_path):
    from engine.archive.store import Archive
    from engine.report.html import render_report

    arch = Archive.init(tmp_path / "exp")
    page = render_report(arch)
    assert page == arch.path / ".poise" / "report" / "index.html"
    text = page.read_text()
    assert "no data yet" in text and "<td>grpo</td>" in text
    assert text.count("<svg") == 1  # the lineage of the root alone, unevaluated
    assert [p.name for p in page.parent.iterdir()] == ["index.html"]
    assert arch.fsck()


def test_a_rounds_parents_are_listed_in_rank_order(tmp_path):
    """Ranks are numbers: the parent ranked 2 comes before the one ranked 10 ("10" < "2" as text);
    the trailers' text is shown as text."""
    from engine.archive.store import Archive
    from engine.report.html import render_report

    arch = Archive.init(tmp_path / "exp")
    for parent in ("p10", "p2"):
        arch.spawn("grpo", parent, trailers={"Poise-Round": "1"})
    for parent, rank, score in (("p10", "10", "0.1"), ("p2", "2", "<b>0.9")):
        trailers = {
            "Poise-Round": "2",
            "Poise-Selection-Rank": rank,
            "Poise-Selection-Score": score,
        }
        arch.spawn(parent, f"{parent}-child", trailers=trailers)
    page = render_report(arch).read_text()
    assert "<td>2</td><td>p2 (2: &lt;b&gt;0.9), p10 (10: 0.1)</td>" in page, page


@pytest.mark.parametrize("metric", ["acc<img src=x onerror=alert(1)>", r"acc$\frac$"])
def test_a_metric_name_is_drawn_and_written_as_text(tmp_path, metric):
    """The objective is poise.toml's text: the accuracy-vs-length caption escapes it and the figures
    draw a ``$`` in it as a character (not as the start of a formula that fails to parse)."""
    from engine.archive.store import Archive
    from engine.config import DEFAULT_TOML
    from engine.report.html import render_report

    toml = DEFAULT_TOML.replace(
        'objective = "overall" ', f"objective = '{metric}'\nlength_penalty = 0.001 ", 1
    )
    arch = Archive.init(tmp_path / "exp", config_toml=toml)
    for name, value in (("grpo", 0.5), ("child", 0.6)):
        if name != "grpo":
            arch.spawn("grpo", name, status="verified")
        r = proxy_result({"metrics": {"overall": value, "mean_length": 20.0 - 10 * value}})
        arch.record_result(
            name,
            dataclasses.replace(
                r,
                metrics={**r.metrics, metric: value},
                units={**r.units, metric: "fraction"},
                utility=metric,
            ),
        )
    page = render_report(arch, tmp_path / "out").read_text()
    assert "<img" not in page and page.count("<svg") == 3
    shown = html_mod.escape(metric, quote=False)
    assert f"<figcaption>{html_mod.escape(metric)} against mean response length" in page
    assert f">{shown} (fraction)</text>" in page  # the accuracy axis, as written


def test_every_figure_names_its_protocol_seeds_and_units(tmp_path):
    """A number means nothing without what it measured: each figure's title names the protocol
    version and the seeds of the ranked results, its axes the metrics' units, and each caption the
    same."""
    from engine.config import ExperimentConfig
    from engine.report.html import render_report

    arch = _build(tmp_path)
    key = arch.node("grpo").result.protocol.key
    exp = ExperimentConfig(objective="overall", pareto_objectives=("overall", "-mean_length"))
    page = render_report(arch, tmp_path / "out", experiment=exp).read_text()
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    assert len(svgs) == 4
    for svg in svgs:
        assert f">{key}, 3 seeds each</text>" in svg
    lineage, frontier, _dynamics, accuracy = svgs
    assert (
        ">U = overall (fraction)</text>" in lineage and ">U = overall (fraction)</text>" in frontier
    )
    assert ">mean response length (tokens)</text>" in accuracy
    assert ">overall (fraction)</text>" in accuracy
    assert page.count(f"Measured under {key}, 3 seeds each.</figcaption>") == 4


def test_report_says_which_remedies_are_still_directed_to(tmp_path):
    """The remedies of the diagnosis: each one's trials (the children that applied it against a
    collapsing parent, judged on the entropy) and whether the offline proposer still directs to it;
    no section before any trial."""
    from engine.archive.store import Archive
    from engine.report.html import render_report

    arch = Archive.init(tmp_path / "exp")
    collapsing_root(arch)
    assert "Remedies of the diagnosis" not in render_report(arch).read_text()
    remedied_child(arch, "bonus-a", 1.01, entropy_coef=0.004)
    remedied_child(arch, "bonus-b", 0.99, entropy_coef=0.008)
    remedied_child(arch, "anchored", 1.5, kl_coef=0.05)
    text = render_report(arch).read_text()
    assert "Remedies of the diagnosis" in text
    assert (
        "<tr><td>entropy</td><td>0</td><td>2</td><td>0</td><td>0</td><td>bonus-a, bonus-b</td>"
        "<td>no, spent: 2 children that applied it against a parent&#x27;s entropy collapse kept "
        "entropy as their parents did (bonus-a, bonus-b)</td></tr>"
    ) in text
    assert (
        "<tr><td>kl</td><td>1</td><td>0</td><td>0</td><td>0</td><td>anchored</td><td>yes</td>"
        in text
    )
    assert arch.fsck()


def _overlaps(boxes: list) -> list:
    out = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]:
                out.append((a[0], b[0]))
    return out


@pytest.mark.slow
def test_large_lineage_labels_do_not_overlap_and_have_a_legend(tmp_path, cli):
    """30 nodes with long names, 3 generations: the figure labels nodes with ids, none of the labels
    overlap once rendered, and the legend maps every id to its full name."""
    from engine.archive.store import Archive

    arch = Archive.init(tmp_path / "exp")
    record(arch, "grpo", _payload(0.50, 0.02, 22.0))
    names = []
    for i in range(5):
        kid = f"advantage-rescaling-variant-number-{i:02d}"
        arch.spawn("grpo", kid, status="verified")
        record(arch, kid, _payload(0.5 + i / 100, 0.02, 20.0))
        names.append(kid)
        for j in range(5):
            g = f"{kid}-with-length-shaping-{j}"
            arch.spawn(kid, g, status="verified")
            record(arch, g, _payload(0.45 + j / 50, 0.02, 20.0))
            names.append(g)
    out = tmp_path / "rep"
    p = cli("report", "-C", str(arch.path), "--out", str(out))
    assert p.returncode == 0, p.stderr
    html = (out / "index.html").read_text()
    assert "Lineage legend" in html
    legend = html[html.index("Lineage legend") :]
    for name in ["grpo", *names]:
        assert f"<td>{name}</td>" in legend
    ids = [str(i) for i in range(1, len(names) + 2)]
    loaded = _render_in_chromium(out / "index.html", ids)
    assert len(loaded["labels"]) == len(ids), loaded["labels"]
    assert _overlaps(loaded["labels"]) == []


def test_the_protocol_line_names_results_under_another_version_and_other_protocols(tmp_path):
    """Results under the ranked id with an older hash are another version of it; the line says so,
    and lists results under other protocols apart."""
    import dataclasses

    from results_util import proxy_result

    from engine.report.html import render_report

    arch = _build(tmp_path)
    older = proxy_result({"overall": 0.55})
    arch.record_result(
        "clip-higher",
        dataclasses.replace(
            older, protocol=dataclasses.replace(older.protocol, hash="sha256:" + "ab" * 32)
        ),
    )
    record(arch, "dr-grpo", {"overall": 0.3}, preset="smoke")
    text = render_report(arch).read_text()
    assert (
        "also results under another version of proxy/default (1 node); "
        "other protocols: proxy/smoke (1 node)" in text
    ), re.findall(r"also results under[^<]*", text)


def test_a_damaged_run_record_does_not_stop_the_report(tmp_path):
    """The report reads the last run's plan and objective; fields of the wrong type there (a record
    damaged by hand) are left out instead of stopping the page."""
    from engine.loop.state import RunRecord, save_run
    from engine.report.html import render_report

    arch = _build(tmp_path)
    bad = {"id": "r1", "plan": {"start_round": "x", "rounds": None, "preset": 3}, "experiment": "?"}
    save_run(arch, RunRecord(bad), "poise: run r1")
    text = render_report(arch).read_text()
    assert "r1: rounds x–?" in text and "dr-grpo" in text


@pytest.mark.slow  # two CLI processes
def test_a_report_the_write_of_which_fails_leaves_the_earlier_page_whole(tmp_path):
    """The page is written whole or not at all: a write that fails part way (a full disk; here the
    file size limit, in a real `poise-git report` process) leaves the earlier report as it was,
    never a half-written index.html served as the report, and says so in one line."""
    import os
    import resource
    import sys

    from engine.archive.store import Archive

    arch = Archive.init(tmp_path / "exp")
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(repo), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "engine", "report", "-C", str(arch.path)]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    page = arch.path / ".poise" / "report" / "index.html"
    whole = page.read_bytes()
    assert whole.rstrip().endswith(b"</html>") and len(whole) > 2000

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))

    again = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=300, preexec_fn=small_files
    )
    assert again.returncode == 1, again.stdout + again.stderr
    # one error line; the lineage index, which cannot be written under the limit either, may
    # say once that the read falls back to git
    said = [ln for ln in again.stderr.splitlines() if "lineage index" not in ln]
    assert len(said) == 1 and said[0].startswith("error: "), again.stderr
    assert "Traceback" not in again.stderr, again.stderr
    assert page.read_bytes() == whole
    assert sorted(p.name for p in page.parent.iterdir()) == ["index.html"]
