#!/usr/bin/env bash
# The grid in order of importance (each stage resumes; finished cells are never rerun). Seed 0 first at
# eps = 1: n = 100 (its candidates are the first tenth of the n = 1,000 pool) with its noise-only control,
# random and zero-shot; dp-finetune-gen (one training per (eps, seed) serves both n; n = 100 first, its row sooner); then n = 1,000, the
# targets' cells (the 20,000-candidate pool, about 4 h on one core), then the other seeds, eps = 4, no-DP
# GRADMM, PE and the whole-split reference last.
# Usage: [CODE=DIR] [WAIT_FOR=PID] OMP_NUM_THREADS=1 nohup research/synthetic_at_scale/run.sh \
#          >> logs/synthetic_at_scale.log 2>&1 &      (CODE, WAIT_FOR: see research/driver.sh)
TOML=research/synthetic_at_scale/config.toml
OUT=research/synthetic_at_scale
source "$(dirname "$0")/../driver.sh"
# the committed public candidate pool (answers and label-filter verdicts) into work/, so no cell makes it again
PYTHONPATH="$CODE" "$ROOT/.venv/bin/python" "$ROOT/$OUT/public_pool.py" restore
run --cells "gradmm@instruct_n100_seed0_eps1" --cells "gradmm@instruct-noise_n100_seed0_eps1" \
    --cells "random_n100_seed0_*" --cells "zero-shot_n100_seed0_*"
run --cells "dp-finetune-gen_n100_seed0_eps1"
run --cells "dp-finetune-gen_n1000_seed0_eps1"
for seed in 0 1 2; do
  run --cells "gradmm@instruct_n1000_seed${seed}_eps1" --cells "gradmm@instruct-noise_n1000_seed${seed}_eps1" \
      --cells "random_n1000_seed${seed}_*" --cells "zero-shot_n1000_seed${seed}_*"
  run --cells "dp-finetune-gen_n1000_seed${seed}_eps1"
done
run --cells "gradmm@instruct_n1000_*" --cells "gradmm@instruct-noise_n1000_*"
run --cells "dp-finetune-gen_n1000_*"
run --cells "gradmm@instruct_n100_*" --cells "gradmm@instruct-noise_n100_*" --cells "random_n100_*" \
    --cells "zero-shot_n100_*" --cells "dp-finetune-gen_n100_*"
run --cells "pe_*"
run
