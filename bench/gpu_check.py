"""The GPU claims in one command, within a budget of device time.

    python bench/gpu_check.py [--device cuda|cpu] [--out FILE.json] [--budget-s 240] [--small]

One process, five sections, one JSON (and a short table):
  1. drift        the same non-deterministic config (fp16 + GradScaler on CUDA, compile off) twice for
                  --steps steps from one seed → max |Δ| over all parameters (non-zero expected on CUDA)
  2. resume       `verify-resume` of the deterministic twin on the device → identical, or the first
                  differing tensor
  2b. ddp         the deterministic twin under torchrun over every visible GPU (2 gloo processes on the
                  CPU): straight vs half + resume, by bytes; each rank's RNG its own
  3. preflight    preflight's predicted peak memory (CUDA: reserved) and tokens/s vs a real short run's
                  measured torch.cuda.max_memory_reserved() (CPU: peak RSS) and tokens/s → ratios
  4. costs        tokens/s with deterministic on/off, compile on/off (after warm-up), bf16 vs fp16
                  (CUDA, where bf16 is supported; CPU: bf16 vs fp32)
  5. environment  device name, capability, driver/CUDA/torch versions, free memory
A section that would overrun the budget is recorded as skipped, never guessed. `--device cpu --small`
runs every code path on a tiny model (the test suite does, so this script cannot rot).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from enlace.config.schema import load_config  # noqa: E402
from enlace.data.streams import build_stream  # noqa: E402
from enlace.sysinfo import mib, peak_rss_bytes, reset_peak_rss  # noqa: E402
from enlace.train import engine  # noqa: E402
from enlace.train.determinism import ensure_cublas_workspace  # noqa: E402

SMALL = ["model.seq_len=32", "model.n_layer=2", "model.n_head=2", "model.d_model=32", "training.batch_size=4"]
WARMUP = 3
SECTIONS = ("drift", "resume", "ddp", "preflight", "costs")  # in this order, each within its share of what is left


class Budget:
    def __init__(self, seconds: float):
        self.seconds, self.t0 = seconds, time.monotonic()

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.t0)


def runs_for(device: str) -> tuple[str, str, list[str]]:
    """(run, its deterministic twin, overrides) for the device: the RTX 2060 smoke runs on CUDA
    (fp16 + GradScaler), smoke-cpu (fp32) on the CPU. Dropout stays as configured: the resume section
    then restores the device's RNG too, as a real run's resume does."""
    if device == "cuda":
        return "smoke-2060", "smoke-2060-deterministic", []
    return "smoke-cpu", "smoke-cpu-deterministic", ["runtime.device=cpu"]


def config(run: str, overrides: list[str]):
    return load_config(run, overrides, root=REPO)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_steps(cfg, steps: int) -> tuple[dict[str, torch.Tensor], float]:
    """Build as train does, run `steps` optimizer steps on the real data stream; returns the final
    parameters and tokens/s over the steps after WARMUP (compile's warm-up excluded)."""
    setup = engine.build_setup(cfg)
    stream = build_stream(cfg, "train", cfg.training.batch_size)
    tokens_per_step = cfg.training.batch_size * cfg.training.grad_accum * cfg.model.seq_len
    t0 = None
    for i in range(steps):
        if i == min(WARMUP, steps - 1):
            sync(setup.device)
            t0 = time.perf_counter()
        engine.train_step(setup, i, stream.next_batch)
    sync(setup.device)
    measured = steps - min(WARMUP, steps - 1)
    rate = measured * tokens_per_step / (time.perf_counter() - t0)
    params = {k: v.detach().float().cpu().clone() for k, v in setup.raw_model.state_dict().items()}
    return params, rate


def drift(run: str, overrides: list[str], steps: int) -> dict:
    cfg = config(run, [*overrides, "runtime.deterministic=false", "runtime.compile=false"])
    a, _ = train_steps(cfg, steps)
    b, _ = train_steps(cfg, steps)
    diffs = {k: (a[k] - b[k]).abs().max().item() for k in a}
    worst = max(diffs, key=diffs.get)
    return {
        "run": run,
        "precision": cfg.runtime.precision,
        "steps": steps,
        "max_abs_diff": diffs[worst],
        "worst_tensor": worst,
        "tensors_differing": sum(d > 0 for d in diffs.values()),
        "tensors": len(diffs),
    }


def resume(det_run: str, overrides: list[str], steps: int) -> dict:
    from enlace.preflight.verify_resume import verify_resume

    cfg = config(det_run, overrides)
    rep = verify_resume(cfg, det_run, overrides, steps)
    return {
        "run": det_run,
        "identical": rep["ok"],
        "tensors": rep["tensors"],
        "steps": steps,
        "resumed_at": rep["resumed_at"],
        "first_difference": rep["first_difference"],
        "losses_identical": rep["losses_identical"],
    }


def ddp(det_run: str, overrides: list[str], steps: int, device: torch.device) -> dict:
    """DDP over every visible GPU (2 gloo processes on the CPU): `steps` straight under torchrun, and half +
    a resume in new processes; the two final checkpoints compared by bytes. Every step runs any_rank (the
    stop flag) on the group's backend, so nccl's device rule is exercised too."""
    from enlace.manifest import step_dir_name
    from enlace.preflight.verify_resume import compare_states
    from enlace.train.checkpoint import load_checkpoint

    world = torch.cuda.device_count() if device.type == "cuda" else 2
    if world < 2:
        return {"skipped": f"{world} GPU visible: DDP needs 2"}
    half = steps // 2
    with tempfile.TemporaryDirectory(prefix="gpu-check-ddp-") as tmp:

        def torchrun(runs: str, until: int) -> None:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
            cmd += [f"--log-dir={tmp}/torchrun", "-m", "enlace", "train", det_run, "--root", str(REPO)]
            cmd += ["--runs-dir", f"{tmp}/{runs}", "--until", str(until), *[a for o in overrides for a in ("--set", o)]]
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
            if out.returncode != 0:
                raise RuntimeError(f"torchrun exited {out.returncode}: {out.stderr[-800:]}")

        torchrun("straight", steps)
        torchrun("resumed", half)
        torchrun("resumed", steps)
        name = config(det_run, overrides).run_name
        a, b = (
            load_checkpoint(Path(tmp, d, name, "checkpoints", step_dir_name(steps))) for d in ("straight", "resumed")
        )
        rep = compare_states(a, b)
        rngs = [r["rng"]["torch"] for r in a["trainer.pt"]["ranks"]]
    return {
        "world": world,
        "steps": steps,
        "resumed_at": half,
        "identical": rep["identical"],
        "first_difference": rep["first_difference"],
        "ranks_draw_apart": len({bytes(t.numpy()) for t in rngs}) == len(rngs),
    }


def preflight_accuracy(run: str, overrides: list[str], steps: int, device: torch.device) -> dict:
    from enlace.preflight.measure import preflight
    from enlace.train.loop import train

    cfg = config(run, overrides)
    report = preflight(cfg, steps)
    key = "peak_reserved_mib" if device.type == "cuda" else "peak_rss_mib"
    predicted_mem, predicted_rate = report["memory"][key], report["throughput"]["tokens_per_s"]
    with tempfile.TemporaryDirectory(prefix="enlace-gpu-check-") as tmp:
        real_steps = max(steps * 4, 12)
        real_cfg = config(
            run,
            [
                *overrides,
                f"training.max_steps={real_steps}",
                "training.eval_every=0",
                f"optim.warmup_steps={min(cfg.optim.warmup_steps, real_steps)}",
                "checkpoint.every=0",
                "training.log_every=1",
            ],
        )
        real_cfg.runs_root = Path(tmp)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        reset_peak_rss()
        with contextlib.redirect_stdout(io.StringIO()):  # the run's log lines: not this report's
            summary = train(real_cfg, resume="none")
    measured_mem = summary["cuda_max_reserved_mib"] if device.type == "cuda" else mib(peak_rss_bytes())
    measured_rate = summary["tokens_per_s"]
    return {
        "run": run,
        "memory_kind": key,
        "predicted_mib": predicted_mem,
        "measured_mib": measured_mem,
        "memory_ratio": round(predicted_mem / measured_mem, 3) if measured_mem else None,
        "predicted_tokens_per_s": predicted_rate,
        "measured_tokens_per_s": round(measured_rate, 1),
        "throughput_ratio": round(predicted_rate / measured_rate, 3) if measured_rate else None,
        "verdict": report["verdict"],
    }


def costs(run: str, overrides: list[str], steps: int, device: torch.device, budget: Budget) -> dict:
    def rate(*extra: str) -> float:
        return round(train_steps(config(run, [*overrides, *extra]), steps)[1], 1)

    out: dict = {"steps": steps}
    off = rate("runtime.deterministic=false", "runtime.compile=false")
    on = rate("runtime.deterministic=true", "runtime.compile=false")
    out["deterministic"] = {"off_tokens_per_s": off, "on_tokens_per_s": on, "on_over_off": round(on / off, 3)}
    if budget.left() > 60 or device.type == "cpu":
        compiled = rate("runtime.deterministic=false", "runtime.compile=true")
        out["compile"] = {"off_tokens_per_s": off, "on_tokens_per_s": compiled, "on_over_off": round(compiled / off, 3)}
    else:
        out["compile"] = {"skipped": f"budget ({budget.left():.0f} s left; compile's first build takes about a minute)"}
    if device.type == "cuda" and not bf16_native(device):
        out["bf16"] = {"skipped": "no native bf16 here (compute capability below 8.0: emulated, not measured)"}
    else:
        base = "fp16" if device.type == "cuda" else "fp32"  # fp16 on CPU is ≈20x slower: not a useful baseline
        b = rate("runtime.deterministic=false", "runtime.compile=false", "runtime.precision=bf16")
        f = rate("runtime.deterministic=false", "runtime.compile=false", f"runtime.precision={base}")
        out["bf16"] = {f"{base}_tokens_per_s": f, "bf16_tokens_per_s": b, f"bf16_over_{base}": round(b / f, 3)}
    return out


def bf16_native(device: torch.device) -> bool:
    """bf16 in hardware (compute capability 8.0+); is_bf16_supported() is also True where it is emulated."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def driver_version() -> str | None:
    """The NVIDIA driver's version, as nvidia-smi says it; None without nvidia-smi (a container may lack it:
    the check goes on without the figure)."""
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


def environment(device: torch.device) -> dict:
    env = {"device": str(device), "torch": str(torch.__version__), "python": sys.version.split()[0]}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        env.update(
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
            driver=driver_version(),
            free_mib=mib(free),
            total_mib=mib(total),
            bf16=bf16_native(device),
        )
    else:
        import platform

        env.update(name=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return env


def run_checks(device_name: str, budget_s: float, steps: int, small: bool) -> dict:
    cublas = ensure_cublas_workspace()  # before this process's first GEMM: the deterministic sections need it
    device = torch.device(device_name)
    budget = Budget(budget_s)
    run, det_run, overrides = runs_for(device.type)
    overrides = [*overrides, *(SMALL if small else [])]
    report: dict = {"environment": environment(device), "budget_s": budget_s, "small": small, "seconds": {}}
    report["environment"]["cublas_workspace_config"] = cublas
    jobs = {
        "drift": lambda: drift(run, overrides, steps),
        "resume": lambda: resume(det_run, overrides, steps),
        "ddp": lambda: ddp(det_run, overrides, min(steps, 8), device),
        "preflight": lambda: preflight_accuracy(run, overrides, 5, device),
        "costs": lambda: costs(run, overrides, max(steps // 2, WARMUP + 3), device, budget),
    }
    for i, name in enumerate(SECTIONS):
        share = budget.left() / (len(SECTIONS) - i)  # what is left, split over what is left to do
        if budget.left() < 10:
            report[name] = {"skipped": f"budget spent ({budget.left():.0f} s left)"}
            continue
        t0 = time.monotonic()
        try:
            report[name] = jobs[name]()
        except Exception as e:  # one failing section must not cost the figures of the others
            report[name] = {"error": f"{type(e).__name__}: {e}"}
        report["seconds"][name] = round(time.monotonic() - t0, 1)
        if report["seconds"][name] > share * 2:
            report[name]["note"] = f"took {report['seconds'][name]:.0f} s of a {share:.0f} s share"
    report["seconds"]["total"] = round(time.monotonic() - budget.t0, 1)
    return report


def table(r: dict) -> str:
    def get(section: str, *keys: str):
        node = r.get(section, {})
        for k in keys:
            node = node.get(k, {}) if isinstance(node, dict) else {}
        return node if node != {} else (r.get(section, {}).get("skipped") or r.get(section, {}).get("error") or "-")

    env = r["environment"]
    rows = [
        (
            "device",
            f"{env.get('name')} ({env['device']}), torch {env['torch']}"
            + (f", CUDA {env['cuda']}, driver {env['driver']}, cc {env['capability']}" if env.get("cuda") else ""),
        ),
        (
            "drift",
            f"max |Δ| {get('drift', 'max_abs_diff')} after {get('drift', 'steps')} steps "
            f"({get('drift', 'precision')}; {get('drift', 'tensors_differing')}/{get('drift', 'tensors')} tensors differ)",
        ),
        (
            "resume",
            f"identical {get('resume', 'identical')} ({get('resume', 'tensors')} tensors); "
            f"first difference {get('resume', 'first_difference')}",
        ),
        (
            "ddp",
            f"world {get('ddp', 'world')}: identical {get('ddp', 'identical')}, ranks draw apart "
            f"{get('ddp', 'ranks_draw_apart')}",
        ),
        (
            "preflight",
            f"memory predicted/measured {get('preflight', 'memory_ratio')}, tokens/s "
            f"{get('preflight', 'throughput_ratio')}",
        ),
        ("deterministic", f"on/off tokens/s {get('costs', 'deterministic', 'on_over_off')}"),
        ("compile", f"on/off tokens/s {get('costs', 'compile', 'on_over_off')}"),
        ("bf16", json.dumps(get("costs", "bf16"))),
        ("time", f"{r['seconds']['total']} s of {r['budget_s']} s"),
    ]
    return "\n".join(f"{k:14} {v}" for k, v in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--steps", type=int, default=20, help="steps for drift and verify-resume")
    ap.add_argument("--small", action="store_true", help="a tiny model (the test suite's CPU run)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is visible here (use --device cpu)")
    report = run_checks(args.device, args.budget_s, args.steps, args.small)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
