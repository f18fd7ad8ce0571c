#!/usr/bin/env bash
# Issue 13 grid in order of importance (each stage resumes; finished cells are never rerun):
# the ε = 1 claims at n = 20 and 100 against the noise control and zero-shot, then no-DP and references,
# then ε = 4, then n = 5/10, then ADMM, then everything left (full-pool last).
# Usage: OMP_NUM_THREADS=1 nohup experiments/run_rotten_tomatoes_full.sh > logs/rotten_tomatoes_full.log 2>&1 &
# (WAIT_FOR=PID: first wait for that process to exit.)
set -u
cd "$(dirname "$0")/.."
run() { .venv/bin/privlm experiment experiments/rotten_tomatoes_full.toml --out results/rotten_tomatoes_full --resume "$@"; }
if [ -n "${WAIT_FOR:-}" ]; then  # a previous driver's cell process still running: start after it
  while kill -0 "$WAIT_FOR" 2>/dev/null; do sleep 30; done
fi
for n in 20 100; do
  run --cells "gradmm_n${n}_*_eps1" --cells "gradmm@noise_n${n}_*_eps1" --cells "zero-shot_n${n}_*" \
      --cells "gradmm_n${n}_*_epsnone" --cells "random_n${n}_*"
  run --cells "gradmm@contrast_n${n}_*_eps1" --cells "gradmm@contrast-noise_n${n}_*_eps1" \
      --cells "gradmm@contrast_n${n}_*_epsnone"
done
run --cells "herding_n20_*" --cells "herding_n100_*"
run --cells "gradmm_n20_*_eps4" --cells "gradmm@noise_n20_*_eps4" --cells "gradmm_n100_*_eps4" --cells "gradmm@noise_n100_*_eps4"
run --cells "gradmm_*" --cells "gradmm@noise_*" --cells "zero-shot_*" --cells "random_*" --cells "herding_*"
run --cells "gradmm@admm_*_eps1" --cells "gradmm@admm_*_epsnone"
run
