"""A run's files as the server verbs read them for the driver: run directories by name, the status
table and train.log from a byte offset (followed). Run state itself is enlace/state/runs.py's; what fetch
is offered, enlace/server/fetchserve.py's. None of them imports torch, so each answers in tens of milliseconds."""

from __future__ import annotations

import difflib
import os
import sys
import time
from pathlib import Path
from typing import Any

from enlace import contract
from enlace.contract import exit_code_of
from enlace.errors import EnlaceError
from enlace.names import validate_run_name
from enlace.slurm.settings import QUEUED_STATES
from enlace.state import runs
from enlace.units import one_line

LOG_TAIL_BYTES = 64 << 10  # what is read of train.log for its last line
LAST_LINE_CHARS = 300  # of a log line quoted in an error (a traceback's last line fits)


def supervisor_line(text: str) -> str:
    """A supervisor's line in train.log, stamped like the trainer's (contract.SUPERVISOR_LINE tells it from the child's)."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S')} supervisor: {text}"


class NoSuchRun(EnlaceError):
    exit_code = contract.USAGE
    kind = contract.ErrorKind.NO_SUCH_RUN


def last_line(run_dir: Path, child_only: bool = False, since: int = 0) -> str:
    """The last non-empty line of the run's train.log: what a trainer that could not record its error said; or
    (`child_only`) the last line a command wrote itself after byte `since` (its attempt's start), the
    supervisor's own lines skipped ("" if none). A progress bar's line is its last redraw; a line is cut at
    LAST_LINE_CHARS."""
    try:
        with open(run_dir / "train.log", "rb") as f:
            f.seek(max(since, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            tail = f.read().decode(errors="replace")
    except FileNotFoundError:
        tail = ""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]  # a \r (a progress bar's redraw) splits too
    if child_only:  # its own words: not the supervisor's, not a rule of ==== (torchrun's report ends in one)
        lines = [ln for ln in lines if not contract.SUPERVISOR_LINE.match(ln) and any(c.isalnum() for c in ln)]
    elif not lines:
        return "the trainer exited before writing to train.log"
    return one_line(lines[-1], LAST_LINE_CHARS) if lines else ""


def run_dir_of(runs_root: Path, name: str) -> Path:
    validate_run_name(name, "RUN_NAME")
    d = runs_root / name
    if not d.is_dir():
        have = (
            sorted(p.name for p in runs_root.iterdir() if p.is_dir() and not p.name.startswith("."))
            if runs_root.is_dir()
            else []
        )
        near = difflib.get_close_matches(name, have, n=1, cutoff=0.6)  # (the list grows with every run kept)
        said = f"did you mean {near[0]!r}? " if near else ""
        raise NoSuchRun(f"no run named {name!r} here — {said}runs on this host: {', '.join(have) or 'none'}")
    return d


def launched_run_dir(runs_root: Path, name: str) -> Path:
    """run_dir_of, for a run that has been launched: one only preflighted (a preflight.json, no run.json)
    has no status to show, and reading it as `crashed at 0/None` would say something that never happened."""
    d = run_dir_of(runs_root, name)
    if not (d / "run.json").exists():
        raise NoSuchRun(f"{name} has not been launched on this host (only preflighted) — enlace-remote launch {name}")
    return d


def all_status(runs_root: Path) -> list[dict[str, Any]]:
    if not runs_root.is_dir():
        return []
    dirs = sorted(p for p in runs_root.iterdir() if p.is_dir() and not p.name.startswith("."))
    return [runs.observe(d) for d in dirs if (d / "run.json").exists()]


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


def stream_log(run_dir: Path, offset: int, follow: bool, heartbeat_s: float, poll: float = 0.05) -> int:
    """Write train.log from byte `offset` to stdout; with `follow`, until the run has ended and the file
    is drained (then the run's exit code, from contract.exit_code_of). A newline goes to stderr after
    `heartbeat_s` quiet seconds (a long eval, a compile warm-up), so the driver can tell a quiet run from
    a dead connection."""
    out = sys.stdout.buffer
    path = run_dir / "train.log"
    last_data = time.monotonic()
    queued = None
    while True:
        state = runs.read(run_dir)
        ended = not runs.alive(state, run_dir)  # read before draining: no tail lost at the end
        if follow and state.get("job_id"):
            queued = _say_if_queued(run_dir.name, runs.job_of(state), queued)
        if path.exists():
            with open(path, "rb") as fh:
                fh.seek(offset)
                while chunk := fh.read(1 << 16):
                    out.write(chunk)
                    offset += len(chunk)
                    last_data = time.monotonic()
                out.flush()
        if not follow:
            return 0
        if ended:
            return exit_code_of(runs.observe(run_dir))
        if time.monotonic() - last_data > heartbeat_s:
            sys.stderr.write("\n")
            sys.stderr.flush()
            last_data = time.monotonic()
        time.sleep(poll)


def _say_if_queued(name: str, job: dict[str, Any], shown: str | None) -> str | None:
    """On stderr, once per change: the run's Slurm job is queued (and why); returns what is shown now."""

    now = f"{job['state']} ({job.get('reason') or '-'})" if job.get("state") in QUEUED_STATES else None
    if now and now != shown:
        sys.stderr.write(f"{name}: Slurm job {job['job_id']} is {now}; waiting for it to start\n")
        sys.stderr.flush()
    return now
