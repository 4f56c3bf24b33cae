"""Server-side arrival checklist for one commit's tree (stdlib only: it must run even when the
tree is broken). Run by `remote.sh verify` from inside trees/<sha>/:

    python enlace/remote/verify_tree.py SHA RUN [--for-launch] [--set SECTION.KEY=VALUE ...]

Prints one JSON object: {"ok": bool, "checks": [{"name", "ok", "detail"}...], "run_name": ...}.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

NEEDED = [
    "enlace/__init__.py",
    "enlace/data/__init__.py",
    "enlace/data/paths.py",
    "enlace/data/streams.py",
    "enlace/data/bytestream.py",
    "enlace/data/shards.py",
    "configs/data",
    "configs/profiles",
    "configs/runs",
]


# The directory whose enlace/ runs this script: the tree itself (enlace's own checkout), or the server half the
# driver installed beside a repository of the user's own (remote.sh's enlace_home)
HOME = Path(__file__).resolve().parents[2]
OWN_TREE = Path("enlace/__init__.py").is_file()


def start(*args: str) -> subprocess.Popen:
    path = os.getcwd() if OWN_TREE else os.pathsep.join([str(HOME), os.getcwd()])
    env = {**os.environ, "PYTHONPATH": path, "ENLACE_ROOT": os.getcwd()}
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(p: subprocess.Popen, timeout: float = 120) -> subprocess.CompletedProcess:
    """Its output once it ends; one that runs past `timeout` seconds is killed and said (not a traceback)."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        err += f"\n{shlex.join(p.args[1:])}: no answer within {timeout:.0f}s (a slow disk?): it was stopped"
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return finish(start(*args), timeout)


DEPENDENCIES = ("torch", "numpy", "yaml", "click", "psutil")
SERVER_DEPENDENCIES = ("yaml", "click", "psutil")  # what enlace's server half needs beside a user's own script
# enlace/contract.py's exit codes, spelled here (this script runs before the tree is known to import);
# tests/test_runs.py holds them equal
USAGE = 2
VERIFY = 3


def import_detail(stderr: str) -> str:
    """The failed import's last line; for a missing dependency, what the user should do."""
    last = (stderr.strip().splitlines() or [""])[-1]
    for dep in DEPENDENCIES:
        if f"No module named '{dep}'" in last and OWN_TREE:
            return (
                f"{last} — the server's python ({sys.executable}) lacks enlace's dependencies; set `python: venv` "
                "for this host in hosts.yaml (enlace builds a venv from constraints.txt), or install them"
            )
        if f"No module named '{dep}'" in last:
            return (
                f"{last} — the server's python ({sys.executable}) lacks what enlace's server half needs beside your "
                "script: `pip install pyyaml click psutil` into it (hosts.yaml python: names it)"
            )
    return last


def _after(argv: list[str], flag: str) -> list[str]:
    """The values given after each `flag` in argv."""
    return [a for i, a in enumerate(argv) if i > 0 and argv[i - 1] == flag]


RESUMES = "its checkpoints can resume it"


def _data_check(run_ref: str, set_args: list[str], against: list[str]) -> tuple[tuple[str, bool, str], str]:
    """The check that the data the run reads exists (name, ok, detail), and (`against`: data-files'
    --against-checkpoint and --allow-* arguments, for a launch that resumes) what its trainer would refuse of that
    checkpoint's making, the data or a teacher ("" for nothing): not a failure here — launch refuses it once it
    knows the run would train (a finished run's launch says it is finished, a live one's that it runs)."""
    df = run("-m", "enlace", "data-files", run_ref, "--json", *set_args, *against, timeout=600)  # it may hash GBs
    try:
        data = json.loads(df.stdout)
    except json.JSONDecodeError:
        data = {"ok": False, "error": (df.stderr.strip().splitlines() or ["no output"])[-1], "files": []}
    detail = data.get("error") or f"{len(data['files'])} files"
    return ("data the run reads exists", bool(data.get("ok")), detail), data.get("changed") or ""


def _files_check(cfg: dict) -> tuple[str, bool, str]:
    """The check that the files the config names are here (name, ok, detail): a command's scripts, or the trainer's
    data and profile configs. A command's paths are the repository root's, where it runs (not the caller's)."""
    absent = [f for f in cfg["files"].values() if not Path(f).is_file()]
    own = cfg.get("kind") == "command"
    where = " (paths from the repository's root, where the command runs)" if own else ""
    listed = ", ".join(os.path.relpath(f) for f in cfg["files"].values())
    detail = f"missing: {', '.join(absent)}{where}" if absent else listed
    return ("the command's files present" if own else "referenced configs present"), not absent, detail


def _exit_code(checks: list[dict], cfg: dict, run_ref: str, resume_at_check: str | None) -> int:
    """0, or 2 where only config or checkpoint errors failed (exit 2 whichever verb finds them: a wrong key, a
    bad value, a config the run's checkpoints cannot resume, a --resume PATH that is no complete checkpoint, as
    train and preflight refuse them), else 3 (something is missing, what the machine lacks included)."""
    if all(c["ok"] for c in checks):
        return 0
    config_error = cfg.get("exit_code") == USAGE and not cfg.get("machine")
    usage = {f"enlace check-config {run_ref}" if config_error else None, resume_at_check, RESUMES}
    return USAGE if all(c["ok"] or c["name"] in usage for c in checks) else VERIFY


def main() -> int:
    sha, run_ref, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    for_launch = "--for-launch" in rest
    fresh = "--fresh" in rest  # launch --resume none: nothing is resumed, the recorded --set items are left out
    elsewhere = "--resume-elsewhere" in rest  # --resume PATH: the run's line is not what resumes (the PATH is)
    set_args = [a for s in _after(rest, "--set") for a in ("--set", s)]
    spec = _after(rest, "--command-spec")  # launch's `-- ARGV`: the command, checked instead of a run file
    set_args += ["--command-spec", spec[0]] if spec else []
    at = _after(rest, "--resume-at")  # launch --resume PATH: complete here (a typo started a trainer that failed)
    checks: list[dict] = []
    add = lambda name, ok, detail="": checks.append({"name": name, "ok": bool(ok), "detail": detail})

    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    add("HEAD is the pushed commit", head == sha, f"HEAD {head[:12]}, pushed {sha[:12]}")
    if OWN_TREE:  # enlace's own checkout: its package and configs must have arrived
        missing = [p for p in NEEDED if not Path(p).exists()]
        add("package and config dirs present", not missing, "missing: " + ", ".join(missing) if missing else "")
    elif not spec:  # a repository of the user's own: its run files, and enlace's server half beside it
        add("configs/runs present", Path("configs/runs").is_dir(), "" if Path("configs/runs").is_dir() else "missing")
    run_file = Path("configs/runs") / f"{run_ref}.yaml"
    if not spec:
        there = run_file.is_file()
        add(f"configs/runs/{run_ref}.yaml present", there, "" if there else f"missing: {run_file}")
    # The module must come from this tree: an installed copy elsewhere (e.g. an editable install) would hide
    # a tree that lacks it. The dependencies are looked for, not imported: torch's import is slow.
    # A tree of the user's own runs the server half beside it: only the server half's dependencies are looked for
    deps = DEPENDENCIES if OWN_TREE else SERVER_DEPENDENCIES
    from_tree = (
        "import os, enlace.data as d; f = os.path.realpath(d.__file__); "
        "assert f.startswith(os.path.realpath(os.getcwd()) + os.sep), 'imported from ' + f + "
        "', not from this tree: the tree lacks enlace/data/'\n"
    )
    imp_p = start(
        "-c",
        f"import importlib.util\n{from_tree if OWN_TREE else ''}"
        f"for m in {deps!r}:\n"
        "    if importlib.util.find_spec(m) is None: raise ModuleNotFoundError(f\"No module named '{m}'\")",
    )
    at_args = ["--resume-at", at[0]] if at else []
    set_args += ["--fresh"] if fresh else []  # --resume none: the run's recorded --set items apply no more
    cc_p = start("-m", "enlace", "check-config", run_ref, "--json", *set_args, *at_args)  # both run side by side
    imp, cc = finish(imp_p), finish(cc_p)
    what = "import enlace.data" if OWN_TREE else f"enlace's server half and its packages ({HOME})"
    add(what, imp.returncode == 0, import_detail(imp.stderr) if imp.returncode else "")
    try:
        cfg = json.loads(cc.stdout)
    except json.JSONDecodeError:
        cfg = {"ok": False, "error": import_detail(cc.stderr) or "no output"}
    add(f"enlace check-config {run_ref}", cfg.get("ok"), cfg.get("error", ""))
    if cfg.get("ok"):
        add(*_files_check(cfg))
    resume_at_check = f"--resume {at[0]}" if at else None  # its detail: ok, or why train would refuse it
    if at and cfg.get("ok"):
        problem = cfg.get("resume_at_problem")
        add(resume_at_check, not problem, problem or "a complete checkpoint")
    resumes_line = not (fresh or elsewhere) and cfg.get("kind") != "command"  # (a command resumes its own way)
    if for_launch and cfg.get("ok") and resumes_line:
        problem = cfg.get("resume_problem")
        add(RESUMES, not problem, problem or "")
    changed = ""  # what the trainer would refuse of the newest checkpoint's making (launch: where the run would train)
    if for_launch and cfg.get("ok") and not spec:  # a command from launch's command line names no data
        resumes = at[0] if at else "latest" if resumes_line else None  # the checkpoint it would resume
        allow = [a for a in rest if a in ("--allow-data-change", "--allow-teacher-change")]
        allow += [a for w in _after(rest, "--world") for a in ("--world", w)]  # the processes it would resume on
        against = ["--against-checkpoint", resumes, *allow] if resumes and cfg.get("kind") != "command" else []
        check, changed = _data_check(run_ref, set_args, against)
        add(*check)
    ok = all(c["ok"] for c in checks)
    warnings = (cfg.get("warnings") or []) + [changed] * bool(changed)  # valid but probably not meant: shown
    code = _exit_code(checks, cfg, run_ref, resume_at_check)
    device = ((cfg.get("config") or {}).get("runtime") or {}).get("device")  # what the run queues for
    doc = {"ok": ok, "checks": checks, "run_name": cfg.get("run_name"), "commit": sha, "warnings": warnings}
    doc["device"], doc["resume_refused"] = device, changed or None
    print(json.dumps({**doc, "exit_code": code}))
    return code


if __name__ == "__main__":
    sys.exit(main())
