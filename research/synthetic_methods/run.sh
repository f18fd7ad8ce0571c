#!/usr/bin/env bash
# The methods grid in order of importance (each stage resumes; finished cells are never rerun): PE at ε = 1 and
# n = 100 (the target cell), then ε = 4 at n = 100, then n = 20, then anything left. dp-finetune-gen's
# n = 100 cells reuse the n = 20 cells' training runs when both run in one work folder.
# Usage: [CODE=DIR] [WAIT_FOR=PID] OMP_NUM_THREADS=1 nohup research/synthetic_methods/run.sh \
#          >> logs/rotten_tomatoes_pe.log 2>&1 &      (CODE, WAIT_FOR: see research/driver.sh)
TOML=research/synthetic_methods/config.toml
OUT=research/synthetic_methods
source "$(dirname "$0")/../driver.sh"
run --cells "pe_n100_*_eps1"
run --cells "pe_n100_*_eps4"
run --cells "dp-finetune-gen_n100_*_eps4"
run --cells "pe_n20_*_eps1" --cells "pe_n20_*_eps4"
run
