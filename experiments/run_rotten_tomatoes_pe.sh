#!/usr/bin/env bash
# Issue 15 grid in order of importance (each stage resumes; finished cells are never rerun): ε = 1 at n = 20, then
# n = 100 (dp-finetune-gen's n = 100 cells reuse the n = 20 cells' training runs), then ε = 4, then anything left.
# Usage: OMP_NUM_THREADS=1 nohup experiments/run_rotten_tomatoes_pe.sh > logs/rotten_tomatoes_pe.log 2>&1 &
# (WAIT_FOR=PID: first wait for that process to exit.)
set -u
cd "$(dirname "$0")/.."
PRIVLM=${PRIVLM:-.venv/bin/privlm}
run() { "$PRIVLM" experiment experiments/rotten_tomatoes_pe.toml --out results/rotten_tomatoes_pe --resume "$@"; }
if [ -n "${WAIT_FOR:-}" ]; then
  while kill -0 "$WAIT_FOR" 2>/dev/null; do sleep 30; done
fi
for eps in 1 4; do
  for n in 20 100; do
    run --cells "pe_n${n}_seed0_eps${eps}" --cells "dp-finetune-gen_n${n}_seed0_eps${eps}"
    run --cells "pe_n${n}_*_eps${eps}" --cells "dp-finetune-gen_n${n}_*_eps${eps}"
  done
done
run
