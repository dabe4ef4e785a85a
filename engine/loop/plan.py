"""The run plan: what one ``poise-git run`` does, decided once and recorded in the run record.

Each setting has one source of truth, applied in one place (:func:`resolve_plan`): the command line
overrides the run being resumed, which overrides ``poise.toml``. The plan is stored as a plain JSON
object under ``plan`` in the run record (``refs/poise/run``); records written before this type read
back the same way (missing keys take the configured value, unknown keys are ignored).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.config import Config
from engine.errors import PoiseError
from engine.operators.proposers import is_known
from trainer_template.proxy.protocol import PRESETS

TRAINING_BACKENDS = ("proxy", "verl")


@dataclass(frozen=True)
class RunPlan:
    """Rounds ``start_round .. last_round`` of K parents, each proposing N candidates of which M
    (:attr:`children`) are implemented, each evaluated on S seeds."""

    rounds: int = 1
    """R rounds to run"""
    parents: int = 3
    """K parents selected per round (``[select].k``)"""
    population: int = 4
    """N candidates proposed per parent (``[propose].population``)"""
    implement: int = 0
    """M of the N screened proposals implemented per parent (``[propose].implement``; 0: all N)"""
    seeds: int = 1
    """S paired seeds per evaluation (``[evaluation].seeds``)"""
    proposer: str = "offline"
    """offline | llm (``[propose].proposer``)"""
    backend: str = "proxy"
    """proxy | verl (``[evaluation].backend``)"""
    preset: str = "default"
    """the proxy protocol preset (``[proxy].preset``)"""
    eval_timeout_s: float = 1800.0
    """hard wall-clock limit of one evaluation, seconds (``[evaluation].timeout_s``)"""
    seed: int = 0
    """seed of selection and proposal (``[select].seed``)"""
    gpus_per_eval: float = 1.0
    """GPUs one verl evaluation holds (Ray scheduling and the gpu-hours budget)"""
    start_round: int = 1
    """the first round's number (one past the archive's last round when the run started)"""
    confirm_seeds: int = 0
    """held-out seeds of the confirmation of the best node once the rounds are done (0: none);
    recorded, so that a run killed before it is done still does it on ``--resume``"""

    def __post_init__(self) -> None:
        for name in ("rounds", "parents", "population", "seeds", "start_round"):
            if int(getattr(self, name)) < 1:
                raise PoiseError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        if int(self.confirm_seeds) < 0:
            raise PoiseError(f"--confirm-seeds must be >= 0, got {self.confirm_seeds}")
        if not 0 <= int(self.implement) <= int(self.population):
            raise PoiseError(
                f"--implement must be between 0 (all) and --population ({self.population}), "
                f"got {self.implement}"
            )
        if not is_known(self.proposer):
            raise PoiseError(
                f"--proposer must be offline, llm or a registered proposer, got {self.proposer!r}"
            )
        if self.backend not in TRAINING_BACKENDS:
            raise PoiseError(f"--backend must be proxy or verl, got {self.backend!r}")
        if self.backend == "proxy" and self.preset not in PRESETS:
            raise PoiseError(f"--preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
        if not 0 < float(self.eval_timeout_s) < math.inf:  # NaN fails too
            raise PoiseError(f"--eval-timeout must be > 0 and finite, got {self.eval_timeout_s}")

    @property
    def last_round(self) -> int:
        return self.start_round + self.rounds - 1

    @property
    def children(self) -> int:
        """Children per parent and round: ``implement``, or N when it is 0."""
        return int(self.implement) or int(self.population)

    @classmethod
    def from_config(cls, cfg: Config, start_round: int = 1) -> RunPlan:
        """The plan ``poise.toml`` defines (one round)."""
        return cls(
            parents=cfg.select.k,
            population=cfg.propose.population,
            implement=cfg.propose.implement,
            seeds=cfg.evaluation.seeds,
            proposer=cfg.propose.proposer,
            backend=cfg.evaluation.backend,
            preset=cfg.proxy.preset,
            eval_timeout_s=cfg.evaluation.timeout_s,
            seed=cfg.select.seed,
            start_round=start_round,
        )

    def replaced(self, values: Mapping[str, Any]) -> RunPlan:
        """This plan with ``values`` (field -> value; None means "not given") taking precedence."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise PoiseError(f"unknown run plan setting(s): {', '.join(unknown)}")
        given = {k: _coerce(k, v, fields[k].type) for k, v in values.items() if v is not None}
        return dataclasses.replace(self, **given)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def apply(self, cfg: Config) -> Config:
        """``cfg`` as the operators of this run see it (seeds, preset, K, N, proposer, seed, timeout;
        each checked by the plan itself, the rest of ``cfg`` when poise.toml was loaded)."""
        out = dataclasses.replace(
            cfg,
            evaluation=dataclasses.replace(
                cfg.evaluation,
                backend=self.backend,
                seeds=self.seeds,
                timeout_s=self.eval_timeout_s,
            ),
            proxy=dataclasses.replace(cfg.proxy, preset=self.preset),
            select=dataclasses.replace(cfg.select, k=self.parents, seed=self.seed),
            propose=dataclasses.replace(
                cfg.propose,
                proposer=self.proposer,
                population=self.population,
                implement=self.implement,
            ),
        )
        return out


def resolve_plan(
    cfg: Config,
    overrides: Mapping[str, Any],
    recorded: Mapping[str, Any] | None = None,
    start_round: int = 1,
) -> RunPlan:
    """The one place a plan is decided: ``poise.toml`` (``cfg``), then the ``recorded`` plan of the run
    being resumed (its own ``start_round`` included), then the command line's ``overrides``."""
    plan = RunPlan.from_config(cfg, start_round)
    if recorded is not None:
        plan = plan.replaced({k: v for k, v in recorded.items() if k in _FIELDS})
    return plan.replaced(overrides)


_FIELDS = frozenset(f.name for f in dataclasses.fields(RunPlan))


def _coerce(name: str, value: Any, kind: Any) -> Any:
    """A recorded or typed value as the field's type (JSON keeps 2.0 as 2, an old record may hold
    "2"); anything else is one clear error."""
    kind = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    try:
        if kind == "int":
            if isinstance(value, bool) or float(value) != int(float(value)):
                raise ValueError
            return int(float(value))
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind == "str":
            if not isinstance(value, str):
                raise ValueError
            return value
    except (TypeError, ValueError):
        raise PoiseError(f"run plan: {name} must be {kind}, got {value!r}") from None
    return value
