#!/usr/bin/env bash
# The test command (README, CI): bootstrap .venv, then pytest. Extra arguments go to pytest.
# The SSH tests need /usr/sbin/sshd and git (Debian: openssh-server git).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"
