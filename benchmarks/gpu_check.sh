#!/usr/bin/env bash
# One prepared GPU check (a few minutes on one device), most important first:
#   1. the long-context step benchmark (top-N private step, every norm mode) at T = 1,024 .. 16,384, float32, then bf16 autocast (flash attention) at T ≥ 4,096;
#   2. the device-noise tests (ChaCha20 keystream on CUDA bitwise against the CPU's) and the noise paths' rates.
# Usage: benchmarks/gpu_check.sh [RESULTS_DIR]      (default: benchmarks/results)
# PY names the interpreter (default .venv/bin/python); on a bare GPU machine whose python3 holds torch,
# transformers and peft, put privlm's other needs on PYTHONPATH and run with PY=python3.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RES=${1:-benchmarks/results}
mkdir -p "$RES"
$PY benchmarks/long_context_step.py --device cuda --seq-lens 1024,2048,4096,8192,16384 \
  --budget-s 240 --out "$RES/long_context_step_cuda.json"
$PY benchmarks/long_context_step.py --device cuda --precision bf16 --seq-lens 4096,8192,16384 \
  --budget-s 170 --out "$RES/long_context_step_cuda_bf16.json"
$PY -m pytest -q -p no:cacheprovider tests/test_chacha.py -k cuda -m "slow or not slow"
$PY benchmarks/device_noise.py --device cuda --values $((1 << 26)) --out "$RES/device_noise_cuda.json"
