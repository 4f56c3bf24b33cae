#!/usr/bin/env bash
# The test command (README, CI): the system parts the tests need (scripts/test-deps.sh: installs them as root,
# otherwise names the command), bootstrap .venv, then pytest. Extra arguments go to pytest.
# Tests run on min(cores + 2, 4) pytest-xdist workers (the Slurm tests share one: --dist loadgroup; the
# extra workers run while others wait on Slurm's clock, a network fault or a trainer; figures in
# docs/benchmarks.md);
# ENLACE_TEST_WORKERS=0 runs them one at a time in this process, and an -n of your own wins. --quick leaves
# out the `longest` tests, saying so (the full run is what CI runs: docs/benchmarks.md has both times).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/test-deps.sh
scripts/bootstrap.sh
cores=$(nproc)
workers=${ENLACE_TEST_WORKERS:-$(( cores + 2 < 4 ? cores + 2 : 4 ))}
parallel=(-n "$workers" --dist loadgroup)
args=()
for arg in "$@"; do
  case "$arg" in
    -n* | --numprocesses*) parallel=(); args+=("$arg") ;;
    --quick)  # the explicit split: everything but the `longest` tests (a minute or more each, the Slurm ones)
      echo "test.sh --quick: leaving out the tests marked longest (Slurm, the README main job's quality, the" \
           "laptop install, the README walk as fresh users, gpu_check on CPU, max-batch, a kill -9 soak); scripts/test.sh alone runs every test" >&2
      args+=(-m "not longest") ;;
    *) args+=("$arg") ;;
  esac
done
[ "$workers" = 0 ] && parallel=()
exec .venv/bin/python -m pytest "${parallel[@]}" "${args[@]}"
