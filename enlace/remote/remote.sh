#!/usr/bin/env bash
# enlace server-side entry point. The driver (enlace-remote) runs this very file, inlined as
# `bash -c <this text> remote.sh REMOTE_DIR VERB ARGS...`, so the server needs nothing but bash, git
# and python before the first sync, and driver and script never disagree. It does only what must
# happen before the tree's Python exists, then hands over to `python -m enlace`:
#
#   remote.sh REMOTE_DIR setup [SHA]               create repo.git, data/, runs/, trees/
#   remote.sh REMOTE_DIR checkout SHA|latest [PYTHON [PIP_ARG...]]   trees/SHA: a checkout of SHA with data/ and
#                                                  runs/ linked to the shared dirs; idempotent; resolves PYTHON
#                                                  (`venv`: builds one, pip's progress on stderr)
#   remote.sh REMOTE_DIR server-install            stdin: the driver's enlace package (a tar) → server/KEY
#   remote.sh REMOTE_DIR verify SHA PYTHON RUN [--for-launch]   the arrival checklist
#   remote.sh REMOTE_DIR enlace SHA|latest PYTHON ARGS...       exec python -m enlace ARGS in trees/SHA
#
# Every verb answers with exactly one JSON document on stdout (progress goes to stderr); JSON is
# written by python's json module, never by printf. Run state (already running, crashed, ...) is
# decided in enlace/state/runs.py, not here. Every argument arrives shlex-quoted from the driver, which
# validated SHA and run names first; this script checks them again.
set -euo pipefail

# Exit codes: the values of enlace/contract.py (a test checks that they match).
EXIT_USAGE=2
EXIT_VERIFY=3

sys_python() { command -v python3 || command -v python; }
json_out() {  # KEY VALUE ...: one JSON object; a KEY ending in :json takes VALUE as a JSON literal
  local py; py=$(sys_python) || { echo "{\"ok\": false, \"error\": \"no python3 on the server: install python3\", \"exit_code\": $EXIT_VERIFY, \"kind\": \"other\"}"; return; }
  "$py" -c 'import json, sys
a = sys.argv[1:]
print(json.dumps({k.removesuffix(":json"): json.loads(v) if k.endswith(":json") else v for k, v in zip(a[::2], a[1::2])}))' "$@"
}
die() {  # MESSAGE [EXIT_CODE [KIND]]: the contract's error document (enlace/contract.py: error_doc)
  local code=${2:-$EXIT_VERIFY}
  json_out ok:json false error "$1" exit_code:json "$code" kind "${3:-other}"; exit "$code"
}

[ $# -ge 2 ] || { echo "usage: remote.sh REMOTE_DIR VERB [ARGS...]" >&2; exit $EXIT_USAGE; }
RD=$1; VERB=$2; shift 2
case $RD in
  "~") RD=$HOME ;;
  "~/"*) RD="$HOME/${RD#\~/}" ;;
  "~"* | -* | "" | *$'\n'*) die "remote_dir ${RD@Q}: use an absolute path, ~ or ~/DIR" $EXIT_USAGE ;;
esac
[ -d "$RD" ] || mkdir -p -- "$RD" 2>/dev/null || die "cannot create remote_dir $RD on the server (permission denied?) — set remote_dir: in hosts.yaml to a directory you can write, e.g. ~/enlace" $EXIT_USAGE
RD=$(cd -- "$RD" && pwd)

check_sha() { [[ $1 =~ ^[0-9a-f]{40}$ ]] || die "not a commit id: $1" $EXIT_USAGE; }
# A repository of the user's own has no enlace/: the driver names its server half (ENLACE_SERVER, a key of
# its package's bytes), installed once under $RD/server/KEY by `server-install` (orchestrator/transfer/serverhalf.py)
SERVER=${ENLACE_SERVER:-}
[ -z "$SERVER" ] || [[ $SERVER =~ ^[0-9a-f]{16}$ ]] || die "ENLACE_SERVER: not a server half key: $SERVER" $EXIT_USAGE
enlace_home() {  # TREE -> the directory whose enlace/ package runs there: the tree's own, else the server half
  if [ -f "$1/enlace/__init__.py" ]; then echo "$1"
  elif [ -n "$SERVER" ] && [ -f "$RD/server/$SERVER/enlace/__init__.py" ]; then echo "$RD/server/$SERVER"
  else return 1; fi
}
NOT_SYNCED="nothing was launched or synced to $RD yet: enlace-remote launch RUN ships this repository there and starts RUN (enlace-remote sync ships it alone)"
no_home() {  # a tree with no enlace/ and no server half of this driver's key: after a driver upgrade, say so
  local h others=()
  for h in "$RD"/server/*/enlace/__init__.py; do [ -f "$h" ] && { h=${h%/enlace/__init__.py}; others+=("${h##*/}"); }; done
  if [ -n "$SERVER" ] && [ ${#others[@]} -gt 0 ]; then
    die "this driver's server half ($SERVER) is not installed here; $RD/server holds another driver version's (${others[*]}): after a driver upgrade run enlace-remote sync once, which installs it (runs go on as they are)"
  fi
  die "this tree has no enlace/ and enlace's server half is not installed here: run enlace-remote sync (it installs it)"
}
newest_tree() {  # the most recently checked-out commit (for status/logs/fetch, which any tree can answer),
  local t newest=""  # by bash builtins alone: every driver command that names no commit asks for it
  for t in "$RD"/trees/*/.enlace-ready; do
    [ -f "$t" ] && { [ -z "$newest" ] || [ "$t" -nt "$newest" ]; } && newest=$t
  done
  [ -n "$newest" ] || return 1
  newest=${newest%/.enlace-ready}
  echo "${newest##*/}"
}

has_nvidia_driver() { command -v nvidia-smi >/dev/null 2>&1 || [ -e /proc/driver/nvidia/version ]; }
CPU_INDEX=https://download.pytorch.org/whl/cpu
reachable() {  # URL: answers within 5 s (a closed network fails at once, at DNS)
  "$(sys_python)" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$1" >/dev/null 2>&1
}

venv_key() {  # TREE -> the venv's key; enlace/hashing.py's venv_key computes the same (a test holds them equal)
  cat "$1/pyproject.toml" "$1/constraints.txt" 2>/dev/null | sha256sum | cut -c1-16
}

resolve_python() {  # SHA PYTHON [PIP_ARG...] -> prints the interpreter path (status 1 if there is none)
  local tree=$RD/trees/$1 py=$2; shift 2
  if [ "$py" != venv ]; then
    command -v "$py" >/dev/null 2>&1 || {
      echo "python: $py (hosts.yaml) is not a command here: $( [ "${py#/}" != "$py" ] && echo "no such file or not executable" || echo "not on the PATH of a non-interactive ssh session")" >&2
      return 1
    }
    command -v "$py"; return
  fi
  # One venv per pyproject+constraints (pip args say where wheels come from, not what is installed), shared
  # by every remote_dir of this account: built once under ~/.cache/enlace/venvs/KEY-FLAVOR, linked as
  # $RD/venvs/KEY (what a printed Slurm script and gc name). FLAVOR: cuda, or cpu on a host with no NVIDIA
  # driver, whose torch comes from PyTorch's CPU index (≈200 MB instead of the CUDA build's ≈4.8 GB with its
  # nvidia packages; when that index does not answer, PyPI's CUDA build goes in, and the build says so).
  if [ ! -f "$tree/constraints.txt" ]; then  # a repository of the user's own: no enlace venv to build from it
    echo "python: venv builds enlace's trainer's venv from the tree's constraints.txt, which this repository" \
         "lacks — set python: in hosts.yaml to the python of your own environment (your script's packages, and" \
         "pyyaml, click and psutil for enlace's server half)" >&2
    return 1
  fi
  local key; key=$(venv_key "$tree")
  local link=$RD/venvs/$key flavor=cuda size="≈4.8 GB with its nvidia packages" index=() why="an NVIDIA driver is here"
  has_nvidia_driver || flavor=cpu
  local cache=${XDG_CACHE_HOME:-${HOME:-$RD}/.cache}/enlace/venvs
  local venv=$cache/$key-$flavor
  if [ ! -x "$venv/bin/python" ] && command -v flock >/dev/null 2>&1; then  # one build at a time: a second waits
    mkdir -p "$cache"
    exec 9>"$cache/.build-$key-$flavor.lock"
    flock -n 9 || { echo "another setup is building $venv: waiting for it" >&2; flock 9; }
  fi
  if [ ! -x "$venv/bin/python" ]; then
    local tmp=$cache/.tmp-$key-$flavor-$$ torch_pin
    torch_pin=$(grep -E '^torch==' "$tree/constraints.txt" || echo torch)
    if [ "$flavor" = cpu ]; then  # said once, here, at the build: never on the commands that use the venv
      if [ $# -gt 0 ]; then size="as your pip_args' index serves it"; why="no NVIDIA driver here; pip_args name the index"
      elif reachable "$CPU_INDEX/"; then index=(--extra-index-url "$CPU_INDEX"); size="≈200 MB"; why="no NVIDIA driver here"
      else
        size="≈4.8 GB: PyPI's Linux wheel is the CUDA build, with its nvidia packages"
        why="no NVIDIA driver here, but PyTorch's CPU index ($CPU_INDEX) does not answer, so PyPI's build goes in"
      fi
    fi
    mkdir -p "$cache"; rm -rf "$tmp"
    echo "building the server's python: a venv in $venv ($torch_pin: $size; $why; numpy, pyyaml, click," \
         "psutil from constraints.txt${*:+; pip $*}) — shared by every remote_dir of this account: minutes" >&2
    "$(sys_python)" -m venv "$tmp" >&2 || { rm -rf "$tmp"; return 1; }
    "$tmp/bin/python" -m pip install --progress-bar off --disable-pip-version-check -c "$tree/constraints.txt" \
      "${index[@]}" "$@" torch numpy pyyaml click psutil safetensors >&2 || { rm -rf "$tmp"; return 1; }
    mv -T "$tmp" "$venv" 2>/dev/null || rm -rf "$tmp"  # another build may have won the race
    echo "built $venv" >&2
  fi
  mkdir -p "$RD/venvs"
  [ "$(readlink "$link" 2>/dev/null)" = "$venv" ] || ln -sfn "$venv" "$link"
  echo "$link/bin/python"
}
NO_PYTHON="no usable python on the server (the venv build failed, or python: names none): see the messages above; set python: in hosts.yaml to venv (pip_args: for another wheel index) or to a python with torch"
no_python() {  # PYTHON: NO_PYTHON, naming the cause where resolve_python's own lines are not shown (verify)
  if [ "$1" != venv ] && ! command -v "$1" >/dev/null 2>&1; then
    die "python: $1 (hosts.yaml) is not a command on the server ($( [ "${1#/}" != "$1" ] && echo "no such file or not executable" || echo "not on the PATH of a non-interactive ssh session")) — set python: in hosts.yaml to venv or to a python with torch"
  fi
  die "$NO_PYTHON"
}

case $VERB in
  setup)
    mkdir -p "$RD/data" "$RD/runs" "$RD/trees"
    [ -d "$RD/repo.git" ] || git init -q --bare "$RD/repo.git"
    have=false
    if [ $# -ge 1 ]; then check_sha "$1"; [ -f "$RD/trees/$1/.enlace-ready" ] && have=true; fi
    half=false
    [ -n "$SERVER" ] && [ -f "$RD/server/$SERVER/enlace/__init__.py" ] && half=true
    json_out ok:json true remote_dir "$RD" have_tree:json "$have" server_half:json "$half"
    ;;
  server-install)  # BYTES; stdin: a tar of the driver's enlace package, unpacked as $RD/server/$SERVER/enlace/
    [ -n "$SERVER" ] || die "server-install needs ENLACE_SERVER" $EXIT_USAGE
    [[ ${1:-} =~ ^[0-9]+$ ]] || die "server-install BYTES: the tar's size" $EXIT_USAGE
    mkdir -p "$RD/server"; tmp=$RD/server/.tmp-$SERVER-$$
    rm -rf "$tmp" "$tmp.tar"; mkdir -p "$tmp"
    cat > "$tmp.tar"  # whole before unpacking: a connection cut between two members would leave a partial half
    [ "$(wc -c < "$tmp.tar")" -eq "$1" ] || { rm -rf "$tmp" "$tmp.tar"; die "the server half arrived cut short: sync again"; }
    tar -x -C "$tmp" -f "$tmp.tar" || { rm -rf "$tmp" "$tmp.tar"; die "unpacking enlace's server half failed"; }
    rm -f "$tmp.tar"
    [ -f "$tmp/enlace/__init__.py" ] || { rm -rf "$tmp"; die "the server half arrived without enlace/__init__.py"; }
    mv -T "$tmp" "$RD/server/$SERVER" 2>/dev/null || rm -rf "$tmp"  # another install won the race: same bytes
    json_out ok:json true server "$RD/server/$SERVER"
    ;;
  checkout)
    sha=$1
    if [ "$sha" = latest ]; then
      sha=$(newest_tree) || die "$NOT_SYNCED" $EXIT_USAGE not_synced
    fi
    check_sha "$sha"
    tree=$RD/trees/$sha
    if [ ! -f "$tree/.enlace-ready" ]; then
      tmp=$RD/trees/.tmp-$sha-$$
      rm -rf "$tmp"
      # repo.git has no branches (only refs/enlace/SHA): clone's "empty repository" warning is noise
      git clone -q --shared --no-checkout "$RD/repo.git" "$tmp" 2>"$tmp.err" || { cat "$tmp.err" >&2; die "git clone failed"; }
      rm -f "$tmp.err"
      git -C "$tmp" checkout -q --detach "$sha"
      if [ -d "$tmp/runs" ] && [ ! -L "$tmp/runs" ]; then
        rm -rf "$tmp"; die "commit $sha tracks a runs/ directory, where enlace keeps its runs on the server — rename it in your repository" $EXIT_USAGE
      fi
      # data/: the shared one; a repository that tracks files there keeps its own, the shared files linked in
      # at each start (enlace/data/paths.py: link_shared_data)
      [ -d "$tmp/data" ] && [ ! -L "$tmp/data" ] || ln -sfn "$RD/data" "$tmp/data"
      ln -sfn "$RD/runs" "$tmp/runs"
      touch "$tmp/.enlace-ready"
      if ! mv -T "$tmp" "$tree" 2>/dev/null; then rm -rf "$tmp"; fi  # a concurrent checkout won
    fi
    py=""
    if [ $# -ge 2 ]; then shift; py=$(resolve_python "$sha" "$@") || die "$NO_PYTHON"; fi
    json_out ok:json true tree "$tree" head "$(git -C "$tree" rev-parse HEAD)" python "$py"
    ;;
  verify)
    sha=$1; check_sha "$sha"
    tree=$RD/trees/$sha
    [ -d "$tree" ] || die "commit $sha is not checked out on the server: run enlace-remote sync"
    py=$(resolve_python "$sha" "$2") || no_python "$2"; shift 2
    home=$(enlace_home "$tree") || no_home
    cd "$tree" && ENLACE_DATA_DIR=$RD/data exec "$py" "$home/enlace/remote/verify_tree.py" "$sha" "$@"
    ;;
  enlace)
    sha=$1
    if [ "$sha" = latest ]; then
      sha=$(newest_tree) || die "$NOT_SYNCED" $EXIT_USAGE not_synced
    fi
    check_sha "$sha"; py=$(resolve_python "$sha" "$2") || no_python "$2"; shift 2
    home=$(enlace_home "$RD/trees/$sha") || no_home
    path=$RD/trees/$sha; [ "$home" = "$path" ] || path=$home:$path  # the server half first, then the user's tree
    cd "$RD/trees/$sha" && ENLACE_COMMIT=$sha ENLACE_ROOT=$PWD ENLACE_DATA_DIR=$RD/data PYTHONPATH=$path \
      exec "$py" -m enlace "$@"
    ;;
  *)
    echo "remote.sh: unknown verb '$VERB'" >&2; exit $EXIT_USAGE ;;
esac
