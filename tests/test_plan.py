"""The run plan: one source of truth per setting (poise.toml < the resumed run < the command line),
recorded as JSON, old records readable."""

from __future__ import annotations

import json

import pytest

from engine.config import parse_config
from engine.errors import PoiseError
from engine.loop.plan import RunPlan, resolve_plan

TOML = """
[evaluation]
seeds = 3
timeout_s = 90.0
[proxy]
preset = "smoke"
[select]
k = 2
seed = 7
[propose]
population = 5
"""


def test_defaults_come_from_poise_toml_and_the_command_line_overrides_them():
    cfg = parse_config(TOML)
    plan = resolve_plan(cfg, {}, start_round=4)
    assert (plan.parents, plan.population, plan.seeds, plan.preset) == (2, 5, 3, "smoke")
    assert (plan.seed, plan.eval_timeout_s, plan.rounds, plan.start_round) == (7, 90.0, 1, 4)
    assert plan.last_round == 4
    cli = resolve_plan(cfg, {"seeds": 1, "rounds": 3, "preset": None}, start_round=4)
    assert cli.seeds == 1 and cli.rounds == 3 and cli.preset == "smoke"  # None: not given
    assert cli.last_round == 6
    # the operators see the plan's values, decided once
    seen = cli.apply(cfg)
    assert seen.evaluation.seeds == 1 and seen.proxy.preset == "smoke" and seen.select.k == 2
    assert seen.evaluation.timeout_s == 90.0 and seen.propose.population == 5


def test_resume_takes_the_recorded_plan_then_the_command_line():
    cfg = parse_config(TOML)
    first = resolve_plan(cfg, {"rounds": 2, "population": 1}, start_round=3)
    recorded = json.loads(json.dumps(first.to_dict()))  # as the run record stores it
    changed = parse_config(TOML.replace("population = 5", "population = 9"))
    resumed = resolve_plan(changed, {}, recorded=recorded)
    assert resumed == first  # poise.toml changed since: the run goes on with its own plan
    more = resolve_plan(changed, {"rounds": 4}, recorded=recorded)
    assert more.rounds == 4 and more.start_round == 3 and more.population == 1


def test_old_run_records_are_read():
    """A record written by the dict-based loop: every key filled, numbers as JSON wrote them; a key
    a later version added is missing; a key that no longer exists is ignored."""
    cfg = parse_config("")
    old = {
        "rounds": 2,
        "parents": 1,
        "population": 2,
        "seeds": 1,
        "proposer": "offline",
        "backend": "proxy",
        "preset": "smoke",
        "eval_timeout_s": 240,
        "seed": 0,
        "start_round": 1,
        "retired_setting": "x",
    }
    plan = resolve_plan(cfg, {}, recorded=old)
    assert plan.eval_timeout_s == 240.0 and isinstance(plan.eval_timeout_s, float)
    assert plan.gpus_per_eval == 1.0 and plan.preset == "smoke" and plan.rounds == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rounds": 0}, "--rounds must be >= 1"),
        ({"seeds": 0}, "--seeds must be >= 1"),
        ({"proposer": "oracle"}, "--proposer must be offline, llm or a registered proposer"),
        ({"backend": "jax"}, "--backend must be proxy or verl"),
        ({"eval_timeout_s": -1}, "--eval-timeout must be > 0"),
        ({"eval_timeout_s": float("nan")}, "--eval-timeout must be > 0"),
        ({"eval_timeout_s": float("inf")}, "--eval-timeout must be > 0"),
        ({"preset": "huge"}, "--preset must be one of default, smoke"),
        ({"seeds": "many"}, "seeds must be int"),
        ({"seeds": 1.5}, "seeds must be int"),
        ({"colour": "red"}, "unknown run plan setting"),
    ],
)
def test_bad_settings_are_one_clear_error(overrides, message):
    with pytest.raises(PoiseError, match=message):
        resolve_plan(parse_config(""), overrides)


def test_the_plan_is_frozen():
    plan = RunPlan()
    with pytest.raises(AttributeError):
        plan.seeds = 4  # type: ignore[misc]
