#!/usr/bin/env bash
# Submit the generation job to a running Ray cluster with `ray job submit`.
#
#   RAY_ADDRESS=http://head-node:8265 OUTPUT_DIR=/shared/runs/llama \
#     bash launchers/ray_cluster.sh model=llama3_70b_1b parallel.tp_size=4 parallel.device=cuda
#   DRY_RUN=1 bash launchers/ray_cluster.sh verifier=token        # print the command, submit nothing
#
# The checkout is uploaded as the job's working directory (without .venv, runs/, .git); the cluster's
# Python must already have the dependencies (pip install -e . on every node, or add them with
# RUNTIME_ENV_JSON). The job runs on the head node and joins the cluster (parallel.ray_address=auto),
# filling it with replicas of the runtime (parallel.num_replicas=auto unless given).
# Environment:
#   RAY_ADDRESS        the cluster's dashboard address (default http://127.0.0.1:8265)
#   OUTPUT_DIR         where completions go; use a shared filesystem path, since the job's working
#                      directory is a fresh temporary one per submission (and then resume works)
#   RUNTIME_ENV_JSON   the runtime environment (default: working dir + W&B variables below)
#   WANDB_MODE, WANDB_PROJECT  forwarded to the job when set (secrets such as WANDB_API_KEY and
#                      HF_TOKEN are not: set them in the cluster nodes' environment)
#   RAY_JOB_SUBMIT_ARGS  extra flags for `ray job submit` (e.g. --no-wait)
#   DRY_RUN=1 (or --dry-run)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY_RUN="${DRY_RUN:-0}"
args=()
for arg in "$@"; do
  if [[ "$arg" == "--dry-run" ]]; then DRY_RUN=1; else args+=("$arg"); fi
done

RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
env_vars=""
for name in WANDB_MODE WANDB_PROJECT; do
  if [[ -n "${!name:-}" ]]; then env_vars+="${env_vars:+, }\"$name\": \"${!name}\""; fi
done
RUNTIME_ENV_JSON="${RUNTIME_ENV_JSON:-{\"working_dir\": \"$REPO\", \"excludes\": [\".venv\", \"runs\", \"multirun\", \".git\", \"wandb\"], \"env_vars\": {$env_vars}}}"

job_args=(parallel=ray parallel.ray_address=auto)
# Fill the cluster: as many replicas of the runtime as it holds, unless the job says how many.
replicas=(parallel.num_replicas=auto)
for arg in "${args[@]}"; do
  if [[ "$arg" == parallel.num_replicas=* ]]; then replicas=(); fi
done
job_args+=("${replicas[@]}")
if [[ -n "${OUTPUT_DIR:-}" ]]; then job_args+=("data.output_dir=$OUTPUT_DIR"); fi
read -r -a submit_extra <<< "${RAY_JOB_SUBMIT_ARGS:-}"

cmd=(ray job submit --address "$RAY_ADDRESS" --runtime-env-json "$RUNTIME_ENV_JSON" "${submit_extra[@]}"
     -- python -m distributed_spec.generate "${job_args[@]}" "${args[@]}")
# Prints a command as a shell would read it back (single quotes where needed).
show() {
  local line="+" arg
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then line+=" $arg"; else line+=" '${arg//\'/\'\\\'\'}'"; fi
  done
  echo "$line"
}
show "${cmd[@]}"
if [[ "$DRY_RUN" == "1" ]]; then exit 0; fi
exec "${cmd[@]}"
