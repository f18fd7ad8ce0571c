#!/usr/bin/env bash
# Issue 13 grid in order of importance (each stage resumes; finished cells are never rerun):
# generate-select on instructed candidates at ε = 1 against its noise control and zero-shot (n = 20, then 100),
# no-DP, the contrastive ablation, ε = 4, then the earlier word-like-candidate cells, ADMM, and the rest.
# Usage: OMP_NUM_THREADS=1 nohup experiments/run_rotten_tomatoes_full.sh > logs/rotten_tomatoes_full.log 2>&1 &
# (WAIT_FOR=PID: first wait for that process to exit.)
set -u
cd "$(dirname "$0")/.."
run() { .venv/bin/privlm experiment experiments/rotten_tomatoes_full.toml --out results/rotten_tomatoes_full --resume "$@"; }
if [ -n "${WAIT_FOR:-}" ]; then  # a previous driver's cell process still running: start after it
  while kill -0 "$WAIT_FOR" 2>/dev/null; do sleep 30; done
fi
for n in 20 100; do
  run --cells "gradmm@instruct-own_n${n}_*_eps1" --cells "gradmm@instruct-own-noise_n${n}_*_eps1" \
      --cells "zero-shot_n${n}_*" --cells "random_n${n}_*"
  run --cells "gradmm@instruct-own_n${n}_*_epsnone" --cells "gradmm@instruct_n${n}_*_eps1" \
      --cells "gradmm@instruct-noise_n${n}_*_eps1"
done
run --cells "gradmm@instruct-own_*_eps4" --cells "gradmm@instruct-own-noise_*_eps4" --cells "herding_n20_*" --cells "herding_n100_*"
run --cells "gradmm@instruct_*" --cells "gradmm@instruct-noise_*"
for n in 20 100; do
  run --cells "gradmm_n${n}_*_eps1" --cells "gradmm@noise_n${n}_*_eps1" --cells "gradmm_n${n}_*_epsnone"
  run --cells "gradmm@contrast_n${n}_*_eps1" --cells "gradmm@contrast-noise_n${n}_*_eps1" \
      --cells "gradmm@contrast_n${n}_*_epsnone"
done
run --cells "gradmm_*" --cells "gradmm@noise_*" --cells "zero-shot_*" --cells "random_*" --cells "herding_*"
run --cells "gradmm@admm_*_eps1" --cells "gradmm@admm_*_epsnone"
run
