#!/usr/bin/env bash
# The GPU checks of issue 5, as one short script for a lent GPU machine (no network there).
#
#   On a CPU machine first (network to PyPI), fetch what the GPU host's python3 lacks as wheels:
#     scripts/gpu-check.sh --fetch-wheels          # -> .whl/ (ignored by git; carry it)
#   Then on the GPU host, from the repository root:
#     scripts/gpu-check.sh [RECORD_DIR]            # runs the gpu-marked tests, records NVML/profile/nsys output
#
# The gpu tests run in-process with the host's own torch + transformers (INFERTOOL_IN_PROCESS=1): the managed
# environments are not needed there. Recordings land in RECORD_DIR (default: tests/fixtures/recorded).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS="pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 platformdirs==4.14.8"
if [ "${1:-}" = "--fetch-wheels" ]; then
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl $WHEELS
    exit 0
fi
RECORD_DIR="${1:-tests/fixtures/recorded}"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/infertool-site .whl/*.whl
    export PYTHONPATH="/tmp/infertool-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export INFERTOOL_IN_PROCESS=1 INFERTOOL_ACCELERATOR=cuda INFERTOOL_HOME="${INFERTOOL_HOME:-/tmp/infertool-home}"
export INFERTOOL_RECORD_DIR="$RECORD_DIR" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv || true
command -v nsys && nsys --version || echo "nsys: not on PATH (the --nsys test skips)"
python3 -m pytest -p no:cacheprovider -m gpu -v tests/test_profile_gpu.py tests/test_profile.py
