#!/usr/bin/env bash
# enlace server-side entry point. The driver (enlace-remote) runs it over SSH; it needs only
# bash, git and python. Before the first sync the driver pipes this file to `bash -s`; after
# that it runs the copy inside the checked-out tree of the commit it is working with.
#
#   remote.sh REMOTE_DIR setup [SHA]              create repo.git, data/, runs/, trees/   (JSON)
#   remote.sh REMOTE_DIR checkout SHA [PYTHON]    trees/SHA: a checkout of SHA with data/ and
#                                                 runs/ linked to the shared dirs; idempotent (JSON)
#   remote.sh REMOTE_DIR env SHA PYTHON           the python to use: PYTHON itself, or `venv`
#                                                 (built once per pyproject+constraints hash) (JSON)
#   remote.sh REMOTE_DIR verify SHA PYTHON RUN [--for-launch]     the arrival checklist (JSON)
#   remote.sh REMOTE_DIR enlace SHA|latest PYTHON ARGS...         exec python -m enlace ARGS
#   remote.sh REMOTE_DIR launch SHA PYTHON RUN_NAME PYARGS...     start `python PYARGS` detached (JSON);
#                                                 PYARGS: -m enlace train RUN ... or -m torch.distributed.run ...
#
# Every argument arrives shlex-quoted from the driver, which validated SHA and run names first.
set -euo pipefail

die() { printf '{"ok": false, "error": "%s"}\n' "$*"; exit 3; }

[ $# -ge 2 ] || { echo "usage: remote.sh REMOTE_DIR VERB [ARGS...]" >&2; exit 2; }
RD=$1; VERB=$2; shift 2
case $RD in "~") RD=$HOME ;; "~/"*) RD="$HOME/${RD#\~/}" ;; esac
mkdir -p "$RD"
RD=$(cd "$RD" && pwd)

NO_PYTHON="no usable python on the server: set python: in hosts.yaml to one with torch, or venv"
check_sha() { [[ $1 =~ ^[0-9a-f]{40}$ ]] || die "not a commit id: $1"; }
newest_tree() {  # the most recently checked-out commit (for status/logs/fetch, which any tree can answer)
  local t; t=$(ls -1t "$RD"/trees/*/.enlace-ready 2>/dev/null | head -n 1)
  [ -n "$t" ] || return 1
  basename "$(dirname "$t")"
}
check_name() { [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ ]] || die "not a valid run name: $1"; }

alive() {  # PID: a live (not zombie) enlace/torchrun process — a reused pid does not count
  local pid=$1 state
  [ -r "/proc/$pid/stat" ] || return 1
  state=$(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
  [ "$state" != Z ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qE 'enlace|torchrun'
}

resolve_python() {  # SHA PYTHON -> prints the interpreter path (status 1 if there is none)
  local tree=$RD/trees/$1 py=$2
  if [ "$py" != venv ]; then
    command -v "$py" >/dev/null 2>&1 || return 1
    command -v "$py"; return
  fi
  local key; key=$(cat "$tree/pyproject.toml" "$tree/constraints.txt" 2>/dev/null | sha256sum | cut -c1-16)
  local venv=$RD/venvs/$key
  if [ ! -x "$venv/bin/python" ]; then
    local tmp=$RD/venvs/.tmp-$key-$$
    mkdir -p "$RD/venvs"; rm -rf "$tmp"
    python3 -m venv "$tmp" >&2
    "$tmp/bin/python" -m pip install -q -c "$tree/constraints.txt" torch numpy pyyaml click >&2 \
      || { rm -rf "$tmp"; return 1; }
    mv "$tmp" "$venv" 2>/dev/null || rm -rf "$tmp"  # another sync may have won the race
  fi
  echo "$venv/bin/python"
}

case $VERB in
  setup)
    mkdir -p "$RD/data" "$RD/runs" "$RD/trees"
    [ -d "$RD/repo.git" ] || git init -q --bare "$RD/repo.git"
    have=false
    if [ $# -ge 1 ]; then check_sha "$1"; [ -f "$RD/trees/$1/.enlace-ready" ] && have=true; fi
    printf '{"ok": true, "remote_dir": "%s", "have_tree": %s, "rsync": %s}\n' "$RD" "$have" \
      "$(command -v rsync >/dev/null && echo true || echo false)"
    ;;
  checkout)  # SHA [PYTHON]: also resolves the python (saves the driver a round trip)
    sha=$1; check_sha "$sha"
    tree=$RD/trees/$sha
    if [ ! -f "$tree/.enlace-ready" ]; then
      tmp=$RD/trees/.tmp-$sha-$$
      rm -rf "$tmp"
      git clone -q --shared --no-checkout "$RD/repo.git" "$tmp"
      git -C "$tmp" checkout -q --detach "$sha"
      ln -sfn "$RD/data" "$tmp/data"
      ln -sfn "$RD/runs" "$tmp/runs"
      touch "$tmp/.enlace-ready"
      if ! mv -T "$tmp" "$tree" 2>/dev/null; then rm -rf "$tmp"; fi  # a concurrent checkout won
    fi
    py=""
    if [ $# -ge 2 ]; then py=$(resolve_python "$sha" "$2") || die "$NO_PYTHON"; fi
    printf '{"ok": true, "tree": "%s", "head": "%s", "python": "%s"}\n' "$tree" "$(git -C "$tree" rev-parse HEAD)" "$py"
    ;;
  env)
    check_sha "$1"
    py=$(resolve_python "$1" "$2") || die "$NO_PYTHON"
    printf '{"ok": true, "python": "%s"}\n' "$py"
    ;;
  verify)
    sha=$1; py=$(resolve_python "$1" "$2") || die "$NO_PYTHON"; shift 2
    tree=$RD/trees/$sha
    [ -d "$tree" ] || die "commit $sha is not checked out on the server: run enlace-remote sync"
    cd "$tree" && exec "$py" scripts/verify_tree.py "$sha" "$@"
    ;;
  enlace)
    sha=$1
    if [ "$sha" = latest ]; then
      sha=$(newest_tree) || die "nothing has been synced to $RD yet: run enlace-remote sync first"
    fi
    check_sha "$sha"; py=$(resolve_python "$sha" "$2") || die "$NO_PYTHON"; shift 2
    cd "$RD/trees/$sha" && ENLACE_COMMIT=$sha ENLACE_ROOT=$PWD PYTHONPATH=$PWD exec "$py" -m enlace "$@"
    ;;
  launch)
    sha=$1; check_sha "$sha"; py=$(resolve_python "$1" "$2") || die "$NO_PYTHON"; name=$3; check_name "$name"; shift 3
    run_dir=$RD/runs/$name
    mkdir -p "$run_dir"
    exec 9>"$RD/runs/.$name.lock"
    flock -n 9 || die "another launch of $name is in progress"
    if [ -f "$run_dir/launch.pid" ] && alive "$(cat "$run_dir/launch.pid")"; then
      printf '{"ok": false, "already_running": true, "pid": %s}\n' "$(cat "$run_dir/launch.pid")"; exit 5
    fi
    cd "$RD/trees/$sha"
    offset=$(stat -c %s "$run_dir/train.log" 2>/dev/null || echo 0)
    launch_id=$(date +%s%N)-$$  # the trainer records it in run.json: the driver knows its own launch
    # setsid: its own session and process group (stop signals the group); all three streams
    # redirected, so the trainer survives the SSH session that started it.
    ENLACE_COMMIT=$sha ENLACE_ROOT=$PWD ENLACE_LAUNCH_ID=$launch_id PYTHONPATH=$PWD PYTHONUNBUFFERED=1 \
      setsid nohup "$py" "$@" >>"$run_dir/train.log" 2>&1 </dev/null 9>&- &
    pid=$!
    echo "$pid" > "$run_dir/launch.pid"
    printf '{"ok": true, "pid": %s, "log_offset": %s, "commit": "%s", "launch_id": "%s"}\n' "$pid" "$offset" "$sha" "$launch_id"
    ;;
  *)
    echo "remote.sh: unknown verb '$VERB'" >&2; exit 2 ;;
esac
