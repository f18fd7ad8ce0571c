# Sourced by the experiment drivers (experiments/run_*.sh): defines run ARGS..., one resumable stage of
# `privlm experiment "$TOML" --out "$ROOT/$OUT" --resume ARGS...` (finished cells are never rerun), and
# work_queue PATTERN..., which runs `run --cells PATTERN` for each pattern in order that matches a cell still to run.
# Set TOML and OUT before sourcing. Environment:
#   CODE=DIR      run the code of another checkout of privlm (a snapshot worktree, so that merges into this one
#                 cannot change modules under a running stage); results still go to this checkout's results/.
#   WAIT_FOR=PID  first wait for that process to exit (e.g. a previous driver's stage still running).
# Replace a running driver's script with `mv` (a new file), never by editing it in place: bash reads a script
# as it runs.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
CODE=${CODE:-$ROOT}
privlm_experiment() { (cd "$CODE" && PYTHONPATH="$CODE" "$ROOT/.venv/bin/python" -c "from privlm.cli import main; main()" \
  experiment "$TOML" --out "$ROOT/$OUT" "$@"); }
run() { privlm_experiment --resume "$@"; }
# A stage whose cells are all finished still loads the model and rewrites the report (about 20 s in the log's timestamps): on a new machine
# a long queue spent minutes so. work_queue asks `--pending` (no model, no data) which cells are left, again after
# each stage it runs (the other worker's finished cells then drop out too); a stage is run for a pattern matching
# one of them (bash's glob: use only *, ? and [...] without ^ or \, where bash and --cells agree). A cell the
# other worker holds is still listed, and its stage passes over it, as before. A machine with no cell left runs
# no stage, so nothing rewrites the report. Where --pending fails, every stage is run (its error shows).
work_queue() {
  local -
  set -f  # the keys are words, never file names
  local pattern key keys
  keys=$(privlm_experiment --pending) || keys="(all)"
  for pattern in "$@"; do
    for key in $keys; do
      # shellcheck disable=SC2053  # the pattern is a glob on purpose
      if [ "$keys" = "(all)" ] || [[ $key == $pattern ]]; then
        run --cells "$pattern"
        keys=$(privlm_experiment --pending) || keys="(all)"
        break
      fi
    done
  done
}
if [ -n "${WAIT_FOR:-}" ]; then
  while kill -0 "$WAIT_FOR" 2>/dev/null; do sleep 30; done
fi
