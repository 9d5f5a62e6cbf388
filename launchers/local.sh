#!/usr/bin/env bash
# Run the generation job on this machine (no cluster): python -m distributed_spec.generate [overrides].
#
#   bash launchers/local.sh                                        # sample prompts, SmolLM2 pair, local engine
#   bash launchers/local.sh data.input_path=prompts.jsonl verifier=token verifier.num_draft_tokens=8
#   bash launchers/local.sh parallel=ray parallel.tp_size=2        # Ray started in-process, 2 target shards
#   bash launchers/local.sh --multirun verifier=block,token verifier.num_draft_tokens=2,4,8
#   DRY_RUN=1 bash launchers/local.sh verifier=token               # print the command, run nothing
#
# Every argument is a Hydra override (see conf/). Outputs go to runs/generate/... under the current
# directory; rerunning the same command resumes. Environment: PYTHON (default: the repo's
# .venv/bin/python when present, else python3), DRY_RUN=1 (or --dry-run).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY_RUN="${DRY_RUN:-0}"
args=()
for arg in "$@"; do
  if [[ "$arg" == "--dry-run" ]]; then DRY_RUN=1; else args+=("$arg"); fi
done

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi

# Local means local: with parallel=ray and no parallel.ray_address, Ray starts in this process
# instead of joining whatever cluster RAY_ADDRESS points at.
unset RAY_ADDRESS
# The package imports from the checkout even when it is not installed.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

cmd=("$PYTHON" -m distributed_spec.generate "${args[@]}")
# Prints a command as a shell would read it back (single quotes where needed).
show() {
  local line="+" arg
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then line+=" $arg"; else line+=" '${arg//\'/\'\\\'\'}'"; fi
  done
  echo "$line"
}
show "${cmd[@]}" >&2
if [[ "$DRY_RUN" == "1" ]]; then exit 0; fi
exec "${cmd[@]}"
