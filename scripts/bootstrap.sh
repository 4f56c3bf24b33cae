#!/usr/bin/env bash
# Create .venv with enlace and its test tools, pinned by constraints.txt (torch CPU wheel 2.13.0).
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
echo "bootstrap: creating .venv (torch CPU wheel, numpy, pyyaml, click, fabric, pytest)..." >&2
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null
.venv/bin/python -m pip install --quiet -c constraints.txt -e '.[dev]' 2>&1 \
  | { grep -vE "is ignored: it is neither|BuildBackendWarning|^\s+(return|with strategy)|^\s*(!!|\*+|Please be careful|name as your package|Editable installation\.?)?\s*$" || true; } >&2
echo "$want" > "$stamp"
echo "bootstrap: done ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))" >&2
