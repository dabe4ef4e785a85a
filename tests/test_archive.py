"""The archive on real git repositories: spawn, records, lineage reads, bad input, concurrency, clones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from results_util import record

from engine.archive.results import UNITS
from engine.archive.store import ALGORITHM, Archive, check_name
from engine.errors import ArchiveError, EditError
from trainer_template import ALGORITHM_FILE

EDIT = """\
def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:
    # centred only: Dr.GRPO
    scores = batch.rewards.to(torch.float32)
    return scores - group_stats(scores, batch.group).mean
"""


def git(path: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(path), *args], check=True, capture_output=True, text=True
    ).stdout


def refs(path: Path) -> list[str]:
    return git(path, "for-each-ref", "--format=%(refname) %(objectname)").splitlines()


def test_init_creates_root_node(archive):
    nodes = archive.nodes()
    assert list(nodes) == ["grpo"]
    root = nodes["grpo"]
    assert root.parents == () and root.status == "spawned" and root.depth == 0
    assert archive.algorithm("grpo") == ALGORITHM_FILE.read_text()
    assert archive.read_file("grpo", "poise.toml").startswith("# poise-git")
    assert "Poise-Node: grpo" in git(archive.path, "log", "-1", "--format=%B", "poise/grpo")
    assert archive.config().evaluation.backend == "proxy"
    assert archive.fsck()


def test_init_refuses_non_empty_dir(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("hi")
    with pytest.raises(ArchiveError, match="not empty"):
        Archive.init(tmp_path / "x")


@pytest.mark.parametrize("command", ["init", "run"])
def test_a_directory_that_cannot_be_created_is_one_error_line(cli, tmp_path, command):
    """``init DIR`` (and ``run -C DIR``, which creates it) under a path that is a file: one
    ``error:`` line naming the directory, no traceback."""
    (tmp_path / "file").write_text("not a directory")
    target = tmp_path / "file" / "exp"
    args = (
        ["init", str(target)] if command == "init" else ["run", "-C", str(target), "--rounds", "1"]
    )
    p = cli(*args)
    assert p.returncode == 1, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot create"), p.stderr
    assert str(target) in err[0] and "Traceback" not in p.stderr


def test_open_non_archive(tmp_path):
    with pytest.raises(ArchiveError, match="not a poise-git archive"):
        Archive(tmp_path)


def test_an_archive_directory_that_does_not_exist_is_said_so(tmp_path, cli):
    """`-C DIR` where DIR does not exist (or is a file) says that, not "no git repository", for
    every command that opens an archive; nothing is created."""
    missing, afile = tmp_path / "nope", tmp_path / "notes.txt"
    afile.write_text("x")
    for args in (["log"], ["show", "grpo"], ["select"], ["evaluate", "grpo"], ["gc", "--dry-run"]):
        p = cli(*args, "-C", str(missing))
        err = p.stderr.strip().splitlines()
        assert p.returncode == 1 and len(err) == 1, (args, p.stderr)
        assert err[0].startswith(f"error: {missing} does not exist"), (args, err)
        assert "git repository" not in err[0] and not missing.exists()
    p = cli("log", "-C", str(afile))
    assert p.returncode == 1 and p.stderr.startswith(f"error: {afile} is not a directory"), p.stderr


def test_spawn_replaces_definition_and_preserves_other_bytes(archive):
    parent = archive.algorithm("grpo")
    node = archive.spawn("grpo", "dr", EDIT, proposal="# Dr.GRPO\nno std\n")
    child = archive.algorithm("dr")
    assert node.parents == ("grpo",) and node.status == "spawned"
    assert "# centred only: Dr.GRPO" in child
    # Everything before and after compute_advantages is byte-for-byte the parent's.
    head = parent[: parent.index("def compute_advantages")]
    tail = parent[parent.index("def policy_loss") :]
    assert child.startswith(head) and child.endswith(tail)
    assert archive.read_file("dr", "PROPOSAL.md") == "# Dr.GRPO\nno std\n"
    assert archive.children("grpo") == ["dr"] and archive.parents("dr") == ["grpo"]
    assert archive.nodes()["dr"].depth == 1


def test_a_commented_replacement_keeps_the_blank_lines_before_it(archive):
    """An edit whose definition carries a leading comment replaces the parent's comment, not the
    blank lines separating the definition from the one above: only the definition changes."""
    edit = "# Dr.GRPO: centred only\n" + EDIT
    archive.spawn("grpo", "commented", edit)
    parent, child = archive.algorithm("grpo"), archive.algorithm("commented")
    head = parent[: parent.index("def compute_advantages")]
    assert child.startswith(head + "# Dr.GRPO: centred only\ndef compute_advantages"), child[
        len(head) - 80 : len(head) + 80
    ]
    assert child.endswith(parent[parent.index("def entropy_coefficient") :])


def test_spawn_appends_new_definitions_and_imports(archive):
    edit = "import math\n\nLENGTH_FLOOR = 0.5\n\n\ndef helper(x):\n    return math.sqrt(x)\n"
    archive.spawn("grpo", "h", edit)
    parent, child = archive.algorithm("grpo"), archive.algorithm("h")
    assert child.endswith("def helper(x):\n    return math.sqrt(x)\n")
    assert "LENGTH_FLOOR = 0.5" in child and "import math\n" in child
    assert child.replace("import math\n", "", 1).startswith(parent[:-1])


def test_edit_of_hyperparameters_class(archive):
    edit = '''\
@dataclass
class Hyperparameters:
    eps: float = 1e-6
    """floor"""
    norm_adv_by_std: bool = False
    """no std"""
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    loss_agg_mode: str = "seq-mean-token-sum-norm"
    kl_coef: float = 0.0
    kl_type: str = "low_var_kl"
    entropy_coef: float = 0.0
'''
    archive.spawn("grpo", "dapo", edit)
    src = archive.algorithm("dapo")
    assert "clip_ratio_high: float = 0.28" in src and src.count("class Hyperparameters") == 1


def test_git_diff_is_meaningful(archive):
    archive.spawn("grpo", "dr", EDIT)
    diff = git(archive.path, "diff", "poise/grpo", "poise/dr", "--", ALGORITHM)
    assert (
        "-    return grpo_advantages(batch, cfg)" in diff and "+    # centred only: Dr.GRPO" in diff
    )
    assert archive.diff("grpo", "dr", [ALGORITHM]) == diff


def test_records_are_further_commits_never_rewrites(archive):
    archive.spawn("grpo", "dr", EDIT)
    first = archive.tip("dr")
    record(archive, "dr", {"overall": 0.51, "mean_length": 20})
    archive.record_reflection("dr", "# Reflection\nentropy stayed high\n")
    log = git(archive.path, "log", "--format=%H", "poise/dr").split()
    assert (
        first in log and len(log) == 4
    )  # root, spawn, results, reflection: the spawn stays an ancestor
    n = archive.node("dr")
    assert n.status == "evaluated" and n.metrics == {"overall": 0.51, "mean_length": 20.0}
    assert n.parents == ("grpo",) and archive.read_file("dr", "REFLECTION.md").startswith(
        "# Reflection"
    )
    assert archive.spawn_commit("dr") == first


def test_child_does_not_inherit_node_files(archive):
    record(archive, "grpo", {"overall": 0.4})
    archive.record_reflection("grpo", "root reflection")
    archive.spawn("grpo", "c", EDIT)
    files = git(archive.path, "ls-tree", "-r", "--name-only", "poise/c").split()
    assert not any(f.startswith("results/") for f in files) and "REFLECTION.md" not in files
    assert "results/proxy/default.json" in git(
        archive.path, "ls-tree", "-r", "--name-only", "poise/grpo"
    )
    assert archive.node("c").results == {} and archive.node("c").result is None


def test_crossover_has_two_parents(archive):
    archive.spawn("grpo", "a", EDIT)
    archive.spawn("grpo", "b", "X_SCALE = 2.0\n")
    node = archive.spawn(["a", "b"], "ab", "Y = 1\n")
    assert archive.node("ab").parents == ("a", "b") == node.parents
    assert len(git(archive.path, "log", "-1", "--format=%P", "poise/ab").split()) == 2
    assert set(archive.children("b")) == {"ab"}


@pytest.mark.parametrize(
    "args,expect",
    [
        (["spawn", "nope", "--name", "x"], "unknown parent node 'nope'"),
        (["spawn", "grpo", "--name", "grpo"], "already exists"),
        # the name is taken: said before the mechanism is compared with the nodes'
        (["spawn", "grpo", "--name", "grpo", "--edit", "{same}"], "already exists"),
        (["spawn", "grpo", "--name", "grpo", "--edit", "{same}", "--force"], "already exists"),
        (["spawn", "grpo", "--name", "bad..name"], "invalid node name"),
        (["spawn", "grpo", "--name", "x.lock"], "invalid node name"),
        (["spawn", "grpo", "--name", "a b"], "invalid node name"),
        (["spawn", "grpo", "--name", "x", "--edit", "{syntax}"], "syntax error"),
        (
            ["spawn", "grpo", "--name", "x", "--edit", "{drop}"],
            "drops the interface function compute_advantages",
        ),
        (
            ["spawn", "grpo", "--name", "x", "--edit", "{resign}"],
            "changes the signature of the interface function policy_loss",
        ),
        (["spawn", "grpo", "--name", "x", "--edit", "{missing}"], "does not exist"),
        (["spawn", "grpo", "--name", "x", "--edit", "{stmt}"], "only hold top-level definitions"),
        (["show", "nope"], "unknown node 'nope'"),
        (["record", "grpo", "--results", "{badjson}"], "not valid JSON"),
        (["record", "grpo", "--results", "{nan}"], "must be a finite number"),
    ],
)
def test_bad_input_one_clear_line_and_nothing_written(archive, cli, tmp_path, args, expect):
    files = {
        "syntax": "def compute_advantages(batch, cfg:\n    return 1\n",
        "drop": "compute_advantages = None\n",
        "resign": "def policy_loss(log_prob, advantages, cfg):\n    return 0, {}\n",
        "missing": str(tmp_path / "nope.py"),
        "stmt": "print('hello')\n",
        "same": (  # the root's own entropy_coefficient: its mechanism, a node that exists
            "def entropy_coefficient(\n"
            "    cfg: Hyperparameters, state: TrainingState | None, measured_entropy: float\n"
            ") -> float:\n    return cfg.entropy_coef\n"
        ),
        "badjson": "{not json",
        "nan": '{"overall": NaN}',
    }
    real = []
    for a in args:
        if a.startswith("{") and a.endswith("}") and a[1:-1] in files:
            key = a[1:-1]
            if key == "missing":
                real.append(files[key])
            else:
                p = tmp_path / f"{key}.txt"
                p.write_text(files[key])
                real.append(str(p))
        else:
            real.append(a)
    before = refs(archive.path)
    objects_before = git(archive.path, "count-objects")
    proc = cli(*real, "--archive", str(archive.path))
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and expect in err[0], proc.stderr
    assert refs(archive.path) == before
    assert git(archive.path, "count-objects") == objects_before or "spawn" not in args[0]
    assert archive.fsck()


_DEEP = "[" * 100_000 + "]" * 100_000
_BIG = json.dumps({"metrics": {"overall": 0.5}, "notes": "x" * 1_100_000})
_MANY = json.dumps({f"m{i}": 0.5 for i in range(2001)} | {"overall": 0.5})


def _nested(**kw) -> str:
    return json.dumps({"metrics": {"overall": 0.5}, **kw})


@pytest.mark.parametrize(
    "text,args,expect",
    [
        (_nested(intervals={"overall": 0.4}), [], "the interval of 'overall' must be [low, high]"),
        (
            _nested(intervals={"overall": [0.4]}),
            [],
            "the interval of 'overall' must be [low, high]",
        ),
        (_nested(intervals={"overall": ["a", "b"]}), [], "must be [low, high], two finite numbers"),
        (_nested(intervals=[0.4, 0.6]), [], "intervals must be an object"),
        (_nested(intervals={"overall": [0.9, 0.95]}), [], "does not contain its value 0.5"),
        (_nested(intervals={"other": [0.4, 0.6]}), [], "intervals name 'other', which is not"),
        (_nested(seeds=5), [], "seeds must be a list of non-negative integers, got 5"),
        (_nested(seeds=["x"]), [], "seeds must be a list of non-negative integers"),
        (_nested(seeds="12"), [], "seeds must be a list of non-negative integers, got '12'"),
        (_nested(seeds=[1.9, True]), [], "got 1.9 in it"),
        (_nested(seeds=[True]), [], "got True in it"),
        (_nested(seeds=[-1]), [], "got -1 in it"),
        (_nested(seeds=[1, 1]), [], "seeds must be distinct"),
        (_nested(units={"overall": ["x"]}), [], "the unit of 'overall' must be one of fraction"),
        (_nested(units={"overall": "furlongs"}), [], "the unit of 'overall' must be one of"),
        (_nested(units=["x"]), [], "units must be an object of metric name -> unit"),
        (_nested(protocol=5), [], "protocol must be a protocol id, got 5"),
        (_nested(protocol="other/x"), ["--protocol", "lab/v1"], "'other/x' but --protocol says"),
        (json.dumps({"overall": "0.5"}), [], "metric 'overall' must be a finite number, got '0.5'"),
        (json.dumps({"overall": 0.5, "seeds": [1]}), [], 'beside a "metrics" object'),
        (_DEEP, [], "nests too deeply"),
        (_BIG, [], "is 1.1 MB; at most 1 MB is read"),
        (_MANY, [], "results hold 2002 metrics; a recorded result may hold at most 2000"),
    ],
    ids=[
        "interval-number",
        "interval-one",
        "interval-strings",
        "intervals-list",
        "interval-excludes-value",
        "interval-not-metric",
        "seeds-int",
        "seeds-strings",
        "seeds-string",
        "seeds-fraction-bool",
        "seeds-bool",
        "seeds-negative",
        "seeds-repeated",
        "unit-list",
        "unit-unknown",
        "units-list",
        "protocol-number",
        "protocol-conflict",
        "metric-string",
        "flat-seeds",
        "deep",
        "big",
        "many",
    ],
)
def test_record_refuses_malformed_results_with_one_line(archive, cli, tmp_path, text, args, expect):
    res = tmp_path / "r.json"
    res.write_text(text)
    before = refs(archive.path)
    proc = cli("record", "grpo", "--results", str(res), *args, "-C", str(archive.path))
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(err) == 1 and err[0].startswith("error:") and expect in err[0], proc.stderr
    assert refs(archive.path) == before and archive.node("grpo").results == {}


def test_record_takes_whole_seeds_an_exact_interval_and_the_files_protocol(archive, cli, tmp_path):
    res = tmp_path / "r.json"
    res.write_text(_nested(intervals={"overall": [0.5, 0.5]}, seeds=[0, 1.0, 2], protocol="lab/v1"))
    a = str(archive.path)
    for args in ([], ["--protocol", "lab/v1"]):  # an explicit id that agrees is no conflict
        proc = cli("record", "grpo", "--results", str(res), *args, "-C", a)
        assert proc.returncode == 0 and "under lab/v1" in proc.stdout, proc.stderr
    result = archive.node("grpo").results["lab/v1"]
    assert result.seeds == (0, 1, 2) and result.interval("overall") == (0.5, 0.5)
    res.write_text(json.dumps({"overall": 0.5}))
    proc = cli("record", "grpo", "--results", str(res), "-C", a)
    assert proc.returncode == 0 and "under external" in proc.stdout, proc.stderr


def test_record_help_lists_every_unit(cli):
    out = " ".join(cli("record", "--help", env={"COLUMNS": "400"}).stdout.split())
    assert " | ".join(UNITS) in out


def test_check_name_agrees_with_git(tmp_path):
    for good in ["a", "dr-grpo", "v1.2_b", "X9"]:
        check_name(good)
        assert (
            subprocess.run(["git", "check-ref-format", f"refs/heads/poise/{good}"]).returncode == 0
        )
    for bad in ["", ".a", "a..b", "a/b", "a.lock", "a.", "a b", "a~1", "a:b", "-a", "a" * 101]:
        with pytest.raises(ArchiveError):
            check_name(bad)


def test_edit_errors_are_edit_errors(archive):
    with pytest.raises(EditError):
        archive.spawn("grpo", "x", "def policy_loss(a):\n    pass\n")
    assert not archive.exists("x")


_SPAWNER = """
import sys
sys.path.insert(0, {repo!r})
sys.path.insert(0, {repo!r} + "/tests")
from engine.archive.store import Archive
from results_util import record
arch = Archive({path!r})
name = sys.argv[1]
arch.spawn("grpo", name, "SCALE_" + name.replace("-", "_") + " = 1.0\\n", proposal="p " + name)
record(arch, "grpo", {{"overall": 0.1, "writer": float(name.split("-")[1]) / 10}})
"""


@pytest.mark.slow
def test_eight_concurrent_spawners_all_succeed(archive, tmp_path):
    script = tmp_path / "spawner.py"
    script.write_text(
        _SPAWNER.format(repo=str(Path(__file__).resolve().parents[1]), path=str(archive.path))
    )
    procs = [
        subprocess.Popen([sys.executable, str(script), f"w-{i}"], stderr=subprocess.PIPE)
        for i in range(8)
    ]
    errors = [p.communicate()[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    nodes = archive.nodes()
    assert {f"w-{i}" for i in range(8)} <= set(nodes)
    assert all(nodes[f"w-{i}"].parents == ("grpo",) for i in range(8))
    # 8 concurrent records on one branch: compare-and-swap retries lose none of them.
    results_commits = git(archive.path, "log", "--format=%s", "poise/grpo").count(
        "poise: results for grpo"
    )
    assert results_commits == 8
    assert archive.fsck()


def test_clone_and_read_back(archive, tmp_path):
    archive.spawn("grpo", "a", EDIT, proposal="A")
    archive.spawn("a", "b", "BETA = 2.0\n")
    record(archive, "b", {"overall": 0.7})
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "-q", "--mirror", str(archive.path), str(clone / ".git")], check=True
    )
    subprocess.run(["git", "-C", str(clone), "config", "--bool", "core.bare", "false"], check=True)
    copy = Archive(clone)
    got = {n.name: (n.parents, n.status, n.overall, n.depth) for n in copy.nodes().values()}
    want = {n.name: (n.parents, n.status, n.overall, n.depth) for n in archive.nodes().values()}
    assert got == want and got["b"] == (("a",), "evaluated", 0.7, 2)
    assert copy.algorithm("b") == archive.algorithm("b")


def test_a_plain_clone_says_which_nodes_it_lacks(archive, tmp_path, cli):
    archive.spawn("grpo", "a", EDIT, proposal="A")
    archive.spawn("a", "b", "BETA = 2.0\n")
    clone = tmp_path / "plain"
    subprocess.run(["git", "clone", "-q", str(archive.path), str(clone)], check=True)
    res = cli("log", "-C", str(clone))
    assert res.returncode == 0
    err = " ".join(res.stderr.split())
    assert "2 node(s) of origin are only remote-tracking branches here (a, b)" in err
    assert "fetch origin 'refs/heads/poise/*:refs/heads/poise/*'" in err
    assert set(Archive(clone).remote_only()) == {"a", "b"}  # only the checked-out branch came
    spec = "refs/heads/poise/*:refs/heads/poise/*"
    subprocess.run(["git", "-C", str(clone), "fetch", "-q", "origin", spec], check=True)
    assert Archive(clone).remote_only() == {}
    assert set(Archive(clone).nodes()) == {"grpo", "a", "b"}
    res = cli("log", "-C", str(clone))
    assert res.returncode == 0 and "remote-tracking" not in res.stderr


def test_an_error_is_printed_as_written_not_as_markup(cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[select]\nbeta = "x"\n')
    res = cli("init", str(tmp_path / "a"), "--config", str(bad))
    assert res.returncode == 1
    # [select] kept, not read as markup; the file named is the one --config gave
    assert f"error: {bad}: [select].beta must be a number" in res.stderr


@pytest.mark.slow  # a dozen CLI processes
def test_cli_tour(archive, cli, tmp_path):
    edit = tmp_path / "edit.py"
    edit.write_text(EDIT)
    prop = tmp_path / "P.md"
    prop.write_text("# Dr.GRPO\nDrop the std.\n")
    a = str(archive.path)
    p = cli(
        "spawn",
        "grpo",
        "--name",
        "dr",
        "--edit",
        str(edit),
        "--proposal",
        str(prop),
        "--archive",
        a,
    )
    assert p.returncode == 0, p.stderr
    assert (
        "spawned dr from grpo" in p.stdout
        and "algorithm.py" in p.stdout
        and "PROPOSAL.md" in p.stdout
    )
    res = tmp_path / "r.json"
    res.write_text(json.dumps({"overall": 47.8, "mean_length": 812}))
    rec = ("record", "dr", "--results", str(res), "--protocol", "lab/math6", "--unit", "percent")
    assert cli(*rec, "--archive", a).returncode != 0  # mean_length 812 is no percentage
    res.write_text(
        json.dumps(
            {"metrics": {"overall": 47.8, "mean_length": 812}, "units": {"mean_length": "words"}}
        )
    )
    assert cli(*rec, "--archive", a).returncode == 0
    p = cli("log", "--archive", a)
    assert p.returncode == 0 and "grpo" in p.stdout and "└── dr" in p.stdout and "47.8" in p.stdout
    assert "lab/math6" in p.stdout  # labelled with its protocol: not the experiment's proxy/default
    data = json.loads(cli("log", "--json", "-C", a).stdout)
    assert [r["node"] for r in data] == ["grpo", "dr"] and data[1]["overall"] is None
    assert data[1]["results"]["lab/math6"] == {
        "status": "evaluated",
        "overall": 47.8,
        "unit": "percent",  # with what it measured
        "interval": None,
        "interval_kind": "",
        "seeds": [],
        "protocol": "lab/math6",
    }
    data = json.loads(cli("log", "--json", "--protocol", "lab/math6", "-C", a).stdout)
    assert data[1]["overall"] == 47.8
    p = cli("show", "dr", "-C", a)
    assert (
        p.returncode == 0
        and "Dr.GRPO" in p.stdout
        and "mechanism diff vs grpo" in p.stdout
        and "47.8" in p.stdout
    )
    p = cli("diff", "grpo", "dr", "-C", a)
    assert (
        p.returncode == 0
        and "+    # centred only: Dr.GRPO" in p.stdout
        and "PROPOSAL.md" not in p.stdout
    )
    p = cli("diff", "grpo", "dr", "--all", "-C", a)
    assert "PROPOSAL.md" in p.stdout and "results/lab/math6.json" in p.stdout
    # --archive defaults to the current directory, like git.
    p = cli("log", cwd=archive.path)
    assert p.returncode == 0 and "dr" in p.stdout


def _log_lines(cli, archive) -> dict[str, str]:
    out = cli("log", "-C", str(archive.path)).stdout
    return {
        n: next(ln for ln in out.splitlines() if f" {n} " in f" {ln} ") for n in ("grpo", "dr")
    } | {"out": out}


def test_cli_log_never_shows_values_of_other_units_or_protocols_unmarked(archive, cli, tmp_path):
    archive.spawn("grpo", "dr")
    res = tmp_path / "r.json"
    res.write_text(json.dumps({"overall": 47.8}))
    rec = ("record", "dr", "--results", str(res), "--protocol", "lab/math6", "--unit", "percent")
    assert cli(*rec, "-C", str(archive.path)).returncode == 0
    record(archive, "grpo", {"overall": 0.53}, preset="smoke")
    # no node has a result under the compared proxy/default: a fraction and a percentage, each
    # marked with what it is, and a line that says none is under the compared protocol
    lines = _log_lines(cli, archive)
    assert "0.53 (proxy/smoke, fraction)" in lines["grpo"], lines["out"]
    assert "47.8 (lab/math6, percent)" in lines["dr"], lines["out"]
    assert "no node has a result under proxy/default" in lines["out"]
    # the root under the compared protocol: its value bare, the line says what bare values are
    record(archive, "grpo", {"overall": 0.61})
    lines = _log_lines(cli, archive)
    assert "overall 0.61" in lines["grpo"] and "(proxy/" not in lines["grpo"], lines["out"]
    assert "47.8 (lab/math6, percent)" in lines["dr"], lines["out"]
    assert "overall under proxy/default (fraction)" in lines["out"]
    # every value under the compared protocol: the line names it, its unit and the seeds
    record(archive, "dr", {"overall": 0.58})
    lines = _log_lines(cli, archive)
    assert "overall 0.58" in lines["dr"] and "percent" not in lines["out"], lines["out"]
    assert "values: overall under proxy/default@" in lines["out"]
    assert "not comparable" not in lines["out"]


def test_cli_init_and_help(cli, tmp_path):
    p = cli("init", str(tmp_path / "e"))
    assert p.returncode == 0 and "poise/grpo" in p.stdout
    assert Archive(tmp_path / "e").nodes()["grpo"].status == "spawned"
    p = cli("init", str(tmp_path / "e"))
    assert p.returncode == 1 and "not empty" in p.stderr
    p = cli("--help")
    assert p.returncode == 0 and "spawn" in p.stdout and "record" in p.stdout


def test_console_script_is_declared():
    import tomllib

    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["poise-git"] == "engine.cli:main"


def test_spawn_prints_what_the_child_carries_not_its_parents_records(archive, cli, tmp_path):
    """The summary after a spawn lists the files the spawn wrote; the parent's results, verification
    and tests, which a child never inherits, are not shown as deletions."""
    record(archive, "grpo", {"overall": 0.5})
    archive.commit_files(
        "grpo", {"verification.json": "{}\n", "tests/test_x.py": "x = 1\n"}, subject="poise: checks"
    )
    edit = tmp_path / "e.py"
    edit.write_text(EDIT)
    p = cli(
        "spawn", "grpo", "--name", "dr", "--edit", str(edit), "--no-verify", "-C", str(archive.path)
    )
    assert p.returncode == 0, p.stderr
    assert "algorithm.py" in p.stdout
    for inherited in ("results/", "verification.json", "tests/"):
        assert inherited not in p.stdout, p.stdout
    assert "1 file changed" in p.stdout


def test_log_says_what_its_values_are_when_all_are_under_the_compared_protocol(archive, cli):
    """A bare ``overall 0.65`` says neither its protocol, unit nor seeds: a last line does."""
    record(archive, "grpo", {"metrics": {"overall": 0.5}, "seeds": [0, 1]})
    archive.spawn("grpo", "dr", EDIT)
    record(archive, "dr", {"metrics": {"overall": 0.6}, "seeds": [0, 1, 2]})
    p = cli("log", "-C", str(archive.path))
    assert p.returncode == 0, p.stderr
    key = archive.nodes()["grpo"].result.protocol.key
    last = p.stdout.strip().splitlines()[-1]
    assert last == f"values: overall under {key} (fraction), each node's mean over its 2–3 seeds"
