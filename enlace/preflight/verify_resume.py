"""`enlace verify-resume RUN`: the exact-resume acceptance check as a command.

    straight:  enlace train RUN --until N                   (one process)
    resumed:   enlace train RUN --until N/2 ; enlace train RUN --until N   (two processes)

Both write into a temporary runs dir. Then every tensor of the two step-N checkpoints (model,
optimizer, scaler) is compared by bytes, and the logged losses after N/2 must match exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from enlace.config.schema import Config
from enlace.errors import EnlaceError
from enlace.manifest import step_dir_name
from enlace.train.checkpoint import load_checkpoint
from enlace.train.engine import pick_device


def flatten(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted path, leaf) for every leaf of nested dicts/lists/tuples, in a stable order."""
    if isinstance(obj, dict):
        return [kv for k in sorted(obj, key=str) for kv in flatten(obj[k], f"{prefix}{k}.")]
    if isinstance(obj, (list, tuple)):
        return [kv for i, v in enumerate(obj) for kv in flatten(v, f"{prefix}{i}.")]
    return [(prefix.rstrip("."), obj)]


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def compare_states(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Compare two checkpoints' model, optimizer and scaler by bytes.

    Returns {"identical": bool, "tensors": K, "first_difference": None | {name, max_abs_diff}}."""
    left = flatten({"model": a["model.pt"], "optimizer": a["optimizer.pt"], "scaler": a["trainer.pt"]["scaler"]})
    right = dict(flatten({"model": b["model.pt"], "optimizer": b["optimizer.pt"], "scaler": b["trainer.pt"]["scaler"]}))
    tensors = 0
    for name, x in left:
        y = right.get(name)
        if isinstance(x, torch.Tensor):
            tensors += 1
            same = isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape
            if same and _tensor_bytes(x) == _tensor_bytes(y):
                continue
            diff = (x.double() - y.double()).abs().max().item() if same and x.numel() else None
            return {"identical": False, "tensors": tensors, "first_difference": {"name": name, "max_abs_diff": diff}}
        if x != y:
            return {
                "identical": False,
                "tensors": tensors,
                "first_difference": {"name": name, "max_abs_diff": None, "values": [repr(x), repr(y)]},
            }
    if set(right) != {n for n, _ in left}:
        extra = sorted(set(right) ^ {n for n, _ in left})[0]
        return {"identical": False, "tensors": tensors, "first_difference": {"name": extra, "max_abs_diff": None}}
    return {"identical": True, "tensors": tensors, "first_difference": None}


def _losses(run_dir: Path, after: int) -> list[tuple[int, float]]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "train" and rec["step"] > after:
            out.append((rec["step"], rec["loss"]))
    return out


def _train(cfg: Config, run: str, overrides: list[str], runs_dir: Path, until: int) -> tuple[subprocess.Popen, Path]:
    """Start `enlace train` in a fresh process; its output goes to <runs_dir>-<until>.out."""
    cmd = [
        sys.executable,
        "-m",
        "enlace",
        "train",
        run,
        "--root",
        str(cfg.root),
        "--runs-dir",
        str(runs_dir),
        "--until",
        str(until),
        *[a for o in overrides for a in ("--set", o)],
    ]
    out = runs_dir.parent / f"{runs_dir.name}-{until}.out"
    with open(out, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, out


def _wait(started: tuple[subprocess.Popen, Path], what: str) -> None:
    proc, out = started
    if proc.wait() != 0:
        raise EnlaceError(f"verify-resume: the {what} run exited {proc.returncode}:\n{out.read_text()[-1500:]}")


def side_by_side(cfg: Config) -> bool:
    """Whether the straight run and the first half may run at once: on the CPU, not on a GPU."""

    return pick_device(cfg.runtime.device).type == "cpu"


def verify_resume(cfg: Config, run: str, overrides: list[str], steps: int, keep_dir: bool = False) -> dict[str, Any]:
    if steps < 2 or steps > cfg.training.max_steps:
        raise EnlaceError(f"--steps {steps}: must be between 2 and training.max_steps ({cfg.training.max_steps})")
    half = steps // 2
    overrides = ["training.log_every=1", *overrides]  # compare every step's loss (user --set still wins)
    work = Path(tempfile.mkdtemp(prefix=f"enlace-verify-resume-{cfg.run_name}-"))
    straight_dir, resumed_dir = work / "straight", work / "resumed"
    runs = ((straight_dir, steps, "straight"), (resumed_dir, half, "first half"))
    if side_by_side(cfg):  # on the CPU deterministic mode pins 1 thread each: the two share the cores
        procs = [_train(cfg, run, overrides, d, until) for d, until, _ in runs]
        for started, (_, _, what) in zip(procs, runs):
            _wait(started, what)
    else:  # one GPU: two trainers and two CUDA contexts need not fit on one card, one at a time does
        for d, until, what in runs:
            _wait(_train(cfg, run, overrides, d, until), what)
    _wait(_train(cfg, run, overrides, resumed_dir, steps), "resumed")

    name = step_dir_name(steps)
    a = load_checkpoint(straight_dir / cfg.run_name / "checkpoints" / name)
    b = load_checkpoint(resumed_dir / cfg.run_name / "checkpoints" / name)
    report = compare_states(a, b)
    la, lb = _losses(straight_dir / cfg.run_name, half), _losses(resumed_dir / cfg.run_name, half)
    report.update(
        run_name=cfg.run_name,
        steps=steps,
        resumed_at=half,
        deterministic=cfg.runtime.deterministic,
        losses_identical=la == lb,
        losses_compared=len(la),
        work_dir=str(work),
    )
    report["ok"] = report["identical"] and report["losses_identical"]
    if not keep_dir and report["ok"]:
        shutil.rmtree(work, ignore_errors=True)
    return report
