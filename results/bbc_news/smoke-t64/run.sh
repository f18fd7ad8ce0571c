#!/usr/bin/env bash
# BBC News (5 topics), SmolLM2-135M + LoRA r=8, ε=3, δ=1e-5: non-private, exact (mixed) and hutchinson k=32.
# Resumable: every cell runs with --resume, so re-running this script continues unfinished cells from their
# last checkpoint and re-scores finished ones. Cut to fit a shared 2-core CPU (see README.md): T=64,
# the first 160 training articles, B=16 (q=0.1), 1 epoch = 10 steps, 100 test articles.
# --seed 0 makes the cells reproducible and comparable; it also reveals the noise, so a real private
# release must omit --seed.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=results/bbc_news
COMMON=(--model smollm2-135m --data bbc-news --task classify --max-length 64 --batch-size 16
        --physical-batch-size 8 --epochs 1 --lr 2e-3 --lora 8 --max-train 160 --max-test 100 --seed 0
        --checkpoint-every 2)
PRIVATE=(--epsilon 3 --delta 1e-5)
run_cell() {
  local name=$1; shift
  [ -s "$OUT/$name.json" ] && return 0
  local start=$(date +%s)
  .venv/bin/privlm train "${COMMON[@]}" "$@" --out "$OUT/runs/$name" --resume --json > "$OUT/$name.json.tmp"
  mv "$OUT/$name.json.tmp" "$OUT/$name.json"
  echo "$name $(( $(date +%s) - start )) s (this invocation)" >> "$OUT/wall_times.txt"
}
run_cell non-private --no-dp
run_cell exact-mixed "${PRIVATE[@]}" --norm-mode mixed
run_cell hutchinson-k32 "${PRIVATE[@]}" --norm-mode hutchinson --probes 32
