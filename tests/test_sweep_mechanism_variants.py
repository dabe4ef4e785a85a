"""The protocol sweep's ``--mechanism-variant NAME=BASE:FIELD=VALUE``: a mechanism derived from a
published one by its ``Hyperparameters`` defaults (the null control of docs/calibration.md is GRPO
with AV-GRPO's effective KL weight), rendered with the offline proposer's edit and trained as is."""

from __future__ import annotations

import pytest

from trainer_template.loader import load_algorithm, make_config
from trainer_template.proxy.protocol import get_protocol


def test_a_mechanism_variant_is_parsed_and_a_bad_one_refused(sweep):
    assert sweep.parse_mechanism_variant("grpo_kl=grpo:kl_coef=0.000935,entropy_coef=0.01") == (
        "grpo_kl",
        "grpo",
        {"kl_coef": 0.000935, "entropy_coef": 0.01},
    )
    assert sweep.parse_mechanism_variant("d=dace_grpo:alpha=1")[2] == {"alpha": 1}
    for bad in ("grpo_kl", "grpo_kl=grpo", "=grpo:kl_coef=1", "x=grpo:", "x=grpo:kl_coef"):
        with pytest.raises(ValueError):
            sweep.parse_mechanism_variant(bad)
    with pytest.raises(ValueError, match="not a literal"):
        sweep.parse_mechanism_variant("x=grpo:kl_type=low_var_kl")  # a string needs quotes


def test_a_mechanism_variant_changes_only_its_fields_and_refuses_unknown_ones(sweep):
    derived = {"grpo_kl": ("grpo", {"kl_coef": 0.000935})}
    src = sweep.render_sources(["grpo", "grpo_kl"], derived, None)
    changed = [
        (a, b)
        for a, b in zip(src["grpo"].splitlines(), src["grpo_kl"].splitlines(), strict=True)
        if a != b
    ]
    assert changed == [("    kl_coef: float = 0.001", "    kl_coef: float = 0.000935")]
    cfg = make_config(load_algorithm(src["grpo_kl"], "grpo_kl"))
    assert cfg.kl_coef == 0.000935 and cfg.clip_ratio_high == 0.2
    with pytest.raises(ValueError, match="no Hyperparameters field 'kl_cof'"):
        sweep.render_sources(["x"], {"x": ("grpo", {"kl_cof": 1.0})}, None)
    with pytest.raises(KeyError, match="unknown prior 'nope'"):
        sweep.render_sources(["x"], {"x": ("nope", {"kl_coef": 1.0})}, None)


def test_a_mechanism_variant_trains_with_its_own_settings(sweep):
    """On the tiny preset, GRPO with a KL weight of 5 trains differently from GRPO at the same seed."""
    proto = get_protocol("tiny")
    src = sweep.render_sources(["grpo", "tight"], {"tight": ("grpo", {"kl_coef": 5.0})}, None)
    base = sweep.run_job("t", proto, "grpo", src["grpo"], 0)
    tight = sweep.run_job("t", proto, "tight", src["tight"], 0)
    assert tight["mechanism"] == "tight" and tight["steps_run"] == base["steps_run"]
    assert tight["final_train"] != base["final_train"]


def test_rows_of_a_mechanism_variant_derived_otherwise_are_refused(sweep):
    derived = {"grpo_kl": ("grpo", {"kl_coef": 0.000935})}
    same = {
        "mechanism": "grpo_kl",
        "mechanism_variant": {"base": "grpo", "set": {"kl_coef": 0.000935}},
    }
    other = {"mechanism": "grpo_kl", "mechanism_variant": {"base": "grpo", "set": {"kl_coef": 0.5}}}
    sweep.check_derived_rows([same, {"mechanism": "grpo"}, {"mechanism": "grpo_kl"}], derived)
    with pytest.raises(ValueError, match="give the new mechanism another name"):
        sweep.check_derived_rows([same, other], derived)
    sweep.check_derived_rows([other], {})  # not derived in this run: nothing to check
