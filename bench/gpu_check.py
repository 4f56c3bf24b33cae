"""The GPU claims in one command, within a budget of device time.

    python bench/gpu_check.py [--device cuda|cpu] [--out FILE.json] [--budget-s 240] [--small] [--nanogpt DIR]

Each section runs in a process of its own (bench/gpu_sections.py says what each measures): its CUDA context,
cache and compiled kernels end with it, so this parent holds no GPU memory while the next one (or the ddp
section's torchrun) runs, and a section that crashes, hangs or fails to compile costs its own figures only.
One JSON (and a short table). A section that would overrun the budget is recorded as skipped, never guessed;
one that runs past its time is ended and recorded as such. `--device cpu --small` runs every code path on a
tiny model (the test suite does, so this script cannot rot).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECTIONS = ("drift", "resume", "ddp", "preflight", "costs", "throughput")  # in this order, after environment
SLOWEST_START_S = 120  # a section's own floor: torch's import and compile's first build take about a minute


class Budget:
    def __init__(self, seconds: float):
        self.seconds, self.t0 = seconds, time.monotonic()

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.t0)


def section(name: str, args: list[str], timeout: float) -> dict:
    """One section in a child process: its JSON, or what went wrong in one line."""
    cmd = [sys.executable, str(HERE / "gpu_sections.py"), name, *args]
    # its own session: at its time the whole group ends, the ddp section's torchrun and ranks too
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE.parent, start_new_session=True
    )
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return {"error": f"ended after {timeout:.0f} s (its time)"}
    lines = stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        tail = (stderr.strip().splitlines() or [""])[-1][:300]
        return {"error": f"exited {p.returncode}: {tail}"}
    return json.loads(lines[-1])


def driver_version() -> str | None:
    """The NVIDIA driver's version, as nvidia-smi says it; None without nvidia-smi (a container may lack it:
    the check goes on without the figure)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = smi.stdout.strip().splitlines()
    return lines[0] if smi.returncode == 0 and lines else None


def run_checks(device: str | None, budget_s: float, steps: int, small: bool, nanogpt: Path | None, out: Path) -> dict:
    """Every section within the budget (none past what is left of it); `out` is rewritten after each, so that
    a check ended from outside keeps the figures it has."""
    budget = Budget(budget_s)
    env = section("environment", ["--device", device] if device else [], SLOWEST_START_S)  # it picks, if not told
    if "error" in env:
        raise SystemExit(f"gpu_check: the environment section failed: {env['error']}")
    env["driver"] = driver_version() if env["device"] == "cuda" else None
    common = ["--device", env["device"], "--steps", str(steps), *(["--small"] if small else [])]
    report: dict = {"environment": env, "budget_s": budget_s, "small": small, "seconds": {}}
    for i, name in enumerate(SECTIONS):
        share = budget.left() / (len(SECTIONS) - i)  # what is left, split over what is left to do
        if budget.left() < 10:
            report[name] = {"skipped": f"the budget ({budget_s:.0f} s) was spent before it"}
            continue
        extra = ["--nanogpt", str(nanogpt)] if name == "throughput" and nanogpt else []
        t0 = time.monotonic()
        report[name] = section(name, [*common, *extra], min(max(share * 2, SLOWEST_START_S), budget.left()))
        report["seconds"][name] = round(time.monotonic() - t0, 1)
        if report["seconds"][name] > share * 2:
            report[name]["note"] = f"took {report['seconds'][name]:.0f} s of a {share:.0f} s share"
        out.write_text(json.dumps(report, indent=1) + "\n")
    report["seconds"]["total"] = round(time.monotonic() - budget.t0, 1)
    return report


def why_not(r: dict, section: str, *keys: str) -> str | None:
    """Why a figure is missing: the nearest `skipped` or `error` on its way down, or None if there is none."""
    if section not in r:
        return "not run (the check ended before it)"
    node = r[section]
    for k in (None, *keys):
        node = node.get(k, {}) if k is not None and isinstance(node, dict) else node
        if isinstance(node, dict) and (node.get("skipped") or node.get("error")):
            return f"skipped: {node['skipped']}" if node.get("skipped") else f"error: {node['error']}"
    return "not reported" if node == {} else None


def table(r: dict) -> str:
    """One line a figure; a figure that is missing says why, once."""
    env, costs, tp = r["environment"], r.get("costs", {}), r.get("throughput", {})
    pf = r.get("preflight", {})
    drift, resume, ddp = r.get("drift", {}), r.get("resume", {}), r.get("ddp", {})
    base = "fp16" if env["device"] == "cuda" else "fp32"
    cuda = f", CUDA {env['cuda']}, driver {env['driver']}, cc {env['capability']}" if env.get("cuda") else ""
    rows = [("device", ("environment",), lambda: f"{env.get('name')} ({env['device']}), torch {env['torch']}{cuda}")]
    rows += [
        (
            "drift",
            ("drift",),
            lambda: (
                f"max |Δ| {drift['max_abs_diff']} after {drift['steps']} steps "
                f"({drift['precision']}; {drift['tensors_differing']}/{drift['tensors']} tensors differ)"
            ),
        ),
        (
            "resume",
            ("resume",),
            lambda: (
                f"identical {resume['identical']} ({resume['tensors']} tensors); "
                f"first difference {resume['first_difference']}"
            ),
        ),
        (
            "ddp",
            ("ddp",),
            lambda: f"world {ddp['world']}: identical {ddp['identical']}, ranks draw apart {ddp['ranks_draw_apart']}",
        ),
        (
            "preflight",
            ("preflight",),
            lambda: f"predicted/measured: memory {pf['memory_ratio']}, tokens/s {pf['throughput_ratio']}",
        ),
        (
            "deterministic",
            ("costs", "deterministic"),
            lambda: f"on/off tokens/s {costs['deterministic']['on_over_off']} (foreach AdamW in both)",
        ),
        (
            "optimizer",
            ("costs", "optimizer"),
            lambda: f"fused/foreach tokens/s {costs['optimizer']['fused_over_foreach']}",
        ),
        (
            "memory fill",
            ("costs", "memory_fill"),
            lambda: f"on/off tokens/s {costs['memory_fill']['on_over_off']} (deterministic)",
        ),
        ("compile", ("costs", "compile"), lambda: f"on/off tokens/s {costs['compile']['on_over_off']}"),
        ("bf16", ("costs", "bf16"), lambda: f"bf16/{base} tokens/s {costs['bf16'][f'bf16_over_{base}']}"),
    ]
    for name, label in (("enlace_step", "enlace step"), ("enlace_train", "enlace loop"), ("nanogpt", "nanoGPT loop")):
        rows.append((label, ("throughput", name), lambda name=name: rate(tp, name)))
    lines = [(label, why_not(r, *where) or text()) for label, where, text in rows]
    lines.append(("time", f"{r['seconds']['total']} s of {r['budget_s']} s"))
    return "\n".join(f"{k:14} {v}" for k, v in lines)


def rate(tp: dict, name: str) -> str:
    """A throughput row: tokens/s, MFU (or why there is none), and against what."""
    figure = tp[name]
    mfu = f"MFU {figure['mfu']:.1%}" if figure["mfu"] is not None else "MFU n/a (no peak FLOP/s known for this device)"
    versus = f", {figure['over_nanogpt']}x the nanoGPT loop" if "over_nanogpt" in figure else ""
    model = f" ({tp['baseline']})" if name == "nanogpt" else ""
    return f"{figure['tokens_per_s']:.0f} tokens/s, {mfu}{versus}{model}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda where torch sees one, else cpu")
    ap.add_argument("--out", type=Path, default=Path("bench/out/gpu_check.json"), help="default: %(default)s")
    ap.add_argument("--budget-s", type=float, default=240.0, help="the whole check's time (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=20, help="steps of each measured run (default: %(default)s)")
    ap.add_argument("--small", action="store_true", help="a tiny model (the test suite's CPU run)")
    ap.add_argument("--nanogpt", type=Path, help="a folder holding nanoGPT's model.py: the throughput baseline")
    args = ap.parse_args()
    if args.nanogpt and not (args.nanogpt / "model.py").is_file():
        ap.error(f"--nanogpt {args.nanogpt}: no model.py there (give a nanoGPT checkout)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = run_checks(args.device, args.budget_s, args.steps, args.small, args.nanogpt, args.out)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
