#!/usr/bin/env bash
# Install factor with its test tools (creating .venv if needed) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --dev
exec .venv/bin/python -m pytest -q "$@"
