#!/usr/bin/env bash
# Repeat the FSDP kill-and-resume test's two-rank run N times (default 30) and count the runs that fail, for
# the exit race `privlm.training.distributed.leave_group` narrows (docs/testing.md). Not run by `make test`;
# run it beside other work to load the cores:  tests/training/repeat_fsdp_resume.sh [N]
set -u
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
failed=0
for i in $(seq 1 "${1:-30}"); do
  OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node=2 \
    tests/training/fsdp_resume_worker.py "$work/r$i" "$work/r$i.pt" --crash-at 4 > /dev/null 2> "$work/err$i.log" \
    || { failed=$((failed + 1)); grep -m1 "terminate called" "$work/err$i.log"; }
done
echo "$failed of ${1:-30} runs failed"
rm -rf "$work"
