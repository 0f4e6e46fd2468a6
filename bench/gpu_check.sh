#!/usr/bin/env bash
# One call on a lent GPU machine (see the device tool's README): installs the Meridian wheel
# built here (carried in build/wheels; the extension embeds the .cu sources), then checks and
# times the CUDA kernels with bench/gpu_check.py. Builds nothing; fits in about 3 minutes.
#   device run: bash bench/gpu_check.sh   (carry: build/wheels)
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$(ls build/wheels/meridian_sched-*.whl)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/meridian-site "$wheel"
export PYTHONPATH=/tmp/meridian-site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
python3 bench/gpu_check.py "$@"
