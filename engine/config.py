"""``poise.toml``: one file per experiment, loaded into frozen dataclasses validated at load time.

Each component reads only its own section. Secrets are never stored here: an API key is read from the
environment variable the ``[llm]`` section names (default ``OPENAI_API_KEY``).
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import secrets
from engine.errors import ConfigError
from trainer_template.proxy.protocol import PRESETS


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "poise-experiment"
    """a label for the experiment (MLflow experiment name)"""
    objective: str = "overall"
    """the metric the utility U maximizes (higher is better)"""
    length_penalty: float = 0.0
    """U = objective - length_penalty * mean_length (the length-compression directive)"""
    pareto_objectives: tuple[str, ...] = ()
    """metrics of the Pareto front (empty: the objective alone); prefix '-' to minimize"""
    directive: str = ""
    """natural-language research directive that enters every proposal context"""
    directions: tuple[tuple[str, str], ...] = ()
    """``[experiment.directions]``: metric -> "max" | "min" (see :func:`metric_direction`)"""


@dataclass(frozen=True)
class EvaluationConfig:
    backend: str = "proxy"
    """proxy (embedded CPU) | verl (GPU scale)"""
    seeds: int = 2
    """paired seeds per proxy candidate: 2 or more give every result a 95% interval (1: a reading
    without one); the verl backend trains once per candidate"""
    timeout_s: float = 1800.0
    """hard wall-clock limit of one evaluation (its whole process group)"""
    memory_mb: int = 4096
    """address-space limit of one evaluation process"""
    protocol: str = ""
    """the protocol results are ranked under, ``id`` or ``id@hash`` (empty: the one the backend and
    preset define, e.g. proxy/default at the current proxy's hash)"""


@dataclass(frozen=True)
class ProxyConfig:
    """The embedded CPU proxy's protocol (see trainer_template/proxy)."""

    preset: str = "default"
    """default | smoke | tiny (seconds-long protocols for tests) | large (a GPU when torch sees one)"""
    parallel: int = 0
    """seeds run at once as separate processes (0: one per CPU core)"""
    cache_dir: str = ""
    """where the warm-start checkpoint is cached (empty: $POISE_CACHE_DIR or ~/.cache/poise-git/proxy)"""


@dataclass(frozen=True)
class SelectConfig:
    k: int = 3
    w_pareto: float = 0.25
    w_perf: float = 0.25
    w_div: float = 0.15
    w_bayes: float = 0.35
    top_k: int = 3
    """K of the discounted top-K descendant gain"""
    gamma: float = 0.8
    """depth discount of the descendant gain"""
    beta: float = 0.05
    """tanh temperature of the descendant gain, in utility units"""
    kappa: float = 1.0
    """UCB exploration weight"""
    seed: int = 0
    allow_failed: bool = False
    """let failed / rejected nodes be parents"""
    gp_max_train: int = 256
    """the GP-UCB is fitted on at most this many nodes with observed descendant gain (seeded sample)"""
    expansion_half: float = 4.0
    """over-expansion discount of U_div: 1 / (1 + children / expansion_half)"""


REMEDY_MOVES = ("kl", "entropy_control", "entropy", "clip_higher")
"""the offline proposer's remedies: a stronger KL anchor, an entropy controller, a larger entropy
bonus, a higher upper clip bound (engine.operators.proposers.remedies.REMEDIES)"""


@dataclass(frozen=True)
class ProposeConfig:
    proposer: str = "offline"
    """offline (no API key) | llm"""
    population: int = 4
    """N candidates proposed per parent"""
    implement: int = 0
    """M of the N screened proposals implemented (and evaluated) per parent and round: 0 (the default)
    implements all N; 1 is the paper's "the highest-ranked candidate is selected for implementation"
    """
    correction_rounds: int = 3
    """R: bounded implement -> verify correction rounds"""
    context_tokens: int = 12000
    """token budget of the proposal context (engine.operators.context; the parent is never cut)"""
    directed: float = 0.5
    """offline proposer: the share of a diagnosed parent's mutations that apply a remedy of its
    diagnosis (0: the diagnosis directs and credits nothing)"""
    remedies: tuple[str, ...] = REMEDY_MOVES
    """offline proposer: the remedies it may direct a diagnosed parent to (:data:`REMEDY_MOVES`)"""
    remedy_trials: int = 2
    """offline proposer: a remedy is no longer directed to (nor credited) once this many of its
    children, judged seed by seed on the series it is meant to move (a collapsing parent's entropy),
    kept it as their parents did and none moved it the intended way (0: never;
    engine.operators.proposers.remedies)"""
    learned: float = 0.0
    """offline proposer: the share of mutations that make the move the archive's evidence favours
    (engine.operators.proposers.moves; 0: off)"""
    explore: bool = False
    """offline proposer, with ``learned`` on: where no move is favoured with confidence, make the
    untried move the prior is least sure of instead of the usual mutation (one no
    pending node is already trying)"""
    min_gain: float = 0.0
    """offline proposer, with ``learned`` on: the expected utility gain a favoured move needs besides
    its confidence (0: confidence alone; a move the evidence is sure gains next to nothing, such as a
    coefficient pushed against its range's end, is then left to ``explore`` or the usual mutation)"""


@dataclass(frozen=True)
class LLMConfig:
    model: str = "gpt-4o-mini"
    base_url: str = ""
    """OpenAI-compatible endpoint; empty: $OPENAI_BASE_URL or the OpenAI default"""
    api_key_env: str = "OPENAI_API_KEY"
    """name of the environment variable holding the key (keys are never written to files)"""
    timeout_s: float = 120.0
    """seconds a whole reply may take (a server that keeps sending is cut off all the same)"""
    max_retries: int = 5
    temperature: float = 0.7


@dataclass(frozen=True)
class Config:
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    select: SelectConfig = field(default_factory=SelectConfig)
    propose: ProposeConfig = field(default_factory=ProposeConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)


_FORBIDDEN_KEYS = {"api_key", "key", "token", "secret", "password"}


def _build_section(cls: type, name: str, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"poise.toml: [{name}] must be a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _FORBIDDEN_KEYS:
            raise ConfigError(
                f"poise.toml: [{name}].{key} looks like a secret; set it in the environment instead"
            )
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"poise.toml: unknown setting [{name}].{key} (known: {known})")
        default = fields[key].default
        if (
            default is dataclasses.MISSING
            and fields[key].default_factory is not dataclasses.MISSING
        ):  # type: ignore[misc]
            default = fields[key].default_factory()  # type: ignore[misc]
        kwargs[key] = _coerce(name, key, value, default)
    return cls(**kwargs)


def _coerce(section: str, key: str, value: Any, default: Any) -> Any:
    where = f"poise.toml: [{section}].{key}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    if key == "directions":
        if not isinstance(value, dict):
            raise ConfigError(f'{where} must be a table of metric = "max" | "min"')
        for metric, d in value.items():
            if d not in ("max", "min"):
                raise ConfigError(f'{where}.{metric} must be "max" or "min", got {d!r}')
        return tuple(sorted(value.items()))
    if isinstance(default, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return tuple(value)
    return value


def parse_config(text: str, source: str = "poise.toml") -> Config:
    """Parse poise.toml text into a validated :class:`Config`. ``source``: the file the text was
    read from (``init --config other.toml``), which an error names instead of ``poise.toml``."""
    try:
        return _parse(text)
    except ConfigError as exc:
        msg = str(exc)
        if source == "poise.toml" or not msg.startswith("poise.toml"):
            raise
        raise ConfigError(source + msg.removeprefix("poise.toml")) from None


def _parse(text: str) -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"poise.toml is not valid TOML: {exc}") from exc
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    kwargs = {}
    hints = {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]
    for name, value in raw.items():
        if name not in sections and not isinstance(value, dict):  # `seeds = 2` above every [table]
            homes = [
                f"[{sec}]"
                for sec, factory in hints.items()
                if name in {f.name for f in dataclasses.fields(type(factory()))}
            ]
            where = f"it belongs under {' or '.join(homes)}" if homes else "no section has it"
            raise ConfigError(f"poise.toml: setting {name} outside any section ({where})")
        if name not in sections:
            raise ConfigError(
                f"poise.toml: unknown section [{name}] (known: {', '.join(sections)})"
            )
        kwargs[name] = _build_section(type(hints[name]()), name, value)
    cfg = Config(**kwargs)
    validate(cfg)

    secrets.register_env(cfg.llm.api_key_env)  # never passed to a child, scrubbed from every record
    return cfg


def load_config(path: str | Path) -> Config:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no poise.toml at {path}")
    return parse_config(path.read_text(encoding="utf-8"), str(path))


_AT_LEAST = {
    ("evaluation", "timeout_s"): 1e-9,
    ("evaluation", "memory_mb"): 1,
    ("proxy", "parallel"): 0,
    ("select", "top_k"): 1,
    ("select", "kappa"): 0,
    ("select", "w_pareto"): 0,
    ("select", "w_perf"): 0,
    ("select", "w_div"): 0,
    ("select", "w_bayes"): 0,
    ("select", "gp_max_train"): 1,
    ("select", "expansion_half"): 1e-9,
    ("propose", "population"): 1,
    ("propose", "implement"): 0,
    ("propose", "correction_rounds"): 1,
    ("propose", "context_tokens"): 1,
    ("llm", "timeout_s"): 1e-9,
    ("llm", "max_retries"): 0,
    ("llm", "temperature"): 0,
}
"""numeric settings with a lower bound (``1e-9``: must be positive); every number must be finite"""


def _check_numbers(cfg: Config) -> None:
    for section in dataclasses.fields(cfg):
        values = getattr(cfg, section.name)
        for f in dataclasses.fields(values):
            v = getattr(values, f.name)
            if isinstance(v, bool) or not isinstance(v, int | float):
                continue
            where = f"[{section.name}].{f.name}"
            if not math.isfinite(v):
                raise ConfigError(f"poise.toml: {where} must be a finite number, got {v!r}")
            low = _AT_LEAST.get((section.name, f.name))
            if low is not None and v < low:
                bound = "> 0" if low == 1e-9 else f">= {low}"
                raise ConfigError(f"poise.toml: {where} must be {bound}, got {v!r}")
    s = cfg.select
    if s.w_pareto + s.w_perf + s.w_div + s.w_bayes <= 0:
        raise ConfigError("poise.toml: [select] weights w_pareto, w_perf, w_div, w_bayes are all 0")


def validate(cfg: Config) -> None:
    _check_numbers(cfg)
    if cfg.evaluation.backend not in ("proxy", "verl"):
        raise ConfigError(
            f"poise.toml: [evaluation].backend must be proxy or verl, got {cfg.evaluation.backend!r}"
        )
    if cfg.evaluation.seeds < 1:
        raise ConfigError("poise.toml: [evaluation].seeds must be >= 1")
    if cfg.select.k < 1:
        raise ConfigError("poise.toml: [select].k must be >= 1")
    if not 0 < cfg.select.gamma <= 1:
        raise ConfigError("poise.toml: [select].gamma must lie in (0, 1]")
    if cfg.select.beta <= 0:
        raise ConfigError("poise.toml: [select].beta must be > 0")
    if not 0 <= cfg.propose.directed <= 1:
        raise ConfigError(
            f"poise.toml: [propose].directed must lie in [0, 1], got {cfg.propose.directed!r}"
        )
    if not 0 <= cfg.propose.learned <= 1:
        raise ConfigError(
            f"poise.toml: [propose].learned must lie in [0, 1], got {cfg.propose.learned!r}"
        )
    if not 0 <= cfg.propose.min_gain < 1:
        raise ConfigError(
            f"poise.toml: [propose].min_gain must lie in [0, 1), got {cfg.propose.min_gain!r}"
        )
    trials = cfg.propose.remedy_trials
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0:
        raise ConfigError(
            f"poise.toml: [propose].remedy_trials must be a whole number >= 0, got {trials!r}"
        )
    unknown = [m for m in cfg.propose.remedies if m not in REMEDY_MOVES]
    if unknown:
        raise ConfigError(
            f"poise.toml: [propose].remedies: unknown remedy {unknown[0]!r} "
            f"(known: {', '.join(REMEDY_MOVES)})"
        )
    if cfg.proxy.preset not in PRESETS:
        raise ConfigError(
            f"poise.toml: [proxy].preset must be one of {', '.join(PRESETS)}, "
            f"got {cfg.proxy.preset!r}"
        )
    if cfg.propose.proposer not in ("offline", "llm"):
        raise ConfigError(
            f"poise.toml: [propose].proposer must be offline or llm, got {cfg.propose.proposer!r}"
        )
    for item in cfg.experiment.pareto_objectives:  # the rules selection parses them by
        objective_entry(item)


def objective_entry(item: Any) -> str:
    """An entry of ``[experiment].pareto_objectives`` (``overall``, ``-mean_length``, ``+x``),
    stripped: a string naming a metric after its ``-`` / ``+``; else one ConfigError."""
    if not isinstance(item, str) or not item.strip("-+ "):
        raise ConfigError(f"poise.toml: [experiment].pareto_objectives: bad entry {item!r}")
    return item.strip()


_LENGTH_LIKE = re.compile(r"(^|[/_.:-])(length|len|tokens|response_length)$")
_LENGTH_WORDS = re.compile(
    r"\b(length|lengths|shorter|concise|brevity|compress\w*|tokens?)\b", re.I
)


def is_length_like(metric: str) -> bool:
    """``mean_length``, ``hard/mean_length``, ``train/response_length``, ``…_tokens``: a length."""
    return bool(_LENGTH_LIKE.search(metric.lstrip("+-")))


def has_length_directive(cfg: ExperimentConfig) -> bool:
    """A length penalty, a length-like objective, or a directive that asks about length."""
    return (
        bool(cfg.length_penalty)
        or is_length_like(cfg.objective)
        or any(is_length_like(p) for p in cfg.pareto_objectives)
        or bool(_LENGTH_WORDS.search(cfg.directive or ""))
    )


def metric_direction(metric: str, cfg: ExperimentConfig) -> tuple[str, str]:
    """``(direction, why)`` of a metric: ``"max"`` | ``"min"``, and where that comes from.

    ``[experiment.directions]`` in poise.toml wins; else a length-like metric is ``min`` under a
    length directive (:func:`has_length_directive`); else ``max`` (accuracies, pass@k, Overall)."""
    name = metric.lstrip("+-")
    explicit = dict(cfg.directions).get(name)
    if explicit:
        return explicit, "poise.toml [experiment.directions]"
    if is_length_like(name) and has_length_directive(cfg):
        return "min", "length directive"
    return "max", "default"


def utility(metrics: dict[str, float], cfg: ExperimentConfig) -> float | None:
    """The scalar utility U(y) of a metric vector, or None when the objective was not measured.

    U = s * y[objective] - length_penalty * y[mean_length], s = -1 when the objective's direction
    is ``min`` (:func:`metric_direction`), else +1: U is always higher-is-better."""
    value = metrics.get(cfg.objective)
    if value is None:
        return None
    u = float(value)
    if cfg.directions or is_length_like(cfg.objective):
        if metric_direction(cfg.objective, cfg)[0] == "min":
            u = -u
    if cfg.length_penalty:
        length = metrics.get("mean_length")
        if length is not None:
            u -= cfg.length_penalty * float(length)
    return u


DEFAULT_TOML = """\
# poise-git experiment settings. Every section is optional; see `poise-git --help` and the README.
[experiment]
name = "poise-experiment"
objective = "overall"          # the metric U maximizes
directive = ""                 # natural-language research directive for the proposer

# Direction of each metric an objective may name: "max" (higher is better) or "min". Unlisted
# metrics are "max", except length-like ones (mean_length, hard/mean_length, ...), which are "min"
# under a length directive. `poise-git select --explain` shows the directions in use.
[experiment.directions]
mean_length = "min"

[evaluation]
backend = "proxy"              # proxy (embedded CPU) | verl (GPU scale)
seeds = 2                      # paired seeds per candidate (1 gives no interval)
# protocol = "proxy/default"   # rank under this protocol (default: what backend and preset define)

[select]
k = 3

[propose]
proposer = "offline"           # offline | llm

[llm]
model = "gpt-4o-mini"
api_key_env = "OPENAI_API_KEY" # the key itself is read from the environment, never stored
"""
