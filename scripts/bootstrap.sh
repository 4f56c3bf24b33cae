#!/usr/bin/env bash
# Create .venv with both halves (the driver, the trainer: .[train]) and the test tools, pinned by constraints.txt (torch 2.13.0: the CPU wheel where pip finds one, else PyPI's, the CUDA build on Linux).
# Idempotent and fast when nothing changed: reinstalls only when pyproject.toml or
# constraints.txt differ from the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv/.enlace-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "bootstrap: creating .venv (torch 2.13.0, numpy, pyyaml, click, paramiko, pytest; the first time: a minute with a CPU wheel at hand, longer when pip must download torch)..." >&2
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
quiet_pip() {  # pip, without the warnings setuptools and odd pip configs print on every install;
  local log; log=$(mktemp)   # on failure its whole output is shown
  if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@" >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; return 1
  fi
  grep -E "^(ERROR|error):" "$log" >&2 || true
  rm -f "$log"
}
quiet_pip --upgrade pip
quiet_pip -c constraints.txt -e '.[train,dev]'
echo "$want" > "$stamp"
echo "bootstrap: done ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))" >&2
