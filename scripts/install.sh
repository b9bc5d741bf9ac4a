#!/usr/bin/env bash
# Create .venv if missing and install factor into it (`--dev` adds pytest, hypothesis, ruff,
# playwright with Debian's chromium, the docs extra for the documentation site, and the ALFWorld
# extra, which compiles its planner the first time).
# Idempotent: it reinstalls only when pyproject.toml changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[install] creating .venv"
  "$PY" -m venv .venv
fi
# Java runs ScienceWorld and TextWorldExpress; install a headless JRE when it is missing.
if ! command -v java >/dev/null 2>&1; then
  echo "[install] java missing: installing a headless JRE with apt"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless) \
    || echo "[install] warning: could not install Java; environment adapters will report it missing"
fi
# --dev: the tests of `factor ledger show --html` and of the documentation site open pages in
# headless Chromium (Debian's package, driven by playwright from the dev extra; playwright's own
# browser download is unused).
if [ "$extras" = "--dev" ] && [ ! -x /usr/bin/chromium ]; then
  echo "[install] chromium missing: installing it with apt (the HTML page tests)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
    || echo "[install] warning: could not install chromium; the HTML page test will skip"
fi
base=".venv/.factor-install-$(sha256sum pyproject.toml | cut -c1-16)"
stamp="$base${extras:+-dev}"
# A dev install also satisfies a plain one.
if [ ! -f "$stamp" ] && [ ! -f "$base-dev" ]; then
  echo "[install] installing factor${extras:+ with dev tools} into .venv (first time: a few minutes)"
  pip() {
    # This machine's pip config lists local index folders that do not all exist; drop that noise.
    .venv/bin/python -m pip -q "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }
  }
  # torch first, pinned to the CPU wheel, so no dependency can resolve it to a CUDA build.
  pip install "torch==2.13.0"
  if [ "$extras" = "--dev" ]; then pip install -e ".[dev,alfworld,docs]"; else pip install -e .; fi
  rm -f .venv/.factor-install-*
  touch "$stamp"
fi
