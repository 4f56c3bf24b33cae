#!/usr/bin/env bash
# One device lease, several checks, each bounded and independent (one failing costs only its own figures).
# Run on a lent GPU machine from the repo root:  OUT=/some/dir bash bench/gpu_lease.sh [gpu_check budget s]
# Writes under $OUT: env.txt, gpu_check.json, and a log per step.
set -u
OUT=${OUT:-/tmp/gpu-lease}; mkdir -p "$OUT"
BUDGET=${1:-200}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
step() {  # step NAME SECONDS CMD...: run CMD under a deadline, log to $OUT/NAME.log, say how it ended
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout --signal=TERM --kill-after=15 "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - t0)) s"
    tail -n 25 "$OUT/$name.log"
}
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
    "$PY" -c 'import torch, click, yaml, psutil, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, click.__version__, yaml.__version__, psutil.__version__)'
    nproc; free -g | head -2
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
NANOGPT=(); [ -f .nanogpt/model.py ] && NANOGPT=(--nanogpt .nanogpt)  # nanoGPT's own model.py, if carried
step gpu_check $((BUDGET + 90)) "$PY" bench/gpu_check.py --budget-s "$BUDGET" --out "$OUT/gpu_check.json" "${NANOGPT[@]}"
step preflight_auto 80 "$PY" -m enlace preflight smoke-2060 --set profile=auto --steps 10 --json
step train_auto 100 "$PY" -m enlace train smoke-2060 --set profile=auto --set training.max_steps=60 \
    --set checkpoint.every=30 --set training.eval_every=30 --runs-dir /tmp/lease-runs
step resume_auto 60 "$PY" -m enlace train smoke-2060 --set profile=auto --set training.max_steps=80 \
    --set checkpoint.every=30 --set training.eval_every=30 --runs-dir /tmp/lease-runs
