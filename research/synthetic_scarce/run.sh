#!/usr/bin/env bash
# The data-scarce regime (50 private examples per class, n = 10), most telling cells first: the best
# optimizer against its noise control and without DP, then the word-like select cells, then ADMM.
# Usage: [CODE=DIR] [WAIT_FOR=PID] OMP_NUM_THREADS=1 nohup research/synthetic_scarce/run.sh \
#          >> logs/rotten_tomatoes_scarce.log 2>&1 &      (CODE, WAIT_FOR: see research/driver.sh)
TOML=research/synthetic_scarce/config.toml
OUT=research/synthetic_scarce
source "$(dirname "$0")/../driver.sh"
for seed in 0 1 2; do
  run --cells "gradmm@instruct_n10_seed${seed}_eps1" --cells "gradmm@instruct-noise_n10_seed${seed}_eps1"
done
run --cells "gradmm@instruct_*"
run --cells "gradmm_*" --cells "gradmm@noise_*"
run
