#!/usr/bin/env bash
# Here (with network), before a GPU run: fetch the wheels bench/gpu_check.sh installs on the
# device machine. That machine cannot fetch anything; its image has Python 3.12, torch, numpy,
# rich, httpx, anyio, h11, click and setuptools, but not these. They land in .whl/ (ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl orjson starlette uvicorn
ls .whl
