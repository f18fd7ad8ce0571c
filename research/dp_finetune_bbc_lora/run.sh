#!/usr/bin/env bash
# BBC News (5 topics), SmolLM2-135M, ε=3, δ=1e-5: exact (mixed), hutchinson k=32 and non-private, side by side.
# CPU setting (see README.md): T=256, all 1,779 training articles, B=64 (q≈0.036), 1 epoch (≈28 steps),
# LoRA r=4 on the linear layers of the last 2 decoder blocks, every test article.
# Resumable: every cell runs with --resume (checkpoint every 4 steps), so re-running this script continues
# an unfinished cell and skips finished ones.
# --seed 0 makes the cells reproducible and comparable (same Poisson batches); it also reveals the noise,
# so a real private release must omit --seed.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=research/dp_finetune_bbc_lora
COMMON=(--model smollm2-135m --data bbc-news --task classify --max-length 256 --batch-size 64
        --physical-batch-size 8 --epochs 1 --lr 2e-3 --lora 4 --lora-layers 2 --seed 0 --checkpoint-every 4)
PRIVATE=(--epsilon 3 --delta 1e-5)
run_cell() {
  local name=$1; shift
  [ -s "$OUT/$name.json" ] && return 0
  local start=$(date +%s)
  .venv/bin/privlm train "${COMMON[@]}" "$@" --out "$OUT/runs/$name" --resume --json > "$OUT/$name.json.tmp"
  mv "$OUT/$name.json.tmp" "$OUT/$name.json"
  echo "$name $(( $(date +%s) - start )) s (this invocation)" >> "$OUT/wall_times.txt"
}
run_cell exact-mixed "${PRIVATE[@]}" --norm-mode mixed
run_cell hutchinson-k32 "${PRIVATE[@]}" --norm-mode hutchinson --probes 32
run_cell non-private --no-dp
