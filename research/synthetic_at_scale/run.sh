#!/usr/bin/env bash
# The grid in order of importance, on both cores (each stage resumes; finished cells are never rerun).
# First the public candidate pool (answers, label filter, the selection's hidden states: public_pool.py, one
# process per class or half; what the committed public-pool/ holds is restored, not remade). Then the
# targets' cells at eps = 1, n = 1,000, seed by seed, two at a time: the GRADMM set beside its noise-only
# control, then zero-shot beside random, then dp-finetune-gen; then eps = 4, the n = 100 cells of seeds 1-2,
# PE and the whole-split reference last. The first n = 100 cells (seed 0) are done.
# Usage: [CODE=DIR] [WAIT_FOR=PID] nohup research/synthetic_at_scale/run.sh \
#          >> logs/synthetic_at_scale.log 2>&1 &      (CODE, WAIT_FOR: see research/driver.sh)
# After the pool stage, commit public-pool/ (`public_pool.py save` is run here).
TOML=research/synthetic_at_scale/config.toml
OUT=research/synthetic_at_scale
source "$(dirname "$0")/../driver.sh"
export OMP_NUM_THREADS=1
pool() { PYTHONPATH="$CODE" "$ROOT/.venv/bin/python" "$ROOT/$OUT/public_pool.py" "$@"; }
pool restore
pool answers --label 0 & pool answers --label 1 & wait
pool labels --part 0/2 & pool labels --part 1/2 & wait
pool save
pool hidden --label 0 & pool hidden --label 1 & wait
for seed in 0 1 2; do
  run --cells "gradmm@instruct_n1000_seed${seed}_eps1" & run --cells "gradmm@instruct-noise_n1000_seed${seed}_eps1" & wait
  run --cells "zero-shot_n1000_seed${seed}_*" & run --cells "random_n1000_seed${seed}_*" & wait
  run --cells "dp-finetune-gen_n1000_seed${seed}_eps1"
done
run --cells "gradmm@instruct_n1000_*" & run --cells "gradmm@instruct-noise_n1000_*" & wait
run --cells "dp-finetune-gen_n1000_*"
run --cells "gradmm@instruct_n100_*" --cells "gradmm@instruct-noise_n100_*" --cells "random_n100_*" \
    --cells "zero-shot_n100_*" --cells "dp-finetune-gen_n100_*"
run --cells "pe_*"
run
