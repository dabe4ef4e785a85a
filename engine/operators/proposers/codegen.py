"""Code generation for the offline proposer: a component spec -> readable mechanism code.

A spec picks one option per component (baseline, scale, invalid, all_fail, length, adv_clip,
entropy_control) plus the loss-side and continuous hyperparameters (``spec["hp"]``). :func:`render`
writes a whole mechanism (``Hyperparameters``, ``compute_advantages``, ``entropy_coefficient`` and the
root's ``policy_loss``) from a spec; ``edit_plan.plan_edit`` turns a parent -> child spec change into
the smallest edit, whose ``Hyperparameters`` changes ``hyperparams.set_defaults`` writes with LibCST.

Components that mirror a published mechanism compute its equation (trainer_template/priors):
``valid_bayes`` baseline = VM-AV-GRPO's mu_valid (alpha = prior_strength * prior_mean, beta =
prior_strength * (1 - prior_mean)); ``analytic`` scale = AV-GRPO's sqrt(mu2 - mu^2) floored, or
VM-AV-GRPO's sqrt(mu_valid (1 - mu_valid)) on the valid_bayes baseline; ``batch`` scale = BN-GRPO's
RMS of the centred rewards over the batch (+ eps); ``floor`` invalid = VM-AV-GRPO's A_floor;
``negative_scale`` length = VM-AV-GRPO's division of negative valid advantages by
clip(L_i / mean valid length, 0.5, 2) (to the power length_lambda, 1 = the paper); ``clip`` = the +-3
clip of FA / BN-GRPO; the ``adaptive`` / ``annealed`` / ``dynamic`` entropy controls are VM-AV-,
DACE- and DCBE-GRPO's. The ``group_mean`` baseline with ``group_std`` scale is the root GRPO.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any

from engine.errors import EditError
from trainer_template import ALGORITHM_FILE

OPTIONS = {
    "baseline": ("group_mean", "loo", "valid_bayes", "batch"),
    "scale": ("group_std", "analytic", "batch", "none"),
    "invalid": ("none", "penalty", "mask", "floor"),
    "all_fail": ("none", "penalty"),
    "length": ("none", "negative_scale", "penalty"),
    "adv_clip": ("none", "clip"),
    "entropy_control": ("none", "adaptive", "annealed", "dynamic"),
}
_CONTROLLED = ("adaptive", "annealed", "dynamic")
# continuous hyperparameters: name -> (low, high, log, default, owner): the owner is None or
# (component, option) or (component, (options...)), the options whose code reads the value
CONTINUOUS = {
    "prior_strength": (0.5, 4.0, True, 1.0, ("baseline", "valid_bayes")),
    "prior_mean": (0.0, 0.5, False, 0.25, ("baseline", "valid_bayes")),
    "std_floor": (0.05, 0.5, False, 0.2, ("scale", "analytic")),
    "invalid_penalty": (0.1, 2.0, False, 1.0, ("invalid", "penalty")),
    "invalid_floor": (0.1, 3.0, False, 1.0, ("invalid", "floor")),
    "all_fail_penalty": (0.01, 0.5, True, 0.1, ("all_fail", "penalty")),
    "length_lambda": (0.25, 2.0, False, 1.0, ("length", "negative_scale")),
    "length_coef": (0.01, 0.5, True, 0.1, ("length", "penalty")),
    "adv_clip": (1.0, 5.0, False, 3.0, ("adv_clip", "clip")),
    "entropy_target": (0.05, 1.0, True, 0.2, ("entropy_control", ("adaptive", "dynamic"))),
    "entropy_target_start": (0.1, 1.0, True, 0.3, ("entropy_control", "annealed")),
    "entropy_target_end": (0.02, 0.3, True, 0.1, ("entropy_control", "annealed")),
    "entropy_coef_max": (1e-3, 0.05, True, 0.01, ("entropy_control", _CONTROLLED)),
    "clip_ratio_low": (0.1, 0.3, False, 0.2, None),
    "clip_ratio_high": (0.15, 0.4, False, 0.2, None),
    "kl_coef": (1e-4, 0.1, True, 0.001, None),
    "entropy_coef": (1e-4, 0.01, True, 0.0, None),
}


def owns(owner: tuple | None, spec: Mapping[str, Any]) -> bool:
    """Whether the spec's option of the owner's component is one of the owner's options."""
    if owner is None:
        return False
    options = owner[1] if isinstance(owner[1], tuple) else (owner[1],)
    return spec.get(owner[0]) in options


# the priors the catalog expresses exactly (tests/test_catalog.py): their component specs
PRIOR_SPECS: dict[str, dict[str, Any]] = {
    "grpo": {},
    "dr_grpo": {"scale": "none", "hp": {"loss_agg_mode": "seq-mean-token-sum-norm"}},
    "rloo": {"baseline": "loo", "scale": "none"},
    "dapo": {"hp": {"clip_ratio_high": 0.28, "kl_coef": 0.0}},
    "vm_av_grpo": {
        "baseline": "valid_bayes",
        "scale": "analytic",
        "invalid": "floor",
        "length": "negative_scale",
        "entropy_control": "adaptive",
        "hp": {
            "prior_strength": 2.0,
            "prior_mean": 0.5,
            "std_floor": 0.1,
            "invalid_floor": 1.0,
            "length_lambda": 1.0,
            "entropy_target": 0.2,
            "entropy_coef_max": 0.01,
        },
    },
}
LOSS_KNOBS = ("clip", "loss_agg", "kl", "entropy")
DEFAULT_SPEC: dict[str, Any] = {
    "baseline": "group_mean",
    "scale": "group_std",
    "invalid": "none",
    "all_fail": "none",
    "length": "none",
    "adv_clip": "none",
    "entropy_control": "none",
    "hp": {
        "eps": 1e-6,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.2,
        "clip_ratio_c": 3.0,
        "loss_agg_mode": "token-mean",
        "kl_coef": 0.001,
        "kl_type": "low_var_kl",
        "entropy_coef": 0.0,
    },
}
HP_DOCS = {
    "eps": "numerical floor added to the scale",
    "prior_strength": "pseudo-count of the Bayesian prior on the valid-subset mean",
    "prior_mean": "prior mean success rate of the valid subset",
    "std_floor": "floor of the analytic scale sqrt(mu(1-mu))",
    "invalid_penalty": "margin of invalid samples below the lowest valid advantage of their group",
    "invalid_floor": "invalid samples get the advantage -invalid_floor (VM-AV-GRPO's A_floor)",
    "all_fail_penalty": "advantage subtracted in groups with no correct sample",
    "length_lambda": "exponent of the clipped relative length dividing negative valid advantages",
    "length_coef": "weight of the centred length penalty",
    "adv_clip": "advantages are clipped to [-adv_clip, adv_clip]",
    "entropy_target": "mean token entropy (nats) the entropy controller steers towards",
    "entropy_target_start": "annealed entropy target at progress 0 (nats)",
    "entropy_target_end": "annealed entropy target at progress 1 (nats)",
    "entropy_coef_max": "largest entropy weight the controller adds",
    "clip_ratio_low": "PPO clip epsilon below 1",
    "clip_ratio_high": "PPO clip epsilon above 1",
    "clip_ratio_c": "dual-clip bound for negative advantages (verl's clip_ratio_c)",
    "loss_agg_mode": "token-mean | seq-mean-token-mean | seq-mean-token-sum-norm",
    "kl_coef": "weight of the KL-to-reference loss term (verl's GRPO recipe: 0.001; 0 disables it)",
    "kl_type": "k1 | k2 | k3 | low_var_kl",
    "entropy_coef": "weight of the entropy bonus (subtracted from the loss)",
}
_BASELINE = {
    "group_mean": (
        "group mean",
        ["baseline = torch.where(singleton, torch.zeros_like(scores), stats.mean)"],
    ),
    "loo": (
        "leave-one-out mean (RLOO)",
        ["baseline = torch.where(singleton, torch.zeros_like(scores), stats.loo_mean)"],
    ),
    "valid_bayes": (
        "Bayesian-smoothed valid-subset mean",
        [
            "vstats = group_stats(scores, batch.group, valid)",
            "baseline = (vstats.sum + cfg.prior_strength * cfg.prior_mean) / (vstats.count + cfg.prior_strength)",
        ],
    ),
    "batch": ("batch mean", ["baseline = scores.mean().expand_as(scores)"]),
}
_SCALE = {
    "group_std": (
        "group std",
        ["scale = torch.where(singleton, torch.ones_like(scores), stats.unbiased_std()) + cfg.eps"],
    ),
    "analytic": (
        "analytic std with a floor (AV-GRPO; VM-AV-GRPO's on the valid_bayes baseline)",
        [
            "mu2 = group_stats(scores * scores, batch.group).mean",
            "scale = (mu2 - stats.mean.square()).clamp(min=0.0).sqrt().clamp(min=cfg.std_floor)",
        ],
    ),
    "batch": (
        "RMS of the centred rewards over the batch (BN-GRPO)",
        ["scale = (scores - baseline).square().mean().sqrt() + cfg.eps"],
    ),
    "none": ("no scaling", ["scale = torch.ones_like(scores)"]),
}
# on the valid-subset baseline the analytic scale is VM-AV-GRPO's sqrt(mu_valid (1 - mu_valid))
_ANALYTIC_VALID = [
    "scale = (baseline * (1.0 - baseline)).clamp(min=0.0).sqrt().clamp(min=cfg.std_floor)"
]
_INVALID = {
    "none": ("", []),
    "penalty": (
        "invalid samples sit invalid_penalty below their group's lowest valid advantage",
        [
            "floor = group_stats(adv, batch.group, valid).min",
            "adv = torch.where(valid, adv, floor - cfg.invalid_penalty)",
        ],
    ),
    "mask": ("invalid samples get 0", ["adv = torch.where(valid, adv, torch.zeros_like(adv))"]),
    "floor": (
        "invalid samples get -invalid_floor (VM-AV-GRPO's floor penalty)",
        ["adv = torch.where(valid, adv, torch.full_like(adv, -cfg.invalid_floor))"],
    ),
}
_ALL_FAIL = {
    "none": ("", []),
    "penalty": (
        "all-fail groups shifted down",
        [
            "solved = group_stats(batch.correct.to(torch.float32), batch.group).max > 0.5",
            "adv = torch.where(solved, adv, adv - cfg.all_fail_penalty)",
        ],
    ),
}
_LENGTH = {
    "none": ("", []),
    "negative_scale": (
        "validity-gated length normalisation of negative advantages (VM-AV-GRPO)",
        [
            "lengths = batch.lengths.to(torch.float32)",
            "mean_valid = group_stats(lengths, batch.group, valid).mean.clamp(min=1.0)",
            "l_rel = (lengths / mean_valid).clamp(0.5, 2.0)",
            "adv = torch.where((adv < 0) & valid, adv / l_rel.pow(cfg.length_lambda), adv)",
        ],
    ),
    "penalty": (
        "centred length penalty",
        [
            "lengths = batch.lengths.to(torch.float32)",
            "lstats = group_stats(lengths, batch.group)",
            "adv = adv - cfg.length_coef * (lengths - lstats.mean) / lstats.max.clamp(min=1.0)",
        ],
    ),
}
_CLIP = {"none": ("", []), "clip": ("clipped", ["adv = adv.clamp(-cfg.adv_clip, cfg.adv_clip)"])}
_CLIP_SHORTFALL = "cfg.entropy_coef_max * min(max(error, 0.0), 1.0)"
_ENTROPY = {
    "adaptive": (
        "adaptive entropy bonus below entropy_target (VM-AV-GRPO)",
        ["error = (cfg.entropy_target - measured_entropy) / cfg.entropy_target"],
        _CLIP_SHORTFALL,
    ),
    "annealed": (
        "entropy bonus below a target annealed over training (DACE-GRPO)",
        [
            "t = state.progress if state is not None else 0.0",
            "target = cfg.entropy_target_start + (cfg.entropy_target_end - cfg.entropy_target_start) * t",
            "error = (target - measured_entropy) / target",
        ],
        _CLIP_SHORTFALL,
    ),
    "dynamic": (
        "entropy bonus below entropy_target, penalty above it (DCBE-GRPO)",
        ["error = (cfg.entropy_target - measured_entropy) / cfg.entropy_target"],
        "cfg.entropy_coef_max * min(max(error, -1.0), 1.0)",
    ),
}


def root_function(name: str) -> str:
    """A function of the root (trainer_template/algorithm.py), verbatim: loss-side mechanisms are
    expressed through the Hyperparameters it reads (clip ratios, aggregation, KL, entropy)."""
    src = ALGORITHM_FILE.read_text(encoding="utf-8")
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return "\n".join(src.splitlines()[node.lineno - 1 : node.end_lineno]) + "\n"
    raise RuntimeError(f"trainer_template/algorithm.py has no {name}")


def entropy_source(option: str) -> str:
    """The root's ``entropy_coefficient``, or an entropy controller of the paper."""
    if option == "none":
        return root_function("entropy_coefficient")
    doc, lines, coef = _ENTROPY[option]
    body = "".join(f"    {ln}\n" for ln in lines)
    return (
        "def entropy_coefficient(\n"
        "    cfg: Hyperparameters, state: TrainingState | None, measured_entropy: float\n"
        ") -> float:\n"
        f'    """Entropy weight this step: the {doc}."""\n'
        f"{body}    return cfg.entropy_coef + {coef}\n"
    )


def normalize(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """A complete spec: defaults filled in, options validated, only the hyperparameters it uses kept."""
    out: dict[str, Any] = {k: v for k, v in DEFAULT_SPEC.items() if k != "hp"}
    hp = dict(DEFAULT_SPEC["hp"])
    for k, v in (spec or {}).items():
        if k == "hp":
            hp.update(v)
        elif k in OPTIONS:
            if v not in OPTIONS[k]:
                raise EditError(f"unknown {k} option {v!r} (known: {', '.join(OPTIONS[k])})")
            out[k] = v
    for name, (_lo, _hi, _log, default, owner) in CONTINUOUS.items():
        if owner is not None:
            if owns(owner, out):
                hp.setdefault(name, default)
            else:
                hp.pop(name, None)
    out["hp"] = {k: hp[k] for k in sorted(hp)}
    return out


def describe(spec: Mapping[str, Any]) -> str:
    s = normalize(spec)
    parts = [f"baseline: {_BASELINE[s['baseline']][0]}", f"scale: {_SCALE[s['scale']][0]}"]
    for key, table in (
        ("invalid", _INVALID),
        ("all_fail", _ALL_FAIL),
        ("length", _LENGTH),
        ("adv_clip", _CLIP),
    ):
        if s[key] != "none":
            parts.append(f"{key.replace('_', '-')}: {table[s[key]][0]}")
    hp = s["hp"]
    parts.append(
        f"loss: clip [{hp['clip_ratio_low']:.3g}, {hp['clip_ratio_high']:.3g}], {hp['loss_agg_mode']}, "
        f"kl {hp['kl_coef']:.3g}, entropy {hp['entropy_coef']:.3g}"
        + (f" + {_ENTROPY[s['entropy_control']][0]}" if s["entropy_control"] != "none" else "")
    )
    return "; ".join(parts)


ADVANTAGE_COMPONENTS = ("baseline", "scale", "invalid", "all_fail", "length", "adv_clip")


def render(spec: Mapping[str, Any]) -> str:
    """A whole mechanism (Hyperparameters, compute_advantages, entropy_coefficient, the root's
    policy_loss) implementing ``spec``."""
    s = normalize(spec)
    lines = ["@dataclass", "class Hyperparameters:"]
    base = list(DEFAULT_SPEC["hp"])  # the root's field order first
    for k in sorted(s["hp"], key=lambda k: (base.index(k) if k in base else len(base), k)):
        v = s["hp"][k]
        lines += [
            f"    {k}: {type(v).__name__} = {source_literal(v)}",
            f'    """{HP_DOCS.get(k, k)}"""',
        ]
    code = "\n".join(lines) + "\n\n\n" + render_advantages(s)
    code += "\n\n" + entropy_source(s["entropy_control"])
    return code + "\n\n" + root_function("policy_loss")


def render_advantages(spec: Mapping[str, Any]) -> str:
    """``compute_advantages`` implementing the spec's advantage components."""
    s = normalize(spec)
    body: list[str] = [
        "scores = batch.rewards.to(torch.float32)",
        "valid = batch.valid.to(torch.bool)",
        "stats = group_stats(scores, batch.group)",
        "singleton = stats.count < 2",
    ]
    body += _BASELINE[s["baseline"]][1]
    if s["scale"] == "analytic" and s["baseline"] == "valid_bayes":
        body += _ANALYTIC_VALID
    else:
        body += _SCALE[s["scale"]][1]
    body += ["adv = (scores - baseline) / scale"]
    for key, table in (
        ("invalid", _INVALID),
        ("all_fail", _ALL_FAIL),
        ("length", _LENGTH),
        ("adv_clip", _CLIP),
    ):
        body += table[s[key]][1]
    body += ["return adv"]
    doc = describe(s).split("; loss:")[0]
    lines = [
        "def compute_advantages(batch: RolloutBatch, cfg: Hyperparameters) -> torch.Tensor:",
        f'    """Sequence-level advantages [B]. {doc}."""',
    ]
    lines += [f"    {ln}" for ln in body]
    return "\n".join(lines) + "\n"


def source_literal(value: Any) -> str:
    """How a value is written in source: double-quoted strings, floats as written by hand (1e-6, not
    Python's repr 1e-06)."""
    if isinstance(value, str):
        return json.dumps(value)
    text = repr(value)
    if isinstance(value, float):
        text = re.sub(
            r"e([+-])0*(\d)", lambda m: f"e{'-' if m.group(1) == '-' else ''}{m.group(2)}", text
        )
    return text
