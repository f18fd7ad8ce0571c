# Sourced by the experiment drivers (experiments/run_*.sh): defines run ARGS..., one resumable stage of
# `privlm experiment "$TOML" --out "$ROOT/$OUT" --resume ARGS...` (finished cells are never rerun).
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
run() { (cd "$CODE" && PYTHONPATH="$CODE" "$ROOT/.venv/bin/python" -c "from privlm.cli import main; main()" \
  experiment "$TOML" --out "$ROOT/$OUT" --resume "$@"); }
if [ -n "${WAIT_FOR:-}" ]; then
  while kill -0 "$WAIT_FOR" 2>/dev/null; do sleep 30; done
fi
