"""`poise-git compare`: nodes × metrics with intervals, protocol, parent and gain; sort, filters,
JSON / CSV, piped output whole, and paging like git on a (pseudo-)terminal."""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import subprocess
import sys
import time

import pytest
from conftest import REPO
from results_util import record

from engine.archive.store import Archive

LONG = "g2-a-child-whose-name-is-much-longer-than-forty-characters-" + "y" * 10
SPLITS = ("easy", "medium", "hard")


def _payload(level: float, half: float = 0.01) -> dict:
    m = {"overall": level, "mean_length": 20.0 - 10 * level, "valid_rate": 0.95}
    for i, s in enumerate(SPLITS):
        for k in ("acc@1", "pass@1", "pass@8"):
            m[f"{s}/{k}"] = round(level * (1.0 - 0.3 * i), 4)
        m[f"{s}/mean_length"] = 20.0 - 10 * level + i
    return {
        "status": "evaluated",
        "metrics": m,
        "intervals": {k: [v - half, v + half] for k, v in m.items()},
        "seeds": [0, 1, 2, 3],
    }


@pytest.fixture
def arch(tmp_path):
    a = Archive.init(tmp_path / "exp")
    record(a, "grpo", _payload(0.40))
    a.spawn("grpo", "better")
    record(a, "better", _payload(0.50))  # clears the root's interval
    a.spawn("grpo", "close")
    record(a, "close", _payload(0.405))  # within noise
    a.spawn("better", LONG)
    record(a, LONG, _payload(0.45))  # worse than its parent
    a.spawn("better", "smoke-run")
    record(a, "smoke-run", _payload(0.90), preset="smoke")  # another protocol
    a.spawn("grpo", "broken")
    a.set_status("broken", "failed", "NaN loss at step 3")
    return a


def _json(cli, arch, *args):
    r = cli("compare", "--json", *args, "-C", str(arch.path))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_every_metric_with_interval_protocol_parent_and_gain(arch, cli):
    data = _json(cli, arch)
    rows = {r["node"]: r for r in data["rows"]}
    # evaluated nodes under the experiment's protocol (proxy/default), by creation
    assert list(rows) == ["grpo", "better", "close", LONG]
    assert data["metrics"][0] == "overall" and len(data["metrics"]) == 3 + 3 * 4
    assert "hard/pass@8" in data["metrics"] and data["directions"]["mean_length"] == "min"
    # a per-split length nobody gave a direction: shown, but neither better long nor short
    assert data["directions"]["hard/mean_length"] == "none"
    b = rows["better"]
    assert b["protocol"] == "proxy/default" and b["protocol_key"].startswith("proxy/default@")
    assert b["parent"] == "grpo" and b["seeds"] == [0, 1, 2, 3]
    assert b["metrics"]["hard/pass@8"] == {
        "value": pytest.approx(0.2),
        "lo": pytest.approx(0.19),
        "hi": pytest.approx(0.21),
        "unit": "fraction",
    }
    assert b["metrics"]["mean_length"]["unit"] == "tokens"
    g = b["gain"]["overall"]
    assert g["delta"] == pytest.approx(0.10) and g["better"] and g["significant"]
    assert rows["close"]["gain"]["overall"]["significant"] is False
    assert rows[LONG]["gain"]["overall"]["better"] is False
    # lengths are minimized: a shorter child is better
    assert b["gain"]["mean_length"]["better"] is True
    # another protocol: its own rows, and no gain over a parent measured only under proxy/default
    every = _json(cli, arch, "--protocol", "all")["rows"]
    s = next(r for r in every if r["node"] == "smoke-run")
    assert s["protocol"] == "proxy/smoke" and s["parent_same_protocol"] is False and s["gain"] == {}


@pytest.mark.slow  # several CLI processes / a sandboxed verification: seconds of CPU each
def test_sort_and_filters(arch, cli):
    order = [r["node"] for r in _json(cli, arch, "--sort", "hard/pass@8")["rows"]]
    assert order == ["better", LONG, "close", "grpo"]
    order = [r["node"] for r in _json(cli, arch, "--sort", "mean_length")["rows"]]
    assert order[0] == "better" and order[-1] == "grpo"  # shortest first
    # never ranked across protocols: proxy/smoke's best stays in its own group
    rows = _json(cli, arch, "--protocol", "all", "--sort", "overall")["rows"]
    assert [r["protocol"] for r in rows] == ["proxy/default"] * 4 + ["proxy/smoke"]
    rows = _json(cli, arch, "--protocol", "proxy/smoke")["rows"]
    assert [r["node"] for r in rows] == ["smoke-run"]
    assert len(_json(cli, arch, "--protocol", "proxy")["rows"]) == 5  # the family
    rows = _json(cli, arch, "--status", "all")["rows"]
    assert "broken" in [r["node"] for r in rows]
    rows = _json(cli, arch, "--status", "failed")["rows"]
    assert [(r["node"], r["metrics"]) for r in rows] == [("broken", {})]
    d = _json(cli, arch, "--metrics", "hard/*", "better", "grpo")
    assert d["metrics"] == ["overall"] + [
        f"hard/{k}" for k in ("acc@1", "mean_length", "pass@1", "pass@8")
    ]
    assert [r["node"] for r in d["rows"]] == ["better", "grpo"]
    r = cli("compare", "--sort", "nope", "-C", str(arch.path))
    assert r.returncode == 1 and "--sort 'nope': no such metric" in r.stderr
    r = cli("compare", "--sort", "hard/mean_length", "-C", str(arch.path))
    assert r.returncode == 1 and "has no direction" in r.stderr


def test_no_results_under_the_protocol_points_at_the_ones_there_are(tmp_path, cli):
    a = Archive.init(tmp_path / "exp")
    a.spawn("grpo", "quick")
    record(a, "quick", _payload(0.5), preset="smoke")
    a.spawn("grpo", "quick2")
    record(a, "quick2", _payload(0.6), preset="smoke")
    r = cli("compare", "--no-pager", "-C", str(a.path))
    assert r.returncode == 0
    assert "no nodes to compare" in r.stdout
    assert "results under other protocols: proxy/smoke (2 nodes)" in r.stdout
    assert "--protocol proxy/smoke" in r.stdout
    # asked for a protocol by name (an id, a version, a family) without results: the same pointer
    for asked in ("proxy/tiny", "lab"):
        r = cli("compare", "--no-pager", "--protocol", asked, "-C", str(a.path))
        assert r.returncode == 0 and "no nodes to compare" in r.stdout, asked
        assert "results under other protocols: proxy/smoke (2 nodes)" in r.stdout, asked
        assert "pass --protocol proxy/smoke or --protocol all" in r.stdout, asked
    # another version of the asked id (another hash) is called that, not another protocol
    r = cli("compare", "--no-pager", "--protocol", "proxy/smoke@0123456789ab", "-C", str(a.path))
    assert r.returncode == 0 and "no nodes to compare" in r.stdout
    assert "results under another version of proxy/smoke (2 nodes)" in r.stdout
    assert "other protocols" not in r.stdout
    assert "pass --protocol proxy/smoke or --protocol all" in r.stdout
    # results under the asked protocol that --status leaves out: not pointed at as elsewhere
    r = cli(
        "compare",
        "--no-pager",
        *("--protocol", "proxy/smoke", "--status", "failed"),
        "-C",
        str(a.path),
    )
    assert "no nodes to compare" in r.stdout and "other protocols" not in r.stdout
    # an archive with no results at all: nothing to point at
    b = Archive.init(tmp_path / "empty")
    r = cli("compare", "--no-pager", "-C", str(b.path))
    assert "no nodes to compare" in r.stdout and "other protocols" not in r.stdout


def test_csv_has_every_column(arch, cli):
    r = cli("compare", "--csv", "-C", str(arch.path))
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [x["node"] for x in rows] == ["grpo", "better", "close", LONG]
    b = rows[1]
    assert b["protocol"] == "proxy/default" and b["parent"] == "grpo" and b["result"] == "evaluated"
    assert float(b["hard/pass@8"]) == 0.2 and float(b["hard/pass@8 lo"]) == 0.19
    assert b["overall unit"] == "fraction" and b["seeds"] == "0 1 2 3" and b["interval_kind"]
    assert float(b["overall gain"]) == pytest.approx(0.1) and rows[0]["overall gain"] == ""


def test_piped_table_is_whole_one_line_per_node(arch, cli):
    r = cli("compare", "-C", str(arch.path), env={"COLUMNS": "", "POISE_PAGER": "false"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    row = next(ln for ln in lines if LONG in ln)
    assert "0.45 [0.44, 0.46] Δ-0.05" in row and "proxy/default@" in row and "better" in row
    assert "hard/pass@8" in r.stdout and max(len(ln) for ln in lines) > 200


def _run_in_pty(args: list[str], env: dict, timeout: float = 60) -> str:
    """Run poise-git with a pseudo-terminal as stdout (a real terminal to it); return what it wrote."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(slave)
    out = b""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=timeout)
    os.close(master)
    assert proc.returncode == 0, proc.stderr.read().decode()
    return out.decode("utf-8", "replace")


@pytest.mark.slow
def test_pages_like_git_on_a_terminal(arch, tmp_path):
    paged = tmp_path / "paged.txt"
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        COLUMNS="100",
        LINES="12",
        POISE_PAGER=f"cat > {paged}; echo LESS=$LESS >> {paged}",
    )
    env.pop("LESS", None)
    a = str(arch.path)
    seen = _run_in_pty(["compare", "-C", a], env)
    text = paged.read_text()
    assert LONG in text and "hard/pass@8" in text and LONG not in seen
    assert "LESS=FRSX" in text  # chop long lines: wide tables scroll sideways
    lines = [ln for ln in text.splitlines() if "│" in ln]
    assert max(len(ln) for ln in lines) > 100  # rendered at its natural width, not squeezed
    paged.unlink()
    seen = _run_in_pty(["compare", "--no-pager", "-C", a], env)
    assert not paged.exists() and LONG in seen  # written whole, the terminal wraps it
    # short enough for the screen: printed, not paged
    env.update(COLUMNS="250", LINES="200")
    seen = _run_in_pty(["compare", "--metrics", "valid_rate", "grpo", "better", "-C", a], env)
    assert not paged.exists() and "better" in seen
