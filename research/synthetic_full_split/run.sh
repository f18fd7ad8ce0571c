#!/usr/bin/env bash
# The full-split grid in order of importance (each stage resumes; finished cells are never rerun):
# generate-select on instructed candidates at ε = 1 against its noise control and zero-shot (n = 20, then 100),
# no-DP, ε = 4, the herding reference, the own-class objective at n = 100, ADMM (CPU cut: n <= 20), then the
# earlier word-like-candidate cells and the rest (the full-split reference last: hours on one core).
# Usage: [CODE=DIR] [WAIT_FOR=PID] OMP_NUM_THREADS=1 nohup research/synthetic_full_split/run.sh \
#          >> logs/rotten_tomatoes_full.log 2>&1 &      (CODE, WAIT_FOR: see research/driver.sh)
TOML=research/synthetic_full_split/config.toml
OUT=research/synthetic_full_split
source "$(dirname "$0")/../driver.sh"
# (n = 20 at ε = 1 first ran both objectives; the contrastive one separated from its noise control, the
#  own-class one did not, so the contrastive objective leads at n = 100)
run --cells "gradmm@instruct-own_n20_*_eps1" --cells "gradmm@instruct-own-noise_n20_*_eps1" \
    --cells "zero-shot_n20_*" --cells "random_n20_*"
run --cells "gradmm@instruct_n20_*_eps1" --cells "gradmm@instruct-noise_n20_*_eps1" --cells "gradmm@instruct_n20_*_epsnone"
for seed in 0 1 2; do  # DP and its noise control seed by seed: each pair is read as soon as it lands
  run --cells "gradmm@instruct_n100_seed${seed}_eps1"
  run --cells "gradmm@instruct-noise_n100_seed${seed}_eps1"
done
run --cells "zero-shot_n100_*" --cells "random_n100_*"
run --cells "gradmm@instruct_n100_*_epsnone" --cells "gradmm@instruct_*_eps4" --cells "gradmm@instruct-noise_*_eps4"
run --cells "herding_n20_*" --cells "herding_n100_*"
run --cells "gradmm@instruct_n5_*_eps1" --cells "gradmm@instruct-noise_n5_*_eps1" \
    --cells "gradmm@instruct_n10_*_eps1" --cells "gradmm@instruct-noise_n10_*_eps1"
run --cells "gradmm@instruct-own_n100_*_eps1" --cells "gradmm@instruct-own-noise_n100_*_eps1" \
    --cells "gradmm@instruct-own_*_epsnone"
run --cells "gradmm@admm_n20_*_eps1" --cells "gradmm@admm-noise_n20_*_eps1" --cells "gradmm@admm_n20_*_epsnone"
run --cells "gradmm@instruct-own_*_eps4" --cells "gradmm@instruct-own-noise_*_eps4"
run --cells "gradmm@instruct_*" --cells "gradmm@instruct-noise_*"
for n in 20 100; do
  run --cells "gradmm_n${n}_*_eps1" --cells "gradmm@noise_n${n}_*_eps1" --cells "gradmm_n${n}_*_epsnone"
  run --cells "gradmm@contrast_n${n}_*_eps1" --cells "gradmm@contrast-noise_n${n}_*_eps1" \
      --cells "gradmm@contrast_n${n}_*_epsnone"
done
run --cells "gradmm_*" --cells "gradmm@noise_*" --cells "zero-shot_*" --cells "random_*" --cells "herding_*"
run --cells "gradmm@admm_*_eps1" --cells "gradmm@admm-noise_*" --cells "gradmm@admm_*_epsnone"
run
