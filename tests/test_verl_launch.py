"""The verl launch from plain values: trainer_template builds it without an archive or MLflow, and
without executing the node's code (the layering itself is checked on the source by test_layers.py);
the engine's glue (engine.operators.verl_launch) reads the node, has its settings read in a
sandboxed child (engine.operators.verl_settings), checks what the child sends, opens the run and
passes its id. The engine's process never executes the node's code."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from trainer_template import ALGORITHM_FILE
from trainer_template.verl_backend.launch import prepare_launch

ROOT = ALGORITHM_FILE.read_text()
FIELDS_END = '    """weight of the entropy bonus (subtracted from the loss)"""\n'


def with_post_init(body: str) -> str:
    """The root's algorithm.py whose Hyperparameters gains ``__post_init__`` running ``body``."""
    assert ROOT.count(FIELDS_END) == 1
    block = "".join(f"        {ln}\n" for ln in body.strip("\n").splitlines())
    return ROOT.replace(
        FIELDS_END, f"{FIELDS_END}\n    def __post_init__(self) -> None:\n{block}", 1
    )


WIDENED = with_post_init("self.clip_ratio_high = 2 * self.clip_ratio_low")
CHECKED = with_post_init(
    "if self.clip_ratio_high < self.clip_ratio_low:\n"
    "    raise ValueError('clip_ratio_high is below clip_ratio_low')"
)


def loaded_here(node: str) -> list[str]:
    """The modules ``trainer_template.loader`` made of ``node``'s code in this process."""
    return sorted(k for k in sys.modules if k.startswith(f"poise_algorithm_{node}_"))


def test_launch_is_built_from_plain_values(tmp_path):
    launch = prepare_launch(
        "cand",
        "raise RuntimeError('the launch executed the node')\n",  # text it writes, never runs
        {"clip_ratio_high": 0.28, "kl_coef": None},
        work_dir=tmp_path / "verl",
        tracking_uri="sqlite:////x/mlflow.db",
        run_id="r123",
        project="exp",
        hparams={"clip_ratio_high": 0.28},
        dry_run=True,
    )
    assert launch.env["MLFLOW_TRACKING_URI"] == "sqlite:////x/mlflow.db"
    assert launch.env["MLFLOW_RUN_ID"] == "r123"
    assert "actor_rollout_ref.actor.clip_ratio_high=0.28" in launch.overrides
    assert "actor_rollout_ref.actor.clip_ratio_low=0.2" in launch.overrides  # the protocol's
    assert "actor_rollout_ref.actor.kl_loss_coef=0.001" in launch.overrides  # null: the protocol's
    assert "trainer.project_name=exp" in launch.overrides
    assert launch.files["algorithm"] == str(tmp_path / "verl" / "nodes" / "cand" / "algorithm.py")
    assert not (tmp_path / "verl").exists()  # a dry run writes nothing


@pytest.mark.slow
def test_engine_glue_reads_the_node_and_refuses_bad_hparams_before_any_run(archive):
    from engine.operators.verl_launch import node_launch
    from trainer_template.loader import AlgorithmLoadError

    with pytest.raises(AlgorithmLoadError, match=r"unknown hyperparameters \['no_such_field'\]"):
        node_launch(archive, "grpo", hparams={"no_such_field": 1})
    assert not (archive.path / "mlflow.db").exists()  # no MLflow run was opened for it
    # a non-finite --hparam is the user's input, said as such (not a malformed child message)
    with pytest.raises(AlgorithmLoadError, match=r"override kl_coef is not a finite number"):
        node_launch(archive, "grpo", hparams={"kl_coef": float("nan")})
    assert not (archive.path / "mlflow.db").exists()
    launch = node_launch(archive, "grpo", hparams={"clip_ratio_high": 0.28}, dry_run=True)
    assert launch.env["POISE_NODE_NAME"] == "grpo"
    assert launch.files["algorithm"].startswith(str(archive.path / ".poise" / "verl"))
    assert launch.env["MLFLOW_TRACKING_URI"].endswith("mlflow.db")
    assert "actor_rollout_ref.actor.clip_ratio_high=0.28" in launch.overrides  # the --hparam


@pytest.mark.slow
def test_the_nodes_hyperparameters_run_in_the_child_never_in_the_engine(archive):
    """The settings are those of the node's own ``__post_init__``, which ran in the sandboxed child:
    this process made no module of the node's code."""
    from engine.operators.verl_launch import node_launch

    archive.spawn("grpo", "widened", algorithm=WIDENED)
    launch = node_launch(archive, "widened", dry_run=True)
    assert "actor_rollout_ref.actor.clip_ratio_high=0.4" in launch.overrides
    assert loaded_here("widened") == []


@pytest.mark.slow
def test_a_failing_hyperparameters_is_one_clear_error_before_any_run(archive):
    """A ``__post_init__`` that refuses the --hparam: the child's one line, for the launch and the
    smoke alike, and no MLflow run, no files, no module of the node's code here."""
    from engine.operators.train_verl import train_smoke
    from engine.operators.verl_launch import node_launch
    from trainer_template.loader import AlgorithmLoadError

    archive.spawn("grpo", "checked", algorithm=CHECKED)
    why = "checked/algorithm.py: its Hyperparameters failed: ValueError: clip_ratio_high is below"
    with pytest.raises(AlgorithmLoadError, match=why):
        node_launch(archive, "checked", hparams={"clip_ratio_high": 0.1})
    with pytest.raises(AlgorithmLoadError, match=why):
        train_smoke(archive, "checked", hparams={"clip_ratio_high": 0.1})
    assert not (archive.path / "mlflow.db").exists() and not (archive.path / ".poise").exists()
    assert loaded_here("checked") == []


def _node_default(field: str, value: str) -> str:
    line = next(ln for ln in ROOT.splitlines() if ln.startswith(f"    {field}: "))
    return ROOT.replace(line, f"{line.split('=')[0]}= {value}", 1)


def _forging(*frames: str, end: str = "os._exit(0)") -> str:
    """The root's algorithm.py sending ``frames`` (Python expressions) on the child's channel when
    its module body runs, then ``end``."""
    sends = "".join(f"Channel.from_env().send({f})\n" for f in frames)
    head = f"import os\nfrom trainer_template.channel import Channel\n{sends}{end}\n"
    return ROOT.replace("# ALGO LOGIC", head + "\n# ALGO LOGIC", 1)


MALFORMED = {
    "non-finite default": (
        _node_default("kl_coef", "float('nan')"),
        "settings['kl_coef'] is not a finite number",
    ),
    "text for a name": (_node_default("loss_agg_mode", "3"), "'loss_agg_mode' is not a name"),
    "forged text for a number": (
        _forging("{'type': 'settings', 'settings': {'kl_coef': '0.1'}}"),
        "'kl_coef' is not a number",
    ),
    "forged unknown name": (
        _forging("{'type': 'settings', 'settings': {'trainer.total_epochs': 1}}"),
        "unknown names ['trainer.total_epochs']",
    ),
    "forged nesting": (
        _forging("{'type': 'settings', 'settings': {'clip_ratio_low': {'x': 1}}}"),
        "is nested more than 1 deep",
    ),
    "forged escape sequence": (
        _forging("{'type': 'settings', 'settings': {'kl_type': '\\x1b[2J'}}"),
        "is not printable text",
    ),
    "forged second frame": (
        _forging(*["{'type': 'settings', 'settings': {}}"] * 2),
        "a frame after the settings",
    ),
    "forged frame type": (
        _forging("{'type': 'metrics', 'metrics': {'overall': 0.99}}"),
        "unexpected frame type 'metrics'",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_settings_are_refused_with_one_clear_error(archive, case):
    """What the child sends is untrusted data: a node whose own settings are not what verl takes,
    or code that forges the child's frame, is refused before any run opens."""
    from engine.operators.verl_launch import node_launch
    from trainer_template.loader import AlgorithmLoadError

    source, why = MALFORMED[case]
    archive.spawn("grpo", "odd", algorithm=source)
    with pytest.raises(AlgorithmLoadError) as err:
        node_launch(archive, "odd")
    msg = str(err.value)
    assert msg.startswith("odd/algorithm.py: the sandboxed child reading its verl settings sent a ")
    assert "malformed message" in msg and why in msg, msg
    assert "\n" not in msg and "\x1b" not in msg
    assert not (archive.path / "mlflow.db").exists()


def test_a_child_ending_without_settings_is_refused(archive):
    from engine.operators.verl_launch import node_launch
    from trainer_template.loader import AlgorithmLoadError

    archive.spawn("grpo", "silent", algorithm=_forging())
    with pytest.raises(AlgorithmLoadError, match=r"sent none \(exited with status 0\)"):
        node_launch(archive, "silent", dry_run=True)


def test_the_settings_check():
    from engine.operators.verl_settings import checked_settings
    from engine.sandbox.channel import ChannelError

    ok = {"loss_agg_mode": "token-mean", "kl_coef": None, "clip_ratio_c": 3, "entropy_coef": 0.0}
    assert checked_settings(ok) == ok
    for bad in (
        None,
        [],
        {"clip_ratio_low": True},
        {"clip_ratio_low": None},
        {"clip_ratio_low": float("inf")},
        {"clip_ratio_low": 10**400},
        {"kl_type": None},
        {"kl_type": "x" * 201},
        {"kl_type": ["k1"]},
    ):
        with pytest.raises(ChannelError):
            checked_settings(bad)


@pytest.mark.slow  # two CLI calls, each a static check and a sandboxed child
def test_cli_dry_run_says_why_the_nodes_hyperparameters_failed(cli, archive):
    """``train --backend verl --dry-run`` of a verified node whose ``__post_init__`` refuses the
    --hparam: one error line from the child (no traceback), and the same node builds without it."""
    pytest.importorskip("verl")
    from conftest import mark_verified

    archive.spawn("grpo", "checked", algorithm=CHECKED)
    mark_verified(archive, "checked")
    a = str(archive.path)
    bad = cli(
        "train", "checked", "--backend", "verl", "--dry-run", "--hparam", "clip_ratio_high=0.1",
        "-C", a,
    )  # fmt: skip
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    assert "its Hyperparameters failed: ValueError: clip_ratio_high is below" in bad.stderr
    good = cli("train", "checked", "--backend", "verl", "--dry-run", "-C", a)
    assert good.returncode == 0, good.stderr
    assert "algorithm.adv_estimator=poise_checked" in good.stdout
    assert loaded_here("checked") == [] and not (archive.path / "mlflow.db").exists()


@pytest.mark.slow  # several CLI runs, each composing verl's config
def test_verl_config_refusals_come_before_anything_starts(cli, archive, tmp_path, monkeypatch):
    """An unknown ``--set`` key, a value verl's config rejects, a local model path that does not
    exist and zero GPUs are one line each, before any MLflow run, data or node file exists (the dry
    run and the real launch alike); the printed environment names each path once."""
    from engine.archive.tracking import find_runs
    from engine.errors import ConfigError
    from engine.operators.verl_launch import node_launch
    from trainer_template.verl_backend.launch import PROJECT_ROOT, VerlProtocol

    monkeypatch.setenv("PYTHONPATH", str(PROJECT_ROOT))
    a = str(archive.path)
    cases = (
        (("--set", "trainer.nosuch=1"), "Could not override 'trainer.nosuch'"),
        (("--set", "actor_rollout_ref.actor.loss_agg_mode=bogus"), "Invalid loss_agg_mode"),
        (("--model", str(tmp_path / "no-model")), "does not exist"),
    )
    for args, why in cases:
        r = cli("train", "grpo", "--backend", "verl", "--dry-run", *args, "-C", a)
        assert r.returncode == 1 and why in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    with pytest.raises(ConfigError, match="Could not override"):
        node_launch(archive, "grpo", extra=["trainer.nosuch=1"])
    with pytest.raises(ConfigError, match="does not exist"):
        node_launch(archive, "grpo", protocol=VerlProtocol(model=str(tmp_path / "no-model")))
    zero = cli("train", "grpo", "--backend", "verl", "--dry-run", "--gpus", "0", "-C", a)
    assert zero.returncode == 2 and "--gpus" in zero.stderr
    assert not (Path(a) / ".poise" / "verl").exists() and not find_runs(archive, "grpo")
    ok = cli("train", "grpo", "--backend", "verl", "--dry-run", "--model", str(tmp_path), "-C", a)
    assert ok.returncode == 0, ok.stderr
    env = dict(line.split("=", 1) for line in ok.stdout.splitlines() if line[:1].isupper())
    paths = env["PYTHONPATH"].rstrip(" \\").split(os.pathsep)
    assert paths[0] == str(PROJECT_ROOT) and len(paths) == len(set(paths))


def test_a_tracking_uri_with_credentials_stays_off_verls_command_line(tmp_path):
    """A server URI with a user and password went onto verl's command line as a Ray runtime-env
    override, where ``ps`` (and verl's printed config) showed it: it now reaches verl only through
    the launched process's environment; a URI without credentials still rides the override (a Ray
    that verl joins inherits nothing from the launch)."""
    from trainer_template.verl_backend import smoke
    from trainer_template.verl_backend.launch import VerlProtocol, main_ppo_launch

    uri = "https://u:s3cret@mlflow.example:8443/"
    kw = dict(work_dir=tmp_path / "verl", run_id="r1", project="exp", dry_run=True)
    launch = prepare_launch("cand", ROOT, {}, tracking_uri=uri, **kw)
    assert "s3cret" not in " ".join(launch.cmd) and "s3cret" not in " ".join(launch.overrides)
    assert launch.env["MLFLOW_TRACKING_URI"] == uri  # the driver and the workers it starts get it
    assert any(o.endswith("env_vars.MLFLOW_RUN_ID='r1'") for o in launch.cmd)
    plain = prepare_launch("cand", ROOT, {}, tracking_uri="sqlite:////x/mlflow.db", **kw)
    assert (
        "+ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_TRACKING_URI='sqlite:////x/mlflow.db'"
        in plain.cmd
    )
    files = {"algorithm": "/a.py", "hparams": "/h.json", "train": "/t", "val": "/v", "ckpt": "/c"}
    env = smoke.worker_env("cand", files, tracking_uri=uri, run_id="r2", progress_file="/p")
    extra = smoke.cpu_overrides(smoke.SmokeProtocol(), "/m", str(tmp_path), "127.0.0.1:6379")
    cpu = main_ppo_launch(
        "cand", {}, files, env, project="exp", protocol=VerlProtocol(), extra=extra
    )  # the CPU smoke's launch
    assert "s3cret" not in " ".join(cpu.cmd) and cpu.env["MLFLOW_TRACKING_URI"] == uri


@pytest.mark.slow  # the CLI composes verl's config and reads the settings in a sandboxed child
def test_cli_dry_run_shows_no_tracking_credentials(cli, archive):
    """``train --backend verl --dry-run`` printed ``MLFLOW_TRACKING_URI=https://u:s3cret@host`` and
    the same URI again in a Ray override."""
    pytest.importorskip("verl")
    uri = "https://u:s3cret@mlflow.example:8443/"
    out = cli(
        "train", "grpo", "--backend", "verl", "--dry-run", "-C", str(archive.path),
        env={"MLFLOW_TRACKING_URI": uri},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "s3cret" not in out.stdout + out.stderr
    assert "MLFLOW_TRACKING_URI=https://mlflow.example:8443/" in out.stdout


def test_verls_workers_keep_their_temporary_files_with_the_node(tmp_path):
    """verl leaves a ``ckpt_<hash>.lock`` in the temporary directory of the worker that makes a
    checkpoint directory, and every launch left one in the machine's ``/tmp``: the workers now take
    the node's own ``tmp`` (made by the launch) as ``TMPDIR``; the launched process, whose Ray
    instance puts its sockets under its temporary directory, keeps the caller's."""
    from trainer_template.verl_backend.launch import VerlProtocol, main_ppo_launch

    work = tmp_path / "verl"
    data = work / "data" / "math_l3to5_n5000_seed0"  # present: no parquet written for this test
    data.mkdir(parents=True)
    for f in ("train.parquet", "val.parquet"):
        (data / f).touch()
    launch = prepare_launch(
        "cand", ROOT, {}, tracking_uri="sqlite:////x/m.db", work_dir=work, run_id="r", dry_run=False
    )
    tmp = Path(launch.files["tmp"])
    assert tmp.is_dir() and tmp.parent == Path(launch.files["algorithm"]).parent
    assert f"+ray_kwargs.ray_init.runtime_env.env_vars.TMPDIR='{tmp}'" in launch.cmd
    assert "TMPDIR" not in launch.env
    files = {"algorithm": "/a.py", "hparams": "/h.json", "train": "/t", "val": "/v", "ckpt": "/c"}
    bare = main_ppo_launch("cand", {}, files, {}, project="exp", protocol=VerlProtocol())
    assert not any("TMPDIR" in o for o in bare.cmd)  # no directory of the node's: nothing changes
