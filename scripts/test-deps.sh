#!/usr/bin/env bash
# The system parts the tests need (scripts/test.sh runs this first): a real sshd, rsync, git, iptables and
# iproute2 (network faults), a single-node Slurm with munge, Debian's chromium and its driver (the board's
# browser test), oathtool and PAM's oath module (an sshd that asks for a one-time code: tests/support/otp.py).
# When one is missing: as root with apt-get, install it, saying what once; otherwise stop
# before any test runs with the one command that installs it. Nothing is skipped: a missing part is an error.
set -euo pipefail
# command (as the tests look for it)   Debian package
needs=(
  /usr/sbin/sshd:openssh-server ssh:openssh-client rsync:rsync git:git
  iptables:iptables ip:iproute2
  slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client squeue:slurm-client scontrol:slurm-client munged:munge
  /usr/bin/chromium:chromium /usr/bin/chromedriver:chromium-driver
  oathtool:oathtool "/lib/$(uname -m)-linux-gnu/security/pam_oath.so:libpam-oath"
  "$@"  # more COMMAND:PACKAGE pairs (a test names one that cannot exist)
)
missing=()
for need in "${needs[@]}"; do
  cmd=${need%%:*} pkg=${need#*:}
  if [[ $cmd == /* ]]; then [ -e "$cmd" ] && continue; else
    PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1 && continue
  fi
  [[ " ${missing[*]} " == *" $pkg "* ]] || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
install="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "test.sh: the tests need what this machine lacks (${missing[*]}): run \`sudo apt-get update && sudo $install\` (Debian/Ubuntu), then this command again" >&2
  exit 3
fi
echo "test.sh: installing what the tests need and this machine lacks: ${missing[*]} (apt-get, a few minutes once)" >&2
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! { apt-get update -qq && $install -qq; } >"$log" 2>&1; then
  cat "$log" >&2; rm -f "$log"
  echo "test.sh: installing ${missing[*]} failed (apt-get's output above)" >&2
  exit 3
fi
rm -f "$log"
