"""`enlace preflight RUN`: does the batch fit, how long will the run take, does fp16 hold?

Builds model, optimizer, scaler, precision, compile and determinism through engine.build_setup —
the functions `train` uses — and swaps only the data source for synthetic bytes of the configured
shape. Phases: warm-up steps (optimizer state is created lazily; compile and cuDNN autotune happen
early), measured steps, one eval pass at the eval batch size, one checkpoint save into a temp dir.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from enlace.config.schema import Config
from enlace.data.prefetch import Prefetched
from enlace.data.synthetic import SyntheticStream
from enlace.manifest import read_manifest
from enlace.sysinfo import cpu_name, mib, peak_rss_bytes, reset_peak_rss, total_memory_bytes
from enlace.train import engine
from enlace.train.checkpoint import resolve_resume, save_checkpoint
from enlace.train.dist import Dist
from enlace.units import duration

WARMUP_STEPS = 3  # also the fp16 calibration window: skips here are the scaler finding its scale
TIGHT_HEADROOM_PCT = 10.0
UNSTABLE_SKIP_FRACTION = 0.2  # of measured (post-calibration) steps


class OutOfMemory(Exception):
    def __init__(self, phase: str, detail: str):
        super().__init__(f"{phase}: {detail}")
        self.phase, self.detail = phase, detail


DEFAULT_BUDGET_S = 300.0  # preflight's own measuring time; past it (or projected past it) the verdict is too_slow


class TooSlow(Exception):
    """Measuring would outrun preflight's budget: `step_s` is the last step's time (None: none finished)."""

    def __init__(self, elapsed_s: float, step_s: float | None, steps_done: int):
        super().__init__(f"{elapsed_s:.0f} s")
        self.elapsed_s, self.step_s, self.steps_done = elapsed_s, step_s, steps_done


@contextlib.contextmanager
def time_budget(seconds: float | None, started: float):
    """Raise TooSlow in the main thread when `seconds` have passed, even inside one long step (a Python
    signal handler runs between torch ops). Off under DDP or off the main thread: then the check between
    steps (in _measure) is the only one."""
    usable = seconds and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise TooSlow(time.perf_counter() - started, None, 0)

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class MemoryWatch:
    """Tracks the current phase; on CPU with a limit, turns a peak RSS above it into an OOM."""

    def __init__(self, device: torch.device, limit: int | None):
        self.device, self.limit, self.phase = device, limit, "build"

    def __call__(self, phase: str) -> None:
        if self.limit and self.device.type == "cpu" and peak_rss_bytes() > self.limit:
            raise OutOfMemory(
                self.phase, f"peak RSS {mib(peak_rss_bytes())} MiB is above the --memory-limit of {mib(self.limit)} MiB"
            )
        self.phase = phase

    def run(self, phase: str, fn: Callable[[], Any]) -> Any:
        self(phase)
        try:
            out = fn()
        except torch.OutOfMemoryError as e:
            raise OutOfMemory(self.phase, str(e).splitlines()[0]) from None
        except (MemoryError, RuntimeError) as e:
            if isinstance(e, MemoryError) or "alloc" in str(e).lower():
                raise OutOfMemory(self.phase, str(e).splitlines()[0][:200]) from None
            raise
        self("done")
        return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def _memory(device: torch.device, limit: int | None) -> dict[str, Any]:
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        usable = free + torch.cuda.memory_reserved(device)  # the card's free memory plus what we hold: not the
        reserved = torch.cuda.max_memory_reserved(device)  # CUDA context, NCCL buffers or other processes
        return {
            "kind": "cuda",
            "peak_reserved_mib": mib(reserved),
            "peak_allocated_mib": mib(torch.cuda.max_memory_allocated(device)),
            "num_alloc_retries": torch.cuda.memory_stats(device).get("num_alloc_retries", 0),
            "total_mib": mib(total),
            "usable_mib": mib(usable),
            "headroom_pct": headroom_pct(usable, reserved),
        }
    total = limit or total_memory_bytes()
    peak = peak_rss_bytes()
    return {
        "kind": "cpu",
        "peak_rss_mib": mib(peak),
        "total_mib": mib(total),
        "limit_mib": mib(limit) if limit else None,
        "num_alloc_retries": 0,
        "headroom_pct": headroom_pct(total, peak),
    }


def headroom_pct(usable: int, peak: int) -> float:
    """How much of what this process can use stays free at its peak, in %."""
    return round(100.0 * (usable - peak) / usable, 1) if usable > 0 else 0.0


def preflight(
    cfg: Config,
    steps: int = 10,
    memory_limit: int | None = None,
    progress: Callable[[str], None] = lambda s: None,
    warmup: int = WARMUP_STEPS,
    budget_s: float | None = DEFAULT_BUDGET_S,
    resume: str = "latest",
) -> dict[str, Any]:
    """Measure `cfg`; returns the report (see README's preflight section for the fields): build the
    model, measure steps/eval/save, reduce across ranks, project the run's time from where `train --resume
    RESUME` would start, give the verdict."""
    t = cfg.training
    # where `train --resume` starts (a bad PATH refused as train refuses it); rank 0's alone: it reports, and
    # under torchrun across hosts the checkpoint may be on its host only (train loads it on rank 0)
    start = _resumes_at(cfg, resume) if os.environ.get("RANK", "0") == "0" else 0
    report: dict[str, Any] = {
        "run_name": cfg.run_name,
        "profile": cfg.profile_shown(),
        "batch_size": t.batch_size,
        "grad_accum": t.grad_accum,
        "seq_len": cfg.model.seq_len,
        "warmup_steps": warmup,
        "measured_steps": steps,
    }
    reset_peak_rss()
    dist = Dist.from_env()
    dist.init(cfg.runtime.device)
    setup = engine.build_setup(cfg, dist)
    dev = setup.device
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        torch.cuda.reset_accumulated_memory_stats(dev)  # num_alloc_retries: this preflight's (or probe's) own
    report["environment"] = _environment(cfg, setup)
    started = time.perf_counter()
    try:
        with time_budget(budget_s if dist.world == 1 else None, started):
            m = _measure(cfg, setup, warmup, steps, MemoryWatch(dev, memory_limit), progress, budget_s, started)
    except TooSlow as e:
        report.update(_too_slow(cfg, e, budget_s, dist.world, start))
        return report
    except OutOfMemory as e:
        report.update(verdict="oom", oom_phase=e.phase, oom_detail=e.detail, memory=_memory(dev, memory_limit))
        report["suggestion"] = (
            f"out of memory in {e.phase} at batch_size {t.batch_size}: lower training.batch_size "
            f"(e.g. {max(1, t.batch_size // 2)} with grad_accum {t.grad_accum * 2} keeps the "
            "tokens per step), or run `enlace preflight RUN --max-batch` to find the largest that fits"
        )
        return report
    m["memory"] = _memory(dev, memory_limit)
    report.update(_across_ranks(dist, m))
    report.update(_projection(cfg, m, dist.world, start))
    report.update(_verdict(cfg, report, m))
    return report


def _environment(cfg: Config, setup: engine.TrainingSetup) -> dict[str, Any]:
    dev = setup.device
    return {
        "device": str(dev),
        "device_name": _device_name(dev),
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda if dev.type == "cuda" else None,
        "precision": cfg.runtime.precision,
        "compile": cfg.runtime.compile,
        "deterministic": cfg.runtime.deterministic,
        "threads": torch.get_num_threads(),
        "params": setup.raw_model.num_params(),
        "teacher_params": setup.teacher_info["params"] if setup.teacher_info else None,  # its memory and forward count
    }


def _measure(
    cfg: Config,
    setup: engine.TrainingSetup,
    warmup: int,
    steps: int,
    watch: MemoryWatch,
    progress: Callable[[str], None],
    budget_s: float | None = None,
    started: float = 0.0,
) -> dict[str, Any]:
    """This rank's figures: step times after warm-up (s), fp16 skips, an eval batch, a checkpoint save.
    Raises OutOfMemory naming the phase that did not fit, TooSlow when the steps left project past
    `budget_s` (counted from `started`). The batches are drawn ahead and copied as the run's are (pinned, one
    asynchronous copy on CUDA)."""
    t = cfg.training
    synthetic = SyntheticStream(t.batch_size, cfg.model.seq_len, cfg.runtime.seed)
    with Prefetched(synthetic, setup.device, t.prefetch) as data:
        return _measure_with(cfg, setup, data, warmup, steps, watch, progress, budget_s, started)


def _measure_with(cfg, setup, data, warmup, steps, watch, progress, budget_s, started) -> dict[str, Any]:
    """_measure over `data`, the run's batches as the step takes them."""
    t, dev = cfg.training, setup.device
    eval_data = SyntheticStream(t.eval_batch_size or t.batch_size, cfg.model.seq_len, cfg.runtime.seed + 1)
    m: dict[str, Any] = {"step_times": [], "skipped": [], "nonfinite": 0, "scale": None}
    for i in range(warmup + steps):
        label = "warm-up" if i < warmup else "measure"
        t0 = time.perf_counter()

        def step(i=i):  # the whole step: an OutOfMemoryError from forward or backward is a verdict too
            result = engine.train_step(setup, i, data.next_batch, phase=watch)
            return result, result.loss.item()

        result, loss = watch.run("forward", step)
        _sync(dev)
        dt = time.perf_counter() - t0
        if i >= warmup:
            m["step_times"].append(dt)
            m["skipped"].append(result.skipped)
            m["nonfinite"] += not math.isfinite(loss)
        m["scale"] = result.scale
        progress(f"{label} step {i + 1}/{warmup + steps}: {dt * 1000:.0f} ms, loss {loss:.3f}")
        left = warmup + steps - i - 1
        late = bool(budget_s) and i >= warmup and time.perf_counter() - started + left * dt > budget_s
        # under torchrun all ranks leave at the same step (none waits in a collective); every rank warms up alike
        if i >= warmup and setup.dist.any_rank(late):
            raise TooSlow(time.perf_counter() - started, dt, i + 1)
    t0 = time.perf_counter()
    watch.run("eval", lambda: engine.evaluate(setup, eval_data, 1))
    _sync(dev)
    m["eval_batch_s"] = time.perf_counter() - t0
    progress(f"eval pass: {m['eval_batch_s'] * 1000:.0f} ms per batch")
    with tempfile.TemporaryDirectory(prefix="enlace-preflight-") as tmp:
        state = engine.capture_state(setup, [engine.rank_state(data)], {"step": 0, "tokens": 0}, "preflight")
        t0 = time.perf_counter()
        watch.run("save", lambda: save_checkpoint(Path(tmp), 0, state, keep=1))
        m["save_s"] = time.perf_counter() - t0
        m["ckpt_bytes"] = sum(f.stat().st_size for f in Path(tmp).glob("step-*/*"))
    watch("done")
    progress(f"checkpoint save: {m['save_s']:.2f} s")
    return m


def _too_slow(cfg: Config, e: TooSlow, budget_s: float, world: int, start: int) -> dict[str, Any]:
    """The too_slow verdict: what was measured, what the run would take from step `start`, what to do."""
    t = cfg.training
    run_s = e.step_s * max(0, t.max_steps - start) if e.step_s else None
    if e.step_s:
        what = (
            f"one step takes ≈{e.step_s:.1f} s here, so the run's "
            + (f"{t.max_steps - start} steps left (from step {start})" if start else f"{t.max_steps} steps")
            + f" would take ≈{duration(run_s)}; "
            f"preflight stopped after {e.elapsed_s:.0f} s of its {budget_s:.0f} s budget"
        )
    else:
        what = f"not one step finished within preflight's {budget_s:.0f} s budget"
    fp16_cpu = cfg.runtime.precision == "fp16" and engine.pick_device(cfg.runtime.device).type == "cpu"
    return {
        "verdict": "too_slow",
        "world": world,
        "too_slow": {"budget_s": budget_s, "elapsed_s": round(e.elapsed_s, 1), "step_s": e.step_s, "run_s": run_s},
        "suggestion": what
        + (" — fp16 on a CPU is ≈20x slower: --set runtime.precision=fp32" if fp16_cpu else "")
        + " — on this machine use a smaller run config (e.g. smoke-cpu), or give preflight more time (--budget-s)",
    }


def _across_ranks(dist: Dist, m: dict[str, Any]) -> dict[str, Any]:
    """Under DDP the slowest rank sets the pace, the fullest rank the memory verdict (updates `m`)."""
    if dist.world == 1:
        return {"world": 1}
    everyone = dist.gather({"memory": m["memory"], "step_times": m["step_times"]})
    key = "peak_reserved_mib" if m["memory"]["kind"] == "cuda" else "peak_rss_mib"
    m["memory"] = max((e["memory"] for e in everyone), key=lambda mem: mem[key])
    m["step_times"] = [max(ts) for ts in zip(*(e["step_times"] for e in everyone))]
    per_rank = [
        {"rank": r, key: e["memory"][key], "median_step_s": round(statistics.median(e["step_times"]), 4)}
        for r, e in enumerate(everyone)
    ]
    return {"world": dist.world, "per_rank": per_rank}


def _projection(cfg: Config, m: dict[str, Any], world: int, done: int) -> dict[str, Any]:
    """Throughput, the time the rest of the run (from step `done`) will take, memory, disk and fp16 figures."""
    t, step_times = cfg.training, m["step_times"]
    median, p90 = statistics.median(step_times), sorted(step_times)[max(0, math.ceil(0.9 * len(step_times)) - 1)]
    tokens_per_step = t.batch_size * t.grad_accum * cfg.model.seq_len * world  # global
    todo = max(0, t.max_steps - done)
    n_evals = (todo // t.eval_every if t.eval_every else 0) + 1
    n_saves = (todo // cfg.checkpoint.every if cfg.checkpoint.every else 0) + 1
    # the figure and its words from one number: 0.96 s is "1.0" and "0m01s", never "1.0" beside "0m00s"
    total_s = round(todo * median + n_evals * t.eval_batches * m["eval_batch_s"] + n_saves * m["save_s"], 1)
    free = shutil.disk_usage(_existing(cfg.run_dir)).free
    fp16 = cfg.runtime.precision == "fp16"
    skipped = m["skipped"]
    return {
        "throughput": {
            "median_step_s": round(median, 4),
            "p90_step_s": round(p90, 4),
            "tokens_per_step": tokens_per_step,
            "tokens_per_s": round(tokens_per_step / median, 1),
            "eval_batch_s": round(m["eval_batch_s"], 4),
            "checkpoint_save_s": round(m["save_s"], 3),
            "max_steps": t.max_steps,
            "resumes_at": done,
            "remaining_steps": todo,
            "projected_s": total_s,
            "projected": duration(total_s),
        },
        "memory": m["memory"],
        "disk": {"checkpoint_mib": mib(m["ckpt_bytes"]), "free_mib": mib(free), "ok": free >= 2 * m["ckpt_bytes"]},
        "fp16": {
            "skip_rate": round(sum(skipped) / len(skipped) if skipped else 0.0, 3) if fp16 else "n/a",
            "skips_after_calibration": sum(skipped) if fp16 else "n/a",
            "final_scale": m["scale"] if fp16 else "n/a",
            "nonfinite_losses": m["nonfinite"] if fp16 else "n/a",
        },
    }


def _verdict(cfg: Config, report: dict[str, Any], m: dict[str, Any]) -> dict[str, str]:
    """ok, tight, unstable (fp16) or no_space, with the suggestion that goes with it."""
    mem, disk, skipped = report["memory"], report["disk"], m["skipped"]
    skip_frac = sum(skipped) / len(skipped) if skipped else 0.0
    if not disk["ok"]:
        return {
            "verdict": "no_space",
            "suggestion": f"a checkpoint takes {disk['checkpoint_mib']} MiB and the run needs room for two; "
            f"{disk['free_mib']} MiB are free where runs/ lives — free disk space first",
        }
    if cfg.runtime.precision == "fp16" and (
        skip_frac > UNSTABLE_SKIP_FRACTION or m["nonfinite"] > len(m["step_times"]) // 2
    ):
        return {
            "verdict": "unstable",
            "suggestion": f"fp16 skipped {sum(skipped)} of {len(skipped)} steps after calibration (scale now "
            f"{m['scale']:g}): lower runtime.fp16_init_scale or optim.learning_rate, or use bf16 on a GPU that has it",
        }
    if mem["headroom_pct"] < TIGHT_HEADROOM_PCT or mem["num_alloc_retries"] > 0:
        return {
            "verdict": "tight",
            "suggestion": f"only {mem['headroom_pct']}% memory headroom ({mem['num_alloc_retries']} allocator "
            "retries): a longer sequence or eval spike may not fit — lower training.batch_size",
        }
    return {"verdict": "ok", "suggestion": ""}


def _resumes_at(cfg: Config, resume: str = "latest") -> int:
    """The step `train --resume RESUME` would start from (for latest: the newest complete checkpoint; none:
    0), so that a resumed run is projected for the rest it has to go."""
    ckpt = resolve_resume(cfg.run_dir / "checkpoints", resume)
    return read_manifest(ckpt)["step"] if ckpt else 0


def _existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path
