#!/usr/bin/env bash
# One prepared GPU check (a few minutes on one device): the device-noise tests, the noise paths' rates,
# and the long-context step benchmark at long T. Writes into benchmarks/results/ (JSON + PNG).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
$PY -m pytest -q tests/test_chacha.py -k "cuda or compiled" -m "slow or not slow"
$PY benchmarks/device_noise.py --device cuda --values $((1 << 26)) --out benchmarks/results/device_noise_cuda.json
if [ -f benchmarks/long_context_step.py ]; then
  $PY benchmarks/long_context_step.py --device cuda --seq-lens 4096,8192,16384 \
    --budget-s 420 --out benchmarks/results/long_context_step_cuda.json
fi
