"""`poise-git report`: figures and table from recorded results; the page renders in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from results_util import record

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
  var imgs = Array.prototype.slice.call(document.images);
  var out = imgs.map(function (i) { return [i.getAttribute('src'), i.complete && i.naturalWidth > 0]; });
  var pre = document.createElement('pre'); pre.id = 'poise-imgcheck';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""


def _render_in_chromium(page: Path) -> list:
    exe = _chromium()
    if exe is None:
        pytest.skip(
            "no Chromium binary on PATH (apt-get install chromium) — the page-render check needs one"
        )
    probe = page.with_name("_render_check.html")
    probe.write_text(
        page.read_text(encoding="utf-8").replace("</body>", _CHECK + "</body>"), encoding="utf-8"
    )
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
    for stem in ("lineage", "frontier", "dynamics", "accuracy_length"):
        assert (out / f"{stem}.svg").stat().st_size > 1000 and (
            out / f"{stem}.png"
        ).stat().st_size > 1000
        assert f"{stem}.svg" in html
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
    assert len(loaded) == 4 and all(ok for _src, ok in loaded), loaded


def test_report_on_fresh_archive_says_no_data(tmp_path):
    from engine.archive.store import Archive
    from engine.report.html import render

    arch = Archive.init(tmp_path / "exp")
    page = render(arch)
    assert page == arch.path / ".poise" / "report" / "index.html"
    text = page.read_text()
    assert "no data yet" in text and "<td>grpo</td>" in text
    assert [p.name for p in page.parent.glob("*.svg")] == [
        "lineage.svg"
    ]  # the root alone, unevaluated
    assert arch.fsck()
