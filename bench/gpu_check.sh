#!/usr/bin/env bash
# On the device machine (an NVIDIA GPU, no network), from the repository root, with .whl/
# carried (bench/gpu_wheels.sh fetches it here):
#
#   run(command="bash bench/gpu_check.sh", carry=[".whl"], timeout_s=420)
#
# then copy $OUT/gpu-check.md to docs/gpu-check.md and commit it. One call: installs the
# missing wheels, builds the C extension in place (the check says whether it is in use),
# and runs bench/gpu_check.py.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1
python3 setup.py -q build_ext --inplace >"${OUT:-/tmp}/build.log" 2>&1 || echo "C extension not built: pure-Python stages (see build.log)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
timeout 360 python3 bench/gpu_check.py | tee "${OUT:-/tmp}/gpu-check.md"
