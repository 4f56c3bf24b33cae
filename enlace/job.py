"""enlace.job: the small run API for your own script under enlace-remote (docs/own-script.md). Importable
without torch (the standard library, and psutil through the run state), so any environment can use it.

    from enlace import job

    start = 0
    if (ckpt := job.resume_from()) is not None:       # the newest complete checkpoint, after a restart
        model.load_state_dict(torch.load(ckpt / "model.pt", weights_only=True)); start = job.step_of(ckpt)
    for step in range(start + 1, steps + 1):
        ...
        job.log(step, loss=loss.item())                # metrics.jsonl, run.json, the stall clock's heartbeat
        if step % 50 == 0 or job.stop_requested():    # `enlace-remote stop` asks (SIGTERM)
            with job.checkpoint(step) as d:            # counts only once complete: MANIFEST, renamed in, latest
                torch.save(model.state_dict(), d / "model.pt")
        if job.stop_requested():
            break

What a script gets for it: `status` and the board show its step and loss, TensorBoard/W&B-ready records in
metrics.jsonl, stall detection from its heartbeat, and checkpoints that fetch verifies and a restart resumes
from (ENLACE_RESUME_FROM names the same). Outside enlace (no ENLACE_RUN_DIR) it writes to ./enlace-run/, so the
script runs the same on a laptop.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from enlace.manifest import complete_checkpoints, latest_checkpoint, publish, read_manifest
from enlace.state import heartbeat, runs

KEEP = 2  # complete checkpoints kept (checkpoint(keep=...) changes it)
SHOWN = ("loss", "val_loss", "val_bpb", "tokens_per_s")  # the logged values run.json keeps: status shows them
STATUS_EVERY_S = 1.0  # run.json's step and loss at most this often (a flock and an fsync: not on every step)
_state: dict = {"stop": False, "watching": False, "beat": None, "metrics": None, "pending": {}, "written": 0.0}


def rank() -> int:
    """This process's rank under torchrun (0 alone): only rank 0 writes the run's metrics and checkpoints."""
    return int(os.environ.get("RANK") or 0)


def run_dir() -> Path:
    """The run's directory on the server (ENLACE_RUN_DIR), or ./enlace-run outside enlace."""
    path = Path(os.environ.get("ENLACE_RUN_DIR") or "enlace-run")
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_name() -> str:
    return os.environ.get("ENLACE_RUN_NAME") or run_dir().resolve().name


def restart() -> int:
    """How many times the supervisor has restarted this run (0 on its first start)."""
    return int(os.environ.get("ENLACE_RESTART") or 0)


def resume_from() -> Path | None:
    """The newest complete checkpoint of this run (one job.checkpoint wrote), or None: start afresh. Under enlace
    it is said in run.json (`resumed_from`, the launch says it) with the step and figures logged up to it: status
    showed none until the next eval (a launch and a restart begin the run's figures anew)."""
    ckpt = latest_checkpoint(run_dir() / "checkpoints")
    if ckpt is not None and rank() == 0 and os.environ.get("ENLACE_RUN_DIR"):
        step = step_of(ckpt)
        runs.update(run_dir(), resumed_from=ckpt.name, step=step, **_figures_up_to(step))
    return ckpt


def _figures_up_to(step: int) -> dict[str, float]:
    """The last of each value status shows, in metrics.jsonl's records up to `step` (those past it were not kept)."""
    figures: dict[str, float] = {}
    with contextlib.suppress(FileNotFoundError), open(run_dir() / "metrics.jsonl") as records:
        for line in records:
            with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                rec = json.loads(line)
                if rec["step"] <= step:
                    figures |= {k: float(rec[k]) for k in SHOWN if rec.get(k) is not None}
    return figures


def step_of(ckpt: Path) -> int:
    """The step a checkpoint was written at (its MANIFEST says)."""
    return int(read_manifest(ckpt)["step"])


def stop_requested() -> bool:
    """Whether a stop was asked (SIGTERM: `enlace-remote stop`, Slurm's time limit): finish the step, save a
    checkpoint and return. The first call puts the handler in place (log() calls it too)."""
    _watch_stop()
    return _state["stop"]


def _watch_stop() -> None:
    if not _state["watching"]:
        signal.signal(signal.SIGTERM, lambda *_: _state.update(stop=True))
        if hasattr(signal, "SIGUSR2"):  # the supervisor's stall clock asks for the stacks before it ends a hung run
            faulthandler.register(signal.SIGUSR2, all_threads=True)
        atexit.register(_flush_status)
        _state["watching"] = True


def beat() -> None:
    """A sign of life for the supervisor's stall clock, for work between two log() calls that takes long."""
    if _state["beat"] is None:
        _state["beat"] = heartbeat.Heartbeat(run_dir() / heartbeat.TRAINER)
    _state["beat"]()


def log(step: int, kind: str = "train", **metrics: float) -> None:
    """One record in metrics.jsonl ({"kind", "step", **metrics}: `loss` and `val_loss`/`val_bpb` are what
    status and the board show), the run's step (and those values) in run.json, and a heartbeat."""
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"enlace.job.log: step {step!r} is not a whole number ≥ 0")
    _watch_stop()
    if rank() != 0:  # one record per step, not one per rank
        return
    values = {k: float(v) for k, v in metrics.items()}
    if _state["metrics"] is None:
        _state["metrics"] = open(run_dir() / "metrics.jsonl", "a", buffering=1)
    _state["metrics"].write(json.dumps({"kind": kind, "step": step, "time": time.time(), **values}) + "\n")
    shown = {k: v for k, v in values.items() if k in SHOWN}
    _state["pending"].update(step=step, **shown)
    if time.monotonic() - _state["written"] > STATUS_EVERY_S:
        _flush_status()
    beat()


def _flush_status() -> None:
    """The step and values logged since the last write, into run.json (under enlace: the supervisor's file, whose
    status stays its own); at most every STATUS_EVERY_S, at each checkpoint and at exit."""
    if _state["pending"] and os.environ.get("ENLACE_RUN_DIR"):
        runs.update(run_dir(), **_state["pending"])
    _state["pending"], _state["written"] = {}, time.monotonic()


@contextlib.contextmanager
def checkpoint(step: int, keep: int = KEEP) -> Iterator[Path]:
    """A directory to write checkpoint `step`'s files into (flat: files, no subdirectories); once the block
    ends without an error it is made complete — MANIFEST of sha256, renamed in whole, `latest` naming it —
    and the complete ones beyond `keep` are removed. An error (or a kill) leaves no checkpoint behind. Under
    torchrun only rank 0's counts: the other ranks' directory is thrown away (write the same state from any)."""
    root = run_dir() / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-job-step-{step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    t0 = time.monotonic()
    try:
        yield tmp
        nested = [p.name for p in tmp.iterdir() if not p.is_file()]
        if nested:
            raise ValueError(f"enlace.job.checkpoint: {nested[0]} is a directory — a checkpoint holds files only")
        if not any(tmp.iterdir()):
            raise ValueError("enlace.job.checkpoint: nothing was written into the checkpoint's directory")
        if rank() == 0:
            _flush_status()
            with beat_while():
                publish(root, tmp, step, keep)
            _state["pending"]["last_save_s"] = round(time.monotonic() - t0, 3)  # a stop's grace is sized from it
            _flush_status()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def beat_while() -> Iterator[None]:
    """Heartbeats from a helper thread while a long block runs (a large save)."""
    beat()
    with _state["beat"].beating():
        yield


def checkpoints() -> list[Path]:
    """This run's complete checkpoints, oldest first."""
    return complete_checkpoints(run_dir() / "checkpoints")


__all__ = [
    "beat",
    "checkpoint",
    "checkpoints",
    "log",
    "rank",
    "restart",
    "resume_from",
    "run_dir",
    "run_name",
    "step_of",
    "stop_requested",
]
