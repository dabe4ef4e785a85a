"""``poise.toml`` numbers are checked when the file is read: a value out of range or not finite is one
clear ``ConfigError`` naming the setting, never a traceback deep inside the command that uses it."""

from __future__ import annotations

import pytest

from engine.config import DEFAULT_TOML, parse_config
from engine.errors import ConfigError


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[llm]\ntimeout_s = -1\n", r"\[llm\]\.timeout_s must be > 0, got -1"),
        ("[llm]\ntimeout_s = nan\n", r"\[llm\]\.timeout_s must be a finite number, got nan"),
        ("[llm]\nmax_retries = -2\n", r"\[llm\]\.max_retries must be >= 0"),
        ("[llm]\ntemperature = -0.5\n", r"\[llm\]\.temperature must be >= 0"),
        ("[evaluation]\ntimeout_s = 0\n", r"\[evaluation\]\.timeout_s must be > 0"),
        ("[evaluation]\nmemory_mb = 0\n", r"\[evaluation\]\.memory_mb must be >= 1"),
        ("[select]\ntop_k = -3\n", r"\[select\]\.top_k must be >= 1, got -3"),
        ("[select]\nkappa = inf\n", r"\[select\]\.kappa must be a finite number"),
        ("[select]\nw_div = -0.1\n", r"\[select\]\.w_div must be >= 0"),
        (
            "[select]\nw_pareto = 0\nw_perf = 0\nw_div = 0\nw_bayes = 0\n",
            "weights .* are all 0",
        ),
        ("[propose]\npopulation = 0\n", r"\[propose\]\.population must be >= 1"),
        (
            "[experiment]\nlength_penalty = nan\n",
            r"\[experiment\]\.length_penalty must be a finite",
        ),
    ],
)
def test_out_of_range_numbers_are_one_clear_error(toml, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(toml)


def test_the_defaults_and_edge_values_are_accepted():
    parse_config(DEFAULT_TOML)
    cfg = parse_config(
        "[llm]\nmax_retries = 0\ntemperature = 0\n[select]\nkappa = 0\nw_div = 0\n"
        "[proxy]\nparallel = 0\n"
    )
    assert cfg.llm.max_retries == 0 and cfg.select.kappa == 0 and cfg.proxy.parallel == 0


def test_the_cli_reports_a_bad_number_as_one_line(tmp_path, cli):
    bad = tmp_path / "bad.toml"
    bad.write_text("[llm]\ntimeout_s = -1\n")
    res = cli("init", str(tmp_path / "exp"), "--config", str(bad))
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert f"error: {bad}: [llm].timeout_s must be > 0, got -1" in res.stderr
    assert not (tmp_path / "exp").exists()


def test_a_config_error_names_the_file_passed_with_config(tmp_path, cli, monkeypatch):
    """`--config other.toml` is the file read: its errors name it, not poise.toml."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other.toml").write_text("[select]\nk = 0\n")
    (tmp_path / "broken.toml").write_text("[select\nk = 2\n")
    (tmp_path / "stray.toml").write_text("seeds = 2\n")
    cases = (
        ("init", "exp", "--config", "other.toml", "error: other.toml: [select].k must be >= 1"),
        ("init", "exp", "--config", "broken.toml", "error: broken.toml is not valid TOML: "),
        ("run", "-C", "exp", "--config", "stray.toml", "error: stray.toml: setting seeds outside"),
    )
    for *args, says in cases:
        res = cli(*args)
        assert res.returncode == 1 and res.stderr.startswith(says), (args, res.stderr)
        assert "poise.toml" not in res.stderr and not (tmp_path / "exp").exists()
    with pytest.raises(ConfigError, match=r"^poise.toml: \[select\].k must be >= 1"):
        parse_config("[select]\nk = 0\n")  # the archive's own file keeps its name


def test_a_candidate_gets_paired_seeds_and_so_an_interval_by_default():
    # a number without an interval means little: the default and the file `init` writes both
    # evaluate every candidate on 2 paired seeds; 1 is still accepted, for a reading
    assert parse_config("").evaluation.seeds == 2
    assert parse_config(DEFAULT_TOML).evaluation.seeds == 2
    assert parse_config("[evaluation]\nseeds = 1\n").evaluation.seeds == 1


def test_an_unknown_proxy_preset_is_refused_when_read(tmp_path, cli):
    """A typo'd preset is one error when poise.toml is read (``init --config`` creates nothing), not
    an archive whose every evaluation fails later."""
    with pytest.raises(
        ConfigError, match=r"\[proxy\]\.preset must be one of default, .*got 'tinyy'"
    ):
        parse_config('[proxy]\npreset = "tinyy"\n')
    for preset in ("default", "smoke", "tiny", "large"):
        assert parse_config(f'[proxy]\npreset = "{preset}"\n').proxy.preset == preset
    bad = tmp_path / "bad.toml"
    bad.write_text('[proxy]\npreset = "tinyy"\n')
    res = cli("init", str(tmp_path / "exp"), "--config", str(bad))
    assert res.returncode == 1 and "[proxy].preset must be one of" in res.stderr
    assert not (tmp_path / "exp").exists()


def test_a_setting_outside_any_section_is_named_as_a_setting():
    with pytest.raises(ConfigError, match=r"setting seeds outside any section .*\[evaluation\]"):
        parse_config("seeds = 2\n")


def test_an_edited_poise_toml_in_the_archive_directory_is_said_not_to_be_read(tmp_path):
    """The archive directory's files are the root as created; poise-git reads the root node's
    poise.toml. A user who edits the file there (even into invalid TOML) is told once that it is not
    read, instead of seeing the old settings used in silence."""
    from conftest import run_cli

    exp = tmp_path / "exp"
    assert run_cli("init", str(exp)).returncode == 0
    quiet = run_cli("log", "-C", str(exp))
    assert quiet.returncode == 0 and quiet.stderr == ""
    (exp / "poise.toml").write_text('[proxy\npreset = "tiny"\n')
    p = run_cli("log", "-C", str(exp))
    assert p.returncode == 0, p.stderr
    warned = [ln for ln in p.stderr.splitlines() if "poise.toml" in ln]
    assert len(warned) == 1 and "not read" in warned[0] and "--config" in warned[0], p.stderr
    assert "grpo" in p.stdout


@pytest.mark.parametrize("entries", ['["overall", "-"]', '[""]', '["overall", 3]', '["+ "]'])
def test_a_bad_pareto_objective_is_refused_when_read(tmp_path, cli, entries):
    """``[experiment].pareto_objectives`` is checked by the rules selection applies when the file is
    read: ``init --config`` refuses a bad entry in one line naming the file and creates nothing,
    rather than an archive whose first ``select`` fails."""
    bad = tmp_path / "bad.toml"
    bad.write_text(f"[experiment]\npareto_objectives = {entries}\n")
    res = cli("init", str(tmp_path / "exp"), "--config", str(bad))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith(f"error: {bad}: [experiment].pareto_objectives: bad entry ")
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "exp").exists()


def test_every_pareto_objective_selection_takes_is_accepted_when_read():
    from engine.select.pareto import parse_objectives

    for entries, parsed in (
        ("[]", []),
        ('["overall"]', [("overall", 1.0)]),
        ('["overall", "-mean_length"]', [("overall", 1.0), ("mean_length", -1.0)]),
        ('["+hard/pass@8", " - mean_length "]', [("hard/pass@8", 1.0), ("mean_length", -1.0)]),
    ):
        cfg = parse_config(f"[experiment]\npareto_objectives = {entries}\n")
        assert parse_objectives(cfg.experiment.pareto_objectives) == parsed, entries
