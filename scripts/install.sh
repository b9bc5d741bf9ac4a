#!/usr/bin/env bash
# Create .venv if missing and install factor (and, with --dev, the test tools) into it.
# Idempotent: re-running after a change to pyproject.toml reinstalls, otherwise it is a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[install] creating .venv"
  "$PY" -m venv .venv
fi
# Java runs ScienceWorld and TextWorldExpress; install a headless JRE when missing.
if ! command -v java >/dev/null 2>&1; then
  echo "[install] java missing: installing a headless JRE with apt"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless) \
    || echo "[install] warning: could not install Java; environment adapters will report it missing"
fi
stamp=".venv/.factor-install-$(cat pyproject.toml | sha256sum | cut -c1-16)${extras:+-dev}"
if [ ! -f "$stamp" ]; then
  # torch first, pinned, so nothing resolves it to a CUDA build.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  if [ "$extras" = "--dev" ]; then
    .venv/bin/python -m pip install -q -e ".[dev]"
  else
    .venv/bin/python -m pip install -q -e .
  fi
  rm -f .venv/.factor-install-*
  touch "$stamp"
fi
