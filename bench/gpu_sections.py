"""The sections of bench/gpu_check.py, each run in a process of its own (`python bench/gpu_sections.py SECTION
--device D --steps N [--small]` prints the section's JSON as its last line): a section's CUDA context, cache
and compiled kernels end with its process, and a crash or a hung compile costs that section alone.

    environment  device name, capability, driver/CUDA/torch versions, free memory
    drift        the same non-deterministic config twice from one seed → max |Δ| over all parameters
    resume       `verify-resume` of the deterministic twin on the device → identical, or the first difference
    ddp          the deterministic twin under torchrun over every visible GPU (2 gloo processes on the CPU)
    preflight    preflight's predicted peak memory and tokens/s against a real short run's
    costs        each cost alone, in its own try: deterministic kernels (the optimizer held at foreach), the
                 optimizer (fused against foreach), deterministic mode's memory fill, compile, bf16
    throughput   enlace's step and training loop against a nanoGPT-style loop (or nanoGPT's own model with
                 --nanogpt DIR) on the same shapes and bytes: tokens/s and MFU (gpu_throughput.py)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from enlace.config.schema import load_config  # noqa: E402
from enlace.data.prefetch import Prefetched  # noqa: E402
from enlace.data.streams import build_stream  # noqa: E402
from enlace.sysinfo import mib, peak_rss_bytes, reset_peak_rss  # noqa: E402
from enlace.train import engine  # noqa: E402
from enlace.train.determinism import ensure_cublas_workspace  # noqa: E402

SMALL = ["model.seq_len=32", "model.n_layer=2", "model.n_head=2", "model.d_model=32", "training.batch_size=4"]
WARMUP = 3


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


def train_steps(
    cfg, steps: int, least_s: float = 0.0, optimizer: str = "", fill: bool = True
) -> tuple[dict[str, torch.Tensor], float]:
    """Build as train does, run `steps` optimizer steps (more, until `least_s` seconds are measured) on the real
    data stream, drawn ahead as the trainer draws it; returns the final parameters and tokens/s over the steps
    after WARMUP (compile's warm-up excluded). `optimizer="foreach"` steps with foreach AdamW whatever the mode
    picks; `fill=False` turns deterministic mode's fill of new memory off."""
    from enlace.train.optim import build_optimizer

    setup = engine.build_setup(cfg)
    if optimizer == "foreach":  # before the first step: the optimizer's state does not exist yet
        setup.optimizer = build_optimizer(setup.raw_model, cfg.optim, True, setup.device.type)
    tokens_per_step = cfg.training.batch_size * cfg.training.grad_accum * cfg.model.seq_len
    warm = min(WARMUP, steps - 1)
    i = measured = 0
    torch.utils.deterministic.fill_uninitialized_memory = fill
    stream = Prefetched(build_stream(cfg, "train", cfg.training.batch_size), setup.device, cfg.training.prefetch)
    try:
        with stream:
            t0 = time.perf_counter()
            while i < steps or time.perf_counter() - t0 < least_s:
                if i == warm:
                    sync(setup.device)
                    t0 = time.perf_counter()
                engine.train_step(setup, i, stream.next_batch)
                i += 1
                measured += i > warm
                if least_s and i % 10 == 0:  # the clock read against the card's work, not the host's queue
                    sync(setup.device)
            sync(setup.device)
            rate = measured * tokens_per_step / (time.perf_counter() - t0)
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = True
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
    stop flag), through the gloo group made beside nccl on a card."""
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
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
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


def bf16_native(device: torch.device) -> bool:
    """bf16 in hardware (cards.NATIVE_BF16); is_bf16_supported() is also True where it is emulated."""
    from enlace.config.cards import NATIVE_BF16

    return torch.cuda.get_device_capability(device) >= NATIVE_BF16


def environment(device: torch.device) -> dict:
    env = {"device": str(device), "torch": str(torch.__version__), "python": sys.version.split()[0]}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        env.update(
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
            free_mib=mib(free),
            total_mib=mib(total),
            bf16=bf16_native(device),
        )
    else:
        import platform

        env.update(name=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return env


def costs(run: str, overrides: list[str], steps: int, device: torch.device) -> dict:
    """Each cost alone, each in its own try (a compile that fails costs the compile figure only). On CUDA each
    rate is taken over at least 2 s of steps: ten 5 ms steps of a small model read 0.62 M and 0.86 M tokens/s
    for the same config on an H100."""
    least_s = 2.0 if device.type == "cuda" else 0.0

    @functools.cache  # one measurement per config, however many ratios use it
    def rate(*extra: str, optimizer: str = "", fill: bool = True) -> float:
        cfg = config(run, [*overrides, *extra])
        return round(train_steps(cfg, steps, least_s, optimizer=optimizer, fill=fill)[1], 1)

    def pair(label: str, a: tuple, b: tuple) -> dict:
        (name_a, run_a), (name_b, run_b) = a, b
        try:
            ra, rb = run_a(), run_b()
        except Exception as e:
            return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        return {f"{name_a}_tokens_per_s": ra, f"{name_b}_tokens_per_s": rb, label: round(ra / rb, 3)}

    off = ("runtime.deterministic=false", "runtime.compile=false")
    out: dict = {"steps": steps, "at_least_s": least_s}
    out["deterministic"] = pair(  # the kernels and flags alone: both step the optimizer with foreach
        "on_over_off",
        ("on", lambda: rate("runtime.deterministic=true", "runtime.compile=false")),
        ("off", lambda: rate(*off, optimizer="foreach")),
    )
    out["optimizer"] = (
        pair("fused_over_foreach", ("fused", lambda: rate(*off)), ("foreach", lambda: rate(*off, optimizer="foreach")))
        if device.type == "cuda"
        else {"skipped": "fused AdamW is CUDA's"}
    )
    out["memory_fill"] = pair(  # deterministic mode fills new memory with NaN so that a read of it shows
        "on_over_off",
        ("on", lambda: rate("runtime.deterministic=true", "runtime.compile=false")),
        ("off", lambda: rate("runtime.deterministic=true", "runtime.compile=false", fill=False)),
    )
    out["compile"] = pair(
        "on_over_off",
        ("on", lambda: rate("runtime.deterministic=false", "runtime.compile=true")),
        ("off", lambda: rate(*off)),
    )
    if device.type == "cuda" and not bf16_native(device):
        out["bf16"] = {"skipped": "no native bf16 here (compute capability below 8.0: emulated, not measured)"}
    else:
        base = "fp16" if device.type == "cuda" else "fp32"  # fp16 on CPU is ≈20x slower: not a useful baseline
        out["bf16"] = pair(
            f"bf16_over_{base}",
            ("bf16", lambda: rate(*off, "runtime.precision=bf16")),
            (base, lambda: rate(*off, f"runtime.precision={base}")),
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("section", choices=("environment", "drift", "resume", "ddp", "preflight", "costs", "throughput"))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=20, help="steps of each measured run (default: %(default)s)")
    ap.add_argument("--small", action="store_true", help="a tiny model (the test suite's CPU run)")
    ap.add_argument("--nanogpt", type=Path, help="a folder holding nanoGPT's model.py: the throughput baseline")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible here (use --device cpu)")
    cublas = ensure_cublas_workspace()  # before this process's first GEMM: the deterministic sections need it
    device = torch.device(args.device)
    run, det_run, overrides = runs_for(device.type)
    overrides = [*overrides, *(SMALL if args.small else [])]
    steps = args.steps
    if args.section == "environment":
        result = {**environment(device), "cublas_workspace_config": cublas}
    elif args.section == "drift":
        result = drift(run, overrides, steps)
    elif args.section == "resume":
        result = resume(det_run, overrides, steps)
    elif args.section == "ddp":
        result = ddp(det_run, overrides, min(steps, 8), device)
    elif args.section == "preflight":
        result = preflight_accuracy(run, overrides, 5, device)
    elif args.section == "costs":
        result = costs(run, overrides, max(steps // 2, WARMUP + 3), device)
    else:
        from gpu_throughput import throughput

        result = throughput(run, overrides, steps, device, args.small, args.nanogpt)
    print(json.dumps({**result, "pid": os.getpid()}))  # the process it ran in: a section's own


if __name__ == "__main__":
    main()
