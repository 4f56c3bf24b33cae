#!/usr/bin/env bash
# One lease of a lent GPU machine: gpu_check, then preflight, a training run and its resume with profile: auto,
# each under its own deadline (one that fails or runs out costs only its own figures).
#
#   OUT=DIR [PYTHON=python] bash bench/gpu_lease.sh [BUDGET_S]     (BUDGET_S: gpu_check's budget, default 200)
#
# Writes under $OUT (default /tmp/gpu-lease): env.txt, gpu_check.json and a log per step. PYTHON defaults to
# .venv/bin/python where there is one, else python3 (a lent machine's python3 holds torch). Worst case
# BUDGET_S + 90 + 80 + 100 + 60 s of wall time: keep it under the machine's per-command limit. nanoGPT's own
# model.py as gpu_check's throughput baseline: put it in .nanogpt/ (git-ignored) and bring that folder along.
# Exits 1 if any step failed, 2 without a visible CUDA device.
set -u
OUT=${OUT:-/tmp/gpu-lease}; mkdir -p "$OUT"
BUDGET=${1:-200}
if [ -z "${PYTHON:-}" ]; then [ -x .venv/bin/python ] && PYTHON=.venv/bin/python || PYTHON=python3; fi
PY=$PYTHON
export PYTHONUNBUFFERED=1
RUNS=$(mktemp -d /tmp/lease-runs.XXXXXX)  # fresh each lease: a rerun on a warm machine must not resume the last
FAILED=()
step() {  # step NAME SECONDS CMD...: run CMD under a deadline, log to $OUT/NAME.log, say how it ended
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS rc
    timeout --signal=TERM --kill-after=15 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    case $rc in
        0) echo "== $name: ok after $((SECONDS - t0)) s" ;;
        124|137) echo "== $name: timed out (limit $limit s)"; FAILED+=("$name") ;;
        *) echo "== $name: exit $rc after $((SECONDS - t0)) s"; FAILED+=("$name") ;;
    esac
    tail -n 25 "$OUT/$name.log"
}
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1
    "$PY" -c 'import sys, torch; from importlib.metadata import version as v
print(sys.version.split()[0], torch.__version__, torch.version.cuda, *(f"{p} {v(p)}" for p in ("click", "pyyaml", "psutil")))'
    nproc; free -g | head -2
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_lease: $PY sees no CUDA device (or no torch): this script is for a lent GPU machine;" \
        "on the CPU run: python bench/gpu_check.py --device cpu --small" >&2
    exit 2
fi
NANOGPT=(); [ -f .nanogpt/model.py ] && NANOGPT=(--nanogpt .nanogpt)
step gpu_check $((BUDGET + 90)) "$PY" bench/gpu_check.py --budget-s "$BUDGET" --out "$OUT/gpu_check.json" "${NANOGPT[@]}"
step preflight_auto 80 "$PY" -m enlace preflight smoke-2060 --set profile=auto --steps 10 --json
step train_auto 100 "$PY" -m enlace train smoke-2060 --set profile=auto --set training.max_steps=60 \
    --set checkpoint.every=30 --set training.eval_every=30 --runs-dir "$RUNS"
step resume_auto 60 "$PY" -m enlace train smoke-2060 --set profile=auto --set training.max_steps=80 \
    --set checkpoint.every=30 --set training.eval_every=30 --runs-dir "$RUNS"
rm -rf "$RUNS"
if [ ${#FAILED[@]} -gt 0 ]; then echo "gpu_lease: failed: ${FAILED[*]} (their logs: $OUT)"; exit 1; fi
echo "gpu_lease: every step ok (logs and gpu_check.json: $OUT)"
