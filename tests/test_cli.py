"""The command line as a user meets it: version, help, exit codes, piped output, error messages,
duplicate mechanisms, objective directions, retrospect labels. Real archives in tmp_path; the real
entry point through a subprocess (real pipes) or typer's CliRunner."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai_server  # tests/openai_server.py
import pytest
from conftest import REPO, run_cli
from results_util import record
from typer.testing import CliRunner

from engine.archive.store import Archive

LONG = (
    "a-node-name-well-beyond-forty-characters-that-a-user-will-copy-and-paste-somewhere-" + "x" * 8
)
WIDE_LINE = "    return " + " + ".join(f"{i}.0" for i in range(40))  # ~250 columns
NOPIPE = {"COLUMNS": ""}  # the default of a real pipe: no COLUMNS hint


def _app():
    from engine.cli import _register, app

    _register()
    return app


def invoke(*args: str):
    return CliRunner().invoke(_app(), list(args))


def _edit(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# -- version, help, exit codes ------------------------------------------------------------------


def test_version():
    from engine import __version__

    for flag in ("--version", "-V"):
        r = invoke(flag)
        assert r.exit_code == 0 and r.output.strip() == f"poise-git {__version__}"


def test_every_verb_has_examples_and_no_bool_type():
    app = _app()
    names = [i.name or i.callback.__name__.replace("_", "-") for i in app.registered_commands]
    for verb in ("compare", "drop", "restore", "gc", "spawn", "verify", "select"):
        assert verb in names
    for name in names:
        r = invoke(name, "--help")
        assert r.exit_code == 0, (name, r.output)
        assert "<bool>" not in r.output, name
        assert "Examples" in r.output and f"poise-git {name}" in r.output, name
    r = invoke("spawn", "--help")
    flags = [ln for ln in r.output.splitlines() if "--auto" in ln or "--no-verify" in ln]
    assert flags and all("<" not in ln.split("  ")[1] for ln in flags if "  " in ln)


def test_help_keeps_poise_toml_section_names():
    """A help text naming a setting as ``[select].k`` shows it so: unescaped, rich markup would
    read ``[select]`` as a tag and drop it, leaving ``.k`` (rendered: "default: .k in poise.toml")."""
    import click
    import typer

    from engine.config import Config

    sections = {f.name for f in __import__("dataclasses").fields(Config)}
    cmd = typer.main.get_command(_app())
    ctx = click.Context(cmd)
    checked = 0
    for name in cmd.list_commands(ctx):
        sub = cmd.get_command(ctx, name)
        raw = " ".join([sub.help or ""] + [getattr(p, "help", None) or "" for p in sub.params])
        wanted = {
            m.group(1) + m.group(2)
            for m in re.finditer(r"\\?\[(\w+)\](\.\w+)", raw)
            if m.group(1) in sections
        }
        if not wanted:
            continue
        out = CliRunner().invoke(_app(), [name, "--help"], env={"COLUMNS": "300"}).output
        for setting in wanted:
            section, key = setting.split(".", 1)
            assert f"[{section}].{key}" in out, (name, setting)
            checked += 1
    assert checked >= 5


def test_verbose_is_a_counted_flag_in_help():
    """``-v`` / ``-vv`` take no value: the help shows no ``<int>`` (which reads as ``-v 2``)."""
    out = CliRunner().invoke(_app(), ["--help"], env={"COLUMNS": "200"}).output
    row = next(ln for ln in out.splitlines() if "--verbose" in ln)
    assert "<int>" not in row, row
    assert "[default: 0]" not in out


def test_help_examples_parse():
    """Every example under a verb's ``--help`` parses with that verb's options, and ``--backend``
    names a trainer (the suite's sampler is ``--generator``)."""
    import shlex

    import click
    import typer

    from engine.cli.help import _EXAMPLES

    cmd = typer.main.get_command(_app())
    ctx = click.Context(cmd)
    for verb, lines in _EXAMPLES.items():
        for line in lines:
            words = shlex.split(line, comments=True)
            if words[:2] != ["poise-git", verb]:
                continue
            cut = [i for i, w in enumerate(words) if w in ("|", ">")]
            args = words[2 : cut[0] if cut else None]
            sub = cmd.get_command(ctx, verb)
            sub.make_context(verb, list(args), parent=ctx)  # raises on an unknown option
            if "--backend" in args:
                assert args[args.index("--backend") + 1] in ("proxy", "verl"), line


def test_spawn_help_shows_every_way_to_make_a_node(archive, cli):
    """spawn's examples show --edit, --auto and --prior; the --prior one works as written on an
    archive (here without the verification it runs by default, to stay quick)."""
    import shlex

    from engine.cli.help import _EXAMPLES

    lines = _EXAMPLES["spawn"]
    for way in ("--edit", "--auto", "--prior"):
        assert any(way in shlex.split(ln, comments=True) for ln in lines), way
    words = shlex.split(next(ln for ln in lines if "--prior" in ln), comments=True)
    prior = words[words.index("--prior") + 1]
    args = words[1:]  # spawn PARENT --prior NAME ..., less its -C
    if "-C" in args:
        del args[args.index("-C") : args.index("-C") + 2]
    r = cli(*args, "--no-verify", "-C", str(archive.path))
    assert r.returncode == 0, r.stderr
    assert archive.node(prior).parent == "grpo" and archive.read_file(prior, "PROPOSAL.md")


def test_exit_codes_are_stated_once_and_documented():
    import engine.cli as c
    from engine.cli.help import EXIT_CODES

    codes = dict(EXIT_CODES)
    assert codes.keys() == {
        c.EXIT_OK,
        c.EXIT_ERROR,
        c.EXIT_USAGE,
        c.EXIT_REJECTED,
        c.EXIT_FAILED,
        c.EXIT_INTERRUPTED,
        c.EXIT_TERMINATED,
    }
    assert (c.EXIT_REJECTED, c.EXIT_FAILED, c.EXIT_INTERRUPTED) == (3, 4, 130)
    assert c.EXIT_TERMINATED == 128 + signal.SIGTERM
    root = invoke("--help").output
    for code in codes:
        assert re.search(rf"^\s+{code}\s", root, re.M), code
    for doc in (REPO / "README.md", REPO / "docs" / "cli.md"):
        text = doc.read_text()
        for code in codes:
            assert re.search(rf"^\| `{code}` \|", text, re.M), (doc.name, code)


def test_exit_codes_end_to_end(archive, tmp_path, cli):
    a = str(archive.path)
    assert cli("log", "--no-such-option", "-C", a).returncode == 2
    assert cli("show", "-C", a).returncode == 2  # missing argument
    r = cli("show", "nope", "-C", a)
    assert r.returncode == 1 and r.stderr.strip() == "error: unknown node 'nope'"
    hostile = _edit(tmp_path, "h.py", "import os\n\ndef helper():\n    return os.getcwd()\n")
    r = cli("spawn", "grpo", "--name", "h", "--edit", str(hostile), "--no-verify", "-C", a)
    assert r.returncode == 0, r.stderr
    r = cli("verify", "h", "-C", a)  # the static check rejects it before anything runs
    assert r.returncode == 3 and "rejected" in r.stdout and "import of 'os'" in r.stdout
    assert archive.node("h").status == "rejected"


def test_ctrl_c_exits_130_with_one_line(tmp_path):
    """SIGINT while waiting on the LLM endpoint: 'interrupted', exit 130, no traceback."""
    toml = tmp_path / "poise.toml"
    toml.write_text('[propose]\nproposer = "llm"\n[llm]\napi_key_env = "POISE_TEST_KEY"\n')
    Archive.init(tmp_path / "exp", config_toml=toml.read_text())
    release = threading.Event()

    def slow(_request):
        release.wait(30)
        return "{}"

    with openai_server.ScriptedOpenAI(default=slow) as srv:
        env = dict(os.environ, PYTHONPATH=str(REPO), OPENAI_BASE_URL=srv.base_url)
        env["POISE_TEST_KEY"] = "sk-test"
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "propose", "grpo", "-C", str(tmp_path / "exp")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.time() + 60
            while not srv.requests and time.time() < deadline:
                time.sleep(0.1)
            assert srv.requests, "the request never reached the server"
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            release.set()
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err


# -- error messages -------------------------------------------------------------------------------


def test_syntax_error_in_edit_names_file_line_and_column(archive, tmp_path, cli):
    bad = _edit(
        tmp_path, "broken_edit.py", "def helper(x):\n    return (x +\n\ndef g():\n    pass\n"
    )
    r = cli("spawn", "grpo", "--name", "x", "--edit", str(bad), "-C", str(archive.path))
    assert r.returncode == 1
    (line,) = r.stderr.strip().splitlines()
    assert f'File "{bad}", line 2, column 12' in line
    assert "'(' was never closed" in line and "return (x +" in line
    assert not archive.exists("x")


# -- piped output is never cut --------------------------------------------------------------------


def test_piped_output_is_not_cut(archive, tmp_path, cli):
    a = str(archive.path)
    edit = _edit(tmp_path, "wide.py", f"def wide_helper():\n{WIDE_LINE}\n")
    r = cli(
        "spawn", "grpo", "--name", LONG, "--edit", str(edit), "--no-verify", "-C", a, env=NOPIPE
    )
    assert r.returncode == 0, r.stderr
    assert any(LONG in ln for ln in r.stdout.splitlines())
    res = _edit(tmp_path, "r.json", json.dumps({"overall": 0.5, "hard/pass@8": 0.25}))
    r = cli("record", LONG, "--results", str(res), "-C", a, env=NOPIPE)
    assert r.returncode == 0 and LONG in r.stdout
    reason = "a reason long enough to be cut at sixty characters in a terminal, " * 3
    archive.spawn("grpo", "sick")
    archive.set_status("sick", "failed", reason)
    commit = archive.node(LONG).commit
    outputs = {
        "log": cli("log", "-C", a, env=NOPIPE).stdout,
        "show": cli("show", LONG, "-C", a, env=NOPIPE).stdout,
        "select": cli("select", "--explain", "-C", a, env=NOPIPE).stdout,
        "diff": cli("diff", "grpo", LONG, "-C", a, env=NOPIPE).stdout,
    }
    for verb, out in outputs.items():
        assert any(LONG in ln for ln in out.splitlines()) or verb == "diff", (verb, out)
    assert " ".join(reason.split()) in outputs["log"]
    assert commit in outputs["show"]  # the full id, as git prints it
    for verb in ("show", "diff"):
        assert any(ln[1:] == WIDE_LINE for ln in outputs[verb].splitlines()), verb
    assert "│" not in outputs["show"].split("== results")[0]  # no frames around copyable text


def test_show_names_the_interval_once(archive, tmp_path, cli):
    """show's interval column names the interval's level once: `interval (95% Student-t over
    paired seeds)`, not `95% interval (95% Student-t ...)`; a kind that names no level keeps the
    column's `95% interval (...)`."""
    a = str(archive.path)
    record(archive, "grpo", {"metrics": {"overall": 0.5}, "intervals": {"overall": [0.4, 0.6]}})
    for pid, extra in (
        ("lab/v1", {"interval_kind": "90% bootstrap over problems"}),
        ("lab/v2", {}),
    ):
        f = tmp_path / f"{pid.replace('/', '-')}.json"
        payload = {"metrics": {"overall": 0.5}, "intervals": {"overall": [0.4, 0.6]}, **extra}
        f.write_text(json.dumps(payload))
        r = cli("record", "grpo", "--results", str(f), "--protocol", pid, "-C", a)
        assert r.returncode == 0, r.stderr
    out = cli("show", "grpo", "-C", a).stdout
    heads = [ln for ln in out.splitlines() if "metric" in ln and "interval" in ln]
    assert len(heads) == 3 and "95% interval (95%" not in out, heads
    assert "┃ interval (95% Student-t over seeds) ┃" in heads[2], heads
    assert "┃ interval (90% bootstrap over problems) ┃" in heads[0], heads
    assert "┃ 95% interval (as recorded) ┃" in heads[1], heads


def test_duplicate_mechanism_is_refused_unless_forced(archive, tmp_path, cli):
    a = str(archive.path)
    one = _edit(tmp_path, "one.py", "def helper(x):\n    return x * 2  # double\n")
    # the same mechanism: other layout, comments and a docstring
    two = _edit(tmp_path, "two.py", 'def helper(x):\n    """Twice x."""\n    return (x*2)\n')
    other = _edit(tmp_path, "three.py", "def helper(x):\n    return x * 3\n")
    assert (
        cli(
            "spawn", "grpo", "--name", "first", "--edit", str(one), "--no-verify", "-C", a
        ).returncode
        == 0
    )
    r = cli("spawn", "grpo", "--name", "again", "--edit", str(two), "--no-verify", "-C", a)
    assert r.returncode == 1 and "same mechanism as the existing node first" in r.stderr
    assert "--force" in r.stderr and not archive.exists("again")
    r = cli(
        "spawn", "grpo", "--name", "again", "--edit", str(two), "--no-verify", "--force", "-C", a
    )
    assert r.returncode == 0 and archive.exists("again")
    r = cli("spawn", "grpo", "--name", "third", "--edit", str(other), "--no-verify", "-C", a)
    assert r.returncode == 0
    from engine.archive.mechanism import TRAILER, same_mechanism

    nodes = archive.nodes()
    assert nodes["first"].trailer(TRAILER) == nodes["again"].trailer(TRAILER)
    assert nodes["third"].trailer(TRAILER) != nodes["first"].trailer(TRAILER)
    assert same_mechanism(archive, archive.algorithm("first")) == ["first", "again"]


# -- retrospect and objective directions ---------------------------------------------------------


def test_retrospect_does_not_call_a_single_parent_round_not_top(archive, cli):
    record(archive, "grpo", {"overall": 0.5})
    for name, u in (("c1", 0.55), ("c2", 0.6)):
        archive.spawn("grpo", name, trailers={"Poise-Round": "1", "Poise-Selection-Rank": "1"})
        record(archive, name, {"overall": u})
    r = cli("retrospect", "-C", str(archive.path))
    assert r.returncode == 0, r.stderr
    assert "not top" not in r.stdout and re.search(r"grpo .*best\s*│", r.stdout), r.stdout
    data = json.loads(cli("retrospect", "--json", "-C", str(archive.path)).stdout)
    assert data["rounds"][0]["hit"] is None and data["summary"]["rounds_judged"] == 0


def test_retrospect_reads_the_utilities_the_last_run_ranked(archive, cli):
    """A run with --preset tiny ranked its parents on proxy/tiny results: retrospect reads those
    (not poise.toml's proxy/default, where nothing was measured) and says so; --protocol picks."""
    from engine.loop.state import RunRecord, save_run

    record(archive, "grpo", {"overall": 0.5}, preset="tiny")
    for name, u in (("c1", 0.55), ("c2", 0.6)):
        archive.spawn("grpo", name, trailers={"Poise-Round": "1", "Poise-Selection-Rank": "1"})
        record(archive, name, {"overall": u}, preset="tiny")
    save_run(archive, RunRecord({"id": "r1", "plan": {"preset": "tiny"}}), "poise: run r1")
    data = json.loads(cli("retrospect", "--json", "-C", str(archive.path)).stdout)
    s = data["summary"]
    assert s["root_utility"] == 0.5 and data["rounds"][0]["parents"][0]["best_utility"] == 0.6
    assert s["protocol"].startswith("proxy/tiny@") and s["utility"] == "overall"
    r = cli("retrospect", "-C", str(archive.path))
    assert r.returncode == 0 and f"(U: overall, under {s['protocol']})" in r.stdout, r.stdout
    other = cli("retrospect", "--json", "--protocol", "proxy/default", "-C", str(archive.path))
    assert json.loads(other.stdout)["summary"]["root_utility"] is None


def test_select_points_at_the_last_runs_protocol_when_it_ranks_another(archive, cli):
    """select ranks under poise.toml's protocol (what a plain `run` would use next); after a run with
    --preset tiny it says that run ranked under proxy/tiny and how to see that ranking."""
    from engine.loop.state import RunRecord, save_run

    record(archive, "grpo", {"overall": 0.5})
    record(archive, "grpo", {"overall": 0.4}, preset="tiny")
    r = cli("select", "-C", str(archive.path))
    assert r.returncode == 0 and "last run" not in r.stdout, r.stdout
    rec = save_run(archive, RunRecord({"id": "r1", "plan": {"preset": "tiny"}}), "poise: run r1")
    r = cli("select", "-C", str(archive.path))
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert "the last run ranked its parents under proxy/tiny@" in flat, r.stdout
    assert "--protocol proxy/tiny shows that ranking" in flat
    r = cli("select", "--protocol", "proxy/tiny", "-C", str(archive.path))
    assert r.returncode == 0 and "last run" not in r.stdout
    save_run(archive, RunRecord({"id": "r2", "plan": {}}, rec.commit), "poise: run r2")
    assert "last run" not in cli("select", "-C", str(archive.path)).stdout


def test_select_ranks_whatever_state_the_run_record_is_in(archive, cli):
    """The pointer at the last run's protocol is a hint: a run record that cannot be read (damaged,
    or written by something else) leaves select's ranking and exit status as they are."""
    from engine.loop.state import RUN_FILE, RUN_REF

    record(archive, "grpo", {"overall": 0.5})
    oid = archive.git.write_blobs([b"[1, 2]"])[0]
    tree = archive.git.write_tree({RUN_FILE: ("100644", oid)})
    archive.git.update_ref(RUN_REF, archive.git.commit_tree(tree, [], "damaged"), None, "test")
    r = cli("select", "-C", str(archive.path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "chosen: grpo" in r.stdout and "last run" not in r.stdout


def _metrics(overall: float, length: float) -> dict:
    return {
        "overall": overall,
        "mean_length": length,
        "hard/pass@8": overall / 2,
        "hard/mean_length": length,
        "easy/acc@1": 0.9,
    }


def test_select_explains_the_direction_of_every_objective(tmp_path, cli):
    toml = '[experiment]\ndirective = "make answers shorter"\n[experiment.directions]\n"easy/acc@1" = "max"\n'
    arch = Archive.init(tmp_path / "exp", config_toml=toml)
    record(arch, "grpo", _metrics(0.5, 30.0))
    arch.spawn("grpo", "short")
    record(arch, "short", _metrics(0.5, 10.0))
    r = cli("select", "--json", "-C", str(arch.path))
    dirs = {d["metric"]: d for d in json.loads(r.stdout)["params"]["directions"]}
    assert dirs["hard/mean_length"]["direction"] == "min"
    assert dirs["hard/mean_length"]["why"] == "length directive"
    assert dirs["easy/acc@1"]["why"] == "poise.toml [experiment.directions]"
    assert dirs["overall"]["direction"] == "max" and dirs["hard/pass@8"]["direction"] == "max"
    r = cli("select", "--explain", "-C", str(arch.path))
    assert "hard/mean_length: min (lower is better; from length directive)" in r.stdout
    assert "overall: max (higher is better; from default)" in r.stdout


def test_lengths_are_never_maximized_by_default():
    from engine.config import ExperimentConfig, metric_direction, parse_config, utility
    from engine.select.pareto import default_objectives, parse_objectives

    plain = ExperimentConfig()
    ms = [_metrics(0.5, 30.0), _metrics(0.4, 10.0)]
    objs = dict(default_objectives(ms, "overall", 0.0, plain))
    assert "hard/mean_length" not in objs and objs["hard/pass@8"] == 1.0  # no length directive
    short = ExperimentConfig(length_penalty=0.001)
    assert dict(default_objectives(ms, "overall", 0.001, short))["hard/mean_length"] == -1.0
    assert parse_objectives(["overall", "mean_length"], short) == [
        ("overall", 1.0),
        ("mean_length", -1.0),
    ]
    assert (
        metric_direction("mean_length", ExperimentConfig(directive="Compress the reasoning"))[0]
        == "min"
    )
    # the default poise.toml states the direction of mean_length explicitly
    from engine.config import DEFAULT_TOML

    cfg = parse_config(DEFAULT_TOML).experiment
    assert metric_direction("mean_length", cfg) == ("min", "poise.toml [experiment.directions]")
    # a length objective is minimized: U is always higher-is-better
    exp = ExperimentConfig(objective="mean_length")
    assert utility({"mean_length": 10.0}, exp) > utility({"mean_length": 30.0}, exp)
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match='must be "max" or "min"'):
        parse_config('[experiment.directions]\noverall = "up"\n')


def test_sigusr1_dumps_every_threads_stack_and_the_command_goes_on(tmp_path):
    code = (
        "import os, signal, threading, time\n"
        "from engine.cli import _stack_dumps\n"
        "_stack_dumps()\n"
        "def waiting_in_a_worker():\n"
        "    time.sleep(3)\n"
        "threading.Thread(target=waiting_in_a_worker, daemon=True).start()\n"
        "time.sleep(0.3)\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "time.sleep(0.3)\n"
        "print('still running')\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "still running"
    assert "waiting_in_a_worker" in res.stderr and "Current thread" in res.stderr


@pytest.mark.slow
def test_a_path_with_brackets_and_spaces_is_printed_whole_and_quoted_in_commands(tmp_path, cli):
    """Markup would read ``[exp]`` in a path as a tag and drop it: paths are printed as they are,
    and in a command to copy (drop's undo) they are shell-quoted, so the command runs as printed."""
    import shlex
    import subprocess

    path = tmp_path / "[exp] one"
    r = cli("init", str(path))
    assert r.returncode == 0 and f"archive in {path} with" in " ".join(r.stdout.split()), r.stdout
    from engine.archive.store import Archive

    Archive(path).spawn("grpo", "child")
    r = cli("drop", "child", "-C", str(path))
    assert r.returncode == 0, r.stderr
    undo = next(ln for ln in r.stdout.splitlines() if ln.startswith("undo with: "))
    assert undo == f"undo with: poise-git restore child -C {shlex.quote(str(path))}"
    argv = shlex.split(undo.removeprefix("undo with: poise-git "))
    assert argv[-1] == str(path)
    assert cli(*argv).returncode == 0
    assert "child" in cli("log", "-C", str(path)).stdout
    r = cli("report", "-C", str(path))
    assert r.returncode == 0 and str(path / ".poise" / "report" / "index.html") in r.stdout
    assert subprocess.run(["git", "-C", str(path), "fsck"], capture_output=True).returncode == 0


def test_propose_tells_same_named_proposals_apart():
    """The offline proposer may draw one component twice with other hyperparameters under one
    name; ``propose`` then labels each with its hyperparameters, so that "dropped NAME" is not
    read as the kept NAME. A name used once stays bare."""
    from engine.cli.operator_cmds import proposal_labels
    from engine.operators.propose import Proposal

    def prop(name, **hp):
        return Proposal(
            name=name, motivation="m", mechanism="x", expected_effect="e", hyperparameters=hp
        )

    kept = [prop("grpo-annealed", entropy_coef_max=0.0106), prop("grpo-kl0", kl_coef=0.0)]
    dropped = [prop("grpo-annealed", entropy_coef_max=0.0327)]
    labels = proposal_labels(kept, dropped)
    assert labels[id(kept[0])] == "grpo-annealed (entropy_coef_max=0.0106)"
    assert labels[id(dropped[0])] == "grpo-annealed (entropy_coef_max=0.0327)"
    assert labels[id(kept[1])] == "grpo-kl0"


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("propose", "Exit code 3 when no proposal survives screening"),
        ("run", "Exit code 3 (4) when the root's verification rejects it"),
        ("spawn", "Exit code 3 when verification rejects"),
        ("evaluate", "Exit code 4 when the candidate fails"),
    ],
)
def test_help_names_the_exit_codes_docs_cli_gives_the_command(command, says):
    """docs/cli.md's exit-code table names these commands; their --help says so too."""
    p = run_cli(command, "--help", env={"COLUMNS": "400"})
    assert p.returncode == 0 and says in " ".join(p.stdout.split()), p.stdout


def test_spawn_says_its_own_time_apart_from_the_verifications(archive, tmp_path, cli):
    edit = _edit(tmp_path, "h.py", "import os\n\ndef helper():\n    return os.getcwd()\n")
    r = cli("spawn", "grpo", "--name", "h", "--edit", str(edit), "-C", str(archive.path))
    assert r.returncode == 3, r.stderr  # the static check rejects it: no sandbox started
    assert re.search(r"^spawned h from grpo at [0-9a-f]{10} \(spawn \d+ ms\)$", r.stdout, re.M)
    assert re.search(r"^h rejected in \d+\.\d s: .*import of 'os'", r.stdout, re.M)
