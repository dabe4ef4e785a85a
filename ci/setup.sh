#!/usr/bin/env bash
# Idempotent set-up of ./.venv with poise-git (editable) and everything its tests need, on a fresh
# machine: the CPU build of torch first (so no dependency drags in a CUDA build), then the project with
# its verl (CPU-importable core_algos, ray) and dev extras. Re-runs are instant until pyproject changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
stamp=".venv/.poise-setup-$(cat pyproject.toml ci/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "poise-git: setting up .venv (first run takes a few minutes)..." >&2
  # --no-compile, then one compileall over every core: pip byte-compiles its 25,000 files on one
  # core (about 110 s here); sandboxed children cannot write a missing .pyc, so all are made here
  if ! "$VPY" -c "import torch" 2>/dev/null; then
    "$VPY" -m pip install -q --no-compile "torch==2.13.0" || "$VPY" -m pip install -q --no-compile torch
  fi
  "$VPY" -m pip install -q --no-compile -e ".[verl,dev]"
  "$VPY" -m compileall -q -j 0 "$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null || true  # one torch test file is Python 3.12 syntax (pip skips it too): left as it is
  # Headless Chromium renders the HTML report in its test; installed only as root with apt
  # (set POISE_NO_APT=1 to skip). Without it that one test skips with its reason.
  if [ -z "${POISE_NO_APT:-}" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
     && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "poise-git: chromium could not be installed; the report render test will skip" >&2
  fi
  # bubblewrap is the OS boundary around candidate code (docs/security.md): as root with apt, or
  # with passwordless sudo. Without it, commands that run candidate code stop and say how to install
  # it (or to choose the weak mode, rlimits only, with POISE_SANDBOX=none).
  if [ -z "${POISE_NO_APT:-}" ] && ! command -v bwrap >/dev/null && command -v apt-get >/dev/null; then
    SUDO=""
    [ "$(id -u)" = 0 ] || { sudo -n true 2>/dev/null && SUDO="sudo -n"; }
    if [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; then
      ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq bubblewrap >/dev/null) \
        || echo "poise-git: bubblewrap could not be installed; commands that run candidate code will refuse to (docs/security.md)" >&2
    else
      echo "poise-git: install bubblewrap (apt-get install bubblewrap) for the OS boundary" >&2
    fi
  fi
  rm -f .venv/.poise-setup-*
  touch "$stamp"
fi
