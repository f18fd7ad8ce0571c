#!/usr/bin/env bash
# Issue 13 grid in order of importance (each stage resumes; finished cells are never rerun):
# generate-select on instructed candidates at ε = 1 against its noise control and zero-shot (n = 20, then 100),
# no-DP, ε = 4, then the earlier word-like-candidate cells, ADMM, and the rest.
# Usage: OMP_NUM_THREADS=1 nohup experiments/run_rotten_tomatoes_full.sh > logs/rotten_tomatoes_full.log 2>&1 &
# CODE=DIR runs the code of another checkout of privlm (e.g. a snapshot worktree, so that merges into this one
# cannot change modules under a running stage); results still go to this checkout's results/.
# (WAIT_FOR=PID: first wait for that process to exit.)
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
CODE=${CODE:-$ROOT}
run() { (cd "$CODE" && PYTHONPATH="$CODE" "$ROOT/.venv/bin/python" -c "from privlm.cli import main; main()" \
  experiment experiments/rotten_tomatoes_full.toml --out "$ROOT/results/rotten_tomatoes_full" --resume "$@"); }
if [ -n "${WAIT_FOR:-}" ]; then  # a previous driver's cell process still running: start after it
  while kill -0 "$WAIT_FOR" 2>/dev/null; do sleep 30; done
fi
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
run --cells "gradmm@instruct-own_n100_*_eps1" --cells "gradmm@instruct-own-noise_n100_*_eps1" \
    --cells "gradmm@instruct-own_*_epsnone"
run --cells "herding_n20_*" --cells "herding_n100_*"
run --cells "gradmm@instruct-own_*_eps4" --cells "gradmm@instruct-own-noise_*_eps4"
run --cells "gradmm@instruct_*" --cells "gradmm@instruct-noise_*"
for n in 20 100; do
  run --cells "gradmm_n${n}_*_eps1" --cells "gradmm@noise_n${n}_*_eps1" --cells "gradmm_n${n}_*_epsnone"
  run --cells "gradmm@contrast_n${n}_*_eps1" --cells "gradmm@contrast-noise_n${n}_*_eps1" \
      --cells "gradmm@contrast_n${n}_*_epsnone"
done
run --cells "gradmm_*" --cells "gradmm@noise_*" --cells "zero-shot_*" --cells "random_*" --cells "herding_*"
run --cells "gradmm@admm_*_eps1" --cells "gradmm@admm_*_epsnone"
run
