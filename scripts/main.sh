#!/usr/bin/env bash
# Install factor (creating .venv if needed) and run the main job on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/factor train "$@"
