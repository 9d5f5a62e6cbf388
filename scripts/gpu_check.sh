#!/usr/bin/env bash
# bash scripts/gpu_check.sh [--dry-run] [--python PATH] [--iters N]
#
# The one GPU script. On a machine with one CUDA GPU, in under 12 minutes:
#   1. the fused kernel's correctness tests on CUDA (tests/verify/test_triton_block.py, TRITON_INTERPRET unset);
#   2. the timing table of fused vs torch verification (B in {1, 64, 256}, g in {4, 8}, V = 128256,
#      bf16 logits; scripts/bench_verify.py --impl triton);
#   3. the runtimes (scripts/gpu_check_runtime.py): NCCL backend selection and the placement plan,
#      local engine vs Ray TP = 1 with the draft co-located on the one GPU (tiny models built there,
#      then the default SmolLM2 pair if its files are present), per-GPU memory.
# Results go to $OUT if set, else ./gpu_check_out/: env.txt, pytest.txt, bench_verify_fused.md, runtime.md.
# Without CUDA (or with --dry-run) only the CPU smoke path runs: the benchmark at a tiny size in
# Triton's interpreter, and the runtime check, which skips; the exit status is then 0 with --dry-run
# and 3 without.
set -uo pipefail

usage() { sed -n '2,/^[^#]/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; }

DRY_RUN=0
PYTHON_BIN="${PYTHON:-}"
ITERS=20
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dry-run) DRY_RUN=1; shift ;;
        --python) PYTHON_BIN="${2:?--python needs a path}"; shift 2 ;;
        --iters) ITERS="${2:?--iters needs a number}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
if ! [[ "$ITERS" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu_check.sh: --iters must be a positive integer, got '$ITERS'" >&2; exit 2
fi

cd "$(dirname "$0")/.."
if [[ -z "$PYTHON_BIN" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON_BIN=.venv/bin/python; else PYTHON_BIN=python3; fi
fi
OUT_DIR="${OUT:-./gpu_check_out}"
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET

{
    date -u
    "$PYTHON_BIN" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
    "$PYTHON_BIN" -c 'import triton; print("triton", triton.__version__)' || echo "triton: not importable"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
} > "$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"

HAS_CUDA=0
"$PYTHON_BIN" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && HAS_CUDA=1

if [[ "$HAS_CUDA" -eq 0 || "$DRY_RUN" -eq 1 ]]; then
    echo "== no CUDA or --dry-run: CPU smoke run of the timing script (tiny size, interpreter)"
    timeout 300 "$PYTHON_BIN" -W ignore::RuntimeWarning -m scripts.bench_verify --impl triton --out "$OUT_DIR/bench_verify_fused_smoke.md"
    status=$?
    timeout 120 "$PYTHON_BIN" -m scripts.gpu_check_runtime --out "$OUT_DIR/runtime.md" || status=1
    if [[ "$DRY_RUN" -eq 1 ]]; then exit "$status"; fi
    echo "gpu_check.sh: torch sees no CUDA device; nothing measured" >&2
    exit 3
fi

status=0
echo "== 1/3 kernel tests on CUDA"
timeout 210 "$PYTHON_BIN" -m pytest tests/verify/test_triton_block.py -q -p no:cacheprovider 2>&1 | tee "$OUT_DIR/pytest.txt"
[[ "${PIPESTATUS[0]}" -eq 0 ]] || status=1

echo "== 2/3 fused vs torch timing"
timeout 210 "$PYTHON_BIN" -m scripts.bench_verify --impl triton --iters "$ITERS" --out "$OUT_DIR/bench_verify_fused.md" \
    2>&1 | tee "$OUT_DIR/bench_verify_fused.log"
[[ "${PIPESTATUS[0]}" -eq 0 ]] || status=1

echo "== 3/3 runtimes: NCCL selection, local engine vs Ray TP=1 with the draft co-located, per-GPU memory"
timeout 300 "$PYTHON_BIN" -m scripts.gpu_check_runtime --out "$OUT_DIR/runtime.md" 2>&1 | tee "$OUT_DIR/runtime.log"
[[ "${PIPESTATUS[0]}" -eq 0 ]] || status=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv \
    | tee "$OUT_DIR/gpu_memory_after.csv"

echo "results in $OUT_DIR (status $status)"
exit "$status"
