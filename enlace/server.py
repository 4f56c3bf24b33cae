"""Server-side verbs the driver calls (over SSH, via scripts/remote.sh): run status, stop, log
streaming from a byte offset, and checkpoint manifests for fetch. None of them imports torch, so
each answers in tens of milliseconds."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from enlace.checkpoint import MANIFEST, complete_checkpoints, latest_checkpoint, read_manifest
from enlace.config import validate_run_name
from enlace.errors import EnlaceError
from enlace.rundir import read_run_json

ACTIVE = ("starting", "running")
RUN_FILES = ("run.json", "config.yaml", "metrics.jsonl", "train.log", "preflight.json")


class NoSuchRun(EnlaceError):
    exit_code = 2


def pid_alive(pid: int | None) -> bool:
    """True if `pid` is a live (non-zombie) enlace/torchrun process."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, PermissionError, FileNotFoundError):
        return False
    return state != "Z" and (b"enlace" in cmdline or b"torchrun" in cmdline)


def _launch_pid(run_dir: Path) -> int | None:
    try:
        return int((run_dir / "launch.pid").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def run_dir_of(runs_root: Path, name: str) -> Path:
    validate_run_name(name, "RUN_NAME")
    d = runs_root / name
    if not d.is_dir():
        have = sorted(p.name for p in runs_root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if runs_root.is_dir() else []  # fmt: skip
        raise NoSuchRun(f"no run named {name!r} here — runs on this host: {', '.join(have) or 'none'}")
    return d


def run_alive(run_dir: Path, st: dict[str, Any] | None = None) -> bool:
    """Is the trainer (run.json's pid) or what enlace-remote launched (launch.pid) still running?"""
    st = read_run_json(run_dir) if st is None else st
    return pid_alive(st.get("pid")) or pid_alive(_launch_pid(run_dir))


def run_status(run_dir: Path) -> dict[str, Any]:
    """One row of `status`: run.json plus liveness (a vanished process shows `crashed`)."""
    st = read_run_json(run_dir)
    pid = st.get("pid") or _launch_pid(run_dir)
    alive = run_alive(run_dir, st)
    status = st.get("status", "launched" if alive else "unknown")
    if status in ACTIVE and not alive:
        status = "crashed"
    if status in ("unknown",) and alive:
        status = "starting"
    now = time.time()
    started = st.get("started_at")
    end = now if status in ACTIVE else st.get("updated_at", now)
    step, max_steps = st.get("step", 0), st.get("max_steps")
    eta = None
    if status == "running" and st.get("tokens_per_s") and step and max_steps:
        tokens_per_step = st.get("tokens", 0) / step
        eta = (max_steps - step) * tokens_per_step / st["tokens_per_s"]
    latest = latest_checkpoint(run_dir / "checkpoints")
    return {"run_name": run_dir.name, "status": status, "alive": alive, "pid": pid, "step": step,
            "max_steps": max_steps, "loss": st.get("loss"), "val_bpb": st.get("val_bpb"),
            "tokens_per_s": st.get("tokens_per_s"), "elapsed_s": (end - started) if started else None,
            "eta_s": eta, "commit": st.get("commit"), "exit_code": st.get("exit_code"),
            "error": st.get("error"), "latest_checkpoint": latest.name if latest else None,
            "launch_id": st.get("launch_id")}  # fmt: skip


def all_status(runs_root: Path) -> list[dict[str, Any]]:
    if not runs_root.is_dir():
        return []
    dirs = sorted(p for p in runs_root.iterdir() if p.is_dir() and not p.name.startswith("."))
    return [run_status(d) for d in dirs if (d / "run.json").exists() or (d / "launch.pid").exists()]


def stop_run(run_dir: Path, grace: float, kill: bool) -> dict[str, Any]:
    """SIGTERM the launched process, wait up to `grace` s for its checkpoint; --kill SIGKILLs its group."""
    st = run_status(run_dir)
    if not st["alive"]:
        raise NoSuchRun(f"run {run_dir.name} is not running (status {st['status']})")
    # The process enlace-remote launched (torchrun, or the trainer itself) gets one SIGTERM: torchrun
    # forwards it once to every rank. Signalling the whole group would give each rank two signals,
    # and a second signal means "exit now, without a checkpoint".
    launched = _launch_pid(run_dir)
    pid = launched if pid_alive(launched) else st["pid"]
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while pid_alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    killed = False
    if pid_alive(pid) and kill:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        killed = True
        while pid_alive(pid):
            time.sleep(0.05)
    after = run_status(run_dir)
    return {"run_name": run_dir.name, "stopped": not after["alive"], "killed": killed, "status": after["status"],
            "step": after["step"], "latest_checkpoint": after["latest_checkpoint"]}  # fmt: skip


def manifest(run_dir: Path) -> dict[str, Any]:
    """What fetch may pull: complete checkpoints with their MANIFEST entries, and the run files."""
    ckpts = []
    for ckpt in complete_checkpoints(run_dir / "checkpoints"):
        m = read_manifest(ckpt)
        if m:
            ckpts.append({"name": ckpt.name, "step": m["step"], "files": m["files"],
                          "manifest_bytes": (ckpt / MANIFEST).stat().st_size})  # fmt: skip
    files = {n: (run_dir / n).stat().st_size for n in RUN_FILES if (run_dir / n).is_file()}
    latest = latest_checkpoint(run_dir / "checkpoints")
    return {"run_name": run_dir.name, "run_dir": str(run_dir.resolve()), "checkpoints": ckpts, "files": files,
            "latest": latest.name if latest else None, "rsync": shutil.which("rsync") is not None}  # fmt: skip


def tail_offset(run_dir: Path, lines: int) -> int:
    """The byte offset in train.log where its last `lines` lines start."""
    path = run_dir / "train.log"
    if not path.exists():
        return 0
    data = path.read_bytes()
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    pos = end
    for _ in range(lines):
        pos = data.rfind(b"\n", 0, pos)
        if pos < 0:
            return 0
    return pos + 1


def stream_log(run_dir: Path, offset: int, follow: bool, poll: float = 0.05) -> int:
    """Write train.log from byte `offset` to stdout; with `follow`, until the run has ended and
    the file is drained. Returns the run's exit code (or 0 without follow)."""
    out = sys.stdout.buffer
    path = run_dir / "train.log"
    while True:
        ended = not run_alive(run_dir)  # read before draining: no tail lost at the end
        if path.exists():
            with open(path, "rb") as fh:
                fh.seek(offset)
                while chunk := fh.read(1 << 16):
                    out.write(chunk)
                    offset += len(chunk)
                out.flush()
        if not follow or ended:
            return int(read_run_json(run_dir).get("exit_code") or 0) if follow else 0
        time.sleep(poll)
