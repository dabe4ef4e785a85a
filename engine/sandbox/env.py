"""Environments of child processes, built from allowlists.

A sandboxed child gets :func:`candidate_env`: a fixed set of harmless variables plus what the caller
names — nothing of the engine's environment unless ``$POISE_SANDBOX_ENV`` lists it (comma-separated
names), and never a secret (``engine.secrets``). Trusted children (the warm-start builder, the
evaluation worker of the loop) get :func:`trusted_env`: the engine's environment minus every secret.
verl's processes (which run candidate code outside the boundary) get :func:`without_secrets`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from engine import secrets
from engine.archive.tracking import bounded_here
from engine.sandbox.boundary import PROJECT

PASS_ENV = "POISE_SANDBOX_ENV"
BASE = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONNOUSERSITE": "1",
    "USER": "sandbox",
    "LOGNAME": "sandbox",
}


def candidate_env(
    extra: Mapping[str, str] | None = None, *, home: str, pythonpath: str
) -> dict[str, str]:
    """The whole environment of a sandboxed child."""
    env = dict(BASE)
    env.update(HOME=home, TMPDIR="/tmp" if home.startswith("/scratch") else home)
    env["PYTHONPATH"] = pythonpath
    hidden = secrets.names()
    for name in os.environ.get(PASS_ENV, "").split(","):
        name = name.strip()
        if name and name in os.environ and name not in hidden:
            env[name] = os.environ[name]
    for k, v in (extra or {}).items():
        if k not in hidden:
            env[k] = v
    return env


def without_secrets(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine's environment minus every secret variable and the MLflow HTTP bounds the engine set
    for its own logging (a child logging to MLflow sets its own), then ``extra`` (the caller's own)."""
    hidden = secrets.names()
    ours = bounded_here()
    env = {k: v for k, v in os.environ.items() if k not in hidden and ours.get(k) != v}
    env.update(extra or {})
    return env


def trusted_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine's environment minus secrets, the project importable, one torch thread."""
    env = without_secrets()
    root = str(PROJECT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env
