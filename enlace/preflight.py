"""`enlace preflight RUN`: does the batch fit, how long will the run take, does fp16 hold?

Builds model, optimizer, scaler, precision, compile and determinism through engine.build_setup —
the functions `train` uses — and swaps only the data source for synthetic bytes of the configured
shape. Phases: warm-up steps (optimizer state is created lazily; compile and cuDNN autotune happen
early), measured steps, one eval pass at the eval batch size, one checkpoint save into a temp dir.
"""

from __future__ import annotations

import math
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from enlace import engine
from enlace.checkpoint import save_checkpoint
from enlace.config import Config, load_config
from enlace.dist import Dist
from enlace.errors import EnlaceError
from enlace.sysinfo import mib, peak_rss_bytes, reset_peak_rss, total_memory_bytes

WARMUP_STEPS = 3  # also the fp16 calibration window: skips here are the scaler finding its scale
TIGHT_HEADROOM_PCT = 10.0
UNSTABLE_SKIP_FRACTION = 0.2  # of measured (post-calibration) steps


class OutOfMemory(Exception):
    def __init__(self, phase: str, detail: str):
        super().__init__(f"{phase}: {detail}")
        self.phase, self.detail = phase, detail


class SyntheticStream:
    """Random bytes of the configured shape: no corpus needed."""

    def __init__(self, batch_size: int, seq_len: int, seed: int):
        self.shape, self.g = (batch_size, seq_len + 1), torch.Generator().manual_seed(seed)

    def next_batch(self):
        buf = torch.randint(0, 256, self.shape, generator=self.g)
        return buf[:, :-1], buf[:, 1:]

    def batch_at(self, k: int):
        return self.next_batch()

    def state_dict(self) -> dict:
        return {"version": 1, "kind": "synthetic"}


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
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def _memory(device: torch.device, limit: int | None) -> dict[str, Any]:
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        reserved = torch.cuda.max_memory_reserved(device)
        return {
            "kind": "cuda",
            "peak_reserved_mib": mib(reserved),
            "peak_allocated_mib": mib(torch.cuda.max_memory_allocated(device)),
            "num_alloc_retries": torch.cuda.memory_stats(device).get("num_alloc_retries", 0),
            "total_mib": mib(total),
            "headroom_pct": round(100.0 * (total - reserved) / total, 1),
        }
    total = limit or total_memory_bytes()
    peak = peak_rss_bytes()
    return {
        "kind": "cpu",
        "peak_rss_mib": mib(peak),
        "total_mib": mib(total),
        "limit_mib": mib(limit) if limit else None,
        "num_alloc_retries": 0,
        "headroom_pct": round(100.0 * (total - peak) / total, 1),
    }


def _hours(seconds: float) -> str:
    minutes = round(seconds / 60)
    text = f"{minutes // 60}h {minutes % 60:02d}m"
    return f"{text} ({seconds:.0f} s)" if seconds < 600 else text


def preflight(
    cfg: Config,
    steps: int = 10,
    memory_limit: int | None = None,
    progress: Callable[[str], None] = lambda s: None,
    warmup: int = WARMUP_STEPS,
) -> dict[str, Any]:
    """Measure `cfg`; returns the report (see README's preflight section for the fields): build the
    model, measure steps/eval/save, reduce across ranks, project the run's time, give the verdict."""
    t = cfg.training
    report: dict[str, Any] = {
        "run_name": cfg.run_name,
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
    report["environment"] = _environment(cfg, setup)
    try:
        m = _measure(cfg, setup, warmup, steps, MemoryWatch(dev, memory_limit), progress)
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
    report.update(_projection(cfg, m, dist.world))
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
) -> dict[str, Any]:
    """This rank's figures: step times after warm-up (s), fp16 skips, an eval batch, a checkpoint save.
    Raises OutOfMemory naming the phase that did not fit."""
    t, dev = cfg.training, setup.device
    data = SyntheticStream(t.batch_size, cfg.model.seq_len, cfg.runtime.seed)
    eval_data = SyntheticStream(t.eval_batch_size or t.batch_size, cfg.model.seq_len, cfg.runtime.seed + 1)
    m: dict[str, Any] = {"step_times": [], "skipped": [], "nonfinite": 0, "scale": None}
    for i in range(warmup + steps):
        label = "warm-up" if i < warmup else "measure"
        t0 = time.perf_counter()
        result = engine.train_step(setup, i, data.next_batch, phase=watch)
        loss = watch.run("optimizer step", result.loss.item)
        _sync(dev)
        dt = time.perf_counter() - t0
        if i >= warmup:
            m["step_times"].append(dt)
            m["skipped"].append(result.skipped)
            m["nonfinite"] += not math.isfinite(loss)
        m["scale"] = result.scale
        progress(f"{label} step {i + 1}/{warmup + steps}: {dt * 1000:.0f} ms, loss {loss:.3f}")
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


def _projection(cfg: Config, m: dict[str, Any], world: int) -> dict[str, Any]:
    """Throughput, the time the rest of the run will take, memory, disk and fp16 figures."""
    t, step_times = cfg.training, m["step_times"]
    median, p90 = statistics.median(step_times), sorted(step_times)[max(0, math.ceil(0.9 * len(step_times)) - 1)]
    tokens_per_step = t.batch_size * t.grad_accum * cfg.model.seq_len * world  # global
    done = _resumes_at(cfg)  # a resumed run only has the rest to go
    todo = max(0, t.max_steps - done)
    n_evals = (todo // t.eval_every if t.eval_every else 0) + 1
    n_saves = (todo // cfg.checkpoint.every if cfg.checkpoint.every else 0) + 1
    total_s = todo * median + n_evals * t.eval_batches * m["eval_batch_s"] + n_saves * m["save_s"]
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
            "projected_s": round(total_s, 1),
            "projected": _hours(total_s),
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


def _resumes_at(cfg: Config) -> int:
    """The step `train` would resume from (its newest complete checkpoint), 0 for a fresh run."""
    from enlace.checkpoint import latest_checkpoint, read_manifest

    ckpt = latest_checkpoint(cfg.run_dir / "checkpoints")
    return read_manifest(ckpt)["step"] if ckpt else 0


def _existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


PROBE_MODULES = ["torch", "enlace.config", "enlace.preflight"]


def start_probe_server(cfg: Config) -> None:
    """On CPU, start the process --max-batch probes fork from now (it imports torch while this one
    measures). A fork of a process that has run torch's OpenMP threads hangs, so the probes fork from
    this clean one, never from us."""
    if _probes_fork(cfg):
        from multiprocessing import forkserver

        _probe_context()
        forkserver.ensure_running()


def _probe_context():
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PROBE_MODULES)
    return ctx


def _probes_fork(cfg: Config) -> bool:
    return engine.pick_device(cfg.runtime.device).type == "cpu"


def _probe_preflight(run: str, overrides: list[str], root: Path, memory_limit: int | None) -> dict[str, Any]:
    """A probe's preflight: 1 warm-up step and 1 measured (step 2 holds activations, gradients and the
    optimizer state the first step created: the peak), but fp16's whole calibration window, in which
    a skipped step creates no optimizer state yet."""
    cfg = load_config(run, overrides, root)
    return preflight(cfg, 1, memory_limit, warmup=WARMUP_STEPS if cfg.runtime.precision == "fp16" else 1)


def _probe_in_child(run: str, overrides: list[str], root: Path, memory_limit: int | None, conn) -> None:
    try:
        conn.send(_probe_preflight(run, overrides, root, memory_limit))
    except EnlaceError as e:
        conn.send({"error": e.message})
    except Exception as e:
        conn.send({"error": f"{type(e).__name__}: {e}"})
    conn.close()


def probe(cfg: Config, run: str, overrides: list[str], memory_limit: int | None) -> dict[str, Any]:
    """One --max-batch probe: a short preflight of `overrides` (see _probe_preflight). On CPU in a
    child forked from the probe server (torch already imported: the probe costs its steps, not an
    interpreter), so its allocator and peak RSS are its own and the kernel's OOM killer takes only it.
    On CUDA in this process (CUDA cannot be forked), the cache emptied after it."""
    if not _probes_fork(cfg):
        rep = _probe_preflight(run, overrides, cfg.root, memory_limit)
        import gc

        gc.collect()
        torch.cuda.empty_cache()
        return rep
    ctx = _probe_context()
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_probe_in_child, args=(run, overrides, cfg.root, memory_limit, send), daemon=True)
    child.start()
    send.close()
    try:
        rep = recv.recv()
    except EOFError:  # died without an answer
        rep = None
    child.join()
    if rep is None:
        if child.exitcode is not None and child.exitcode < 0:
            return {"verdict": "oom"}  # killed by a signal: the kernel's OOM killer
        rep = {"error": f"the probe exited {child.exitcode} without an answer"}
    return rep


def find_max_batch(
    cfg: Config,
    run: str,
    overrides: list[str],
    memory_limit: int | None,
    measured: dict[str, Any],
    progress: Callable[[str], None],
    cap: int = 4096,
) -> dict[str, Any]:
    """Largest batch_size that fits, to 1 below 64 and above to a multiple of 8 within 3-6 % (what
    kernels like; a 217 instead of 216, or 862 instead of 832, is not worth another probe near the
    boundary, where each costs the most). `measured` is the configured batch's preflight
    report (not probed again). Each probe (see probe) aims where the two largest fitting batches'
    peaks, extrapolated, reach the memory cap (weights and optimizer state are fixed, activations
    grow per sample), bounded by doubling and by the largest fit and smallest failure so far; after
    a wrong aim it bisects once. Near the boundary the probes are the expensive ones: aiming spares
    most of them."""
    t0 = time.perf_counter()

    def fits(b: int) -> dict[str, Any]:
        rep = probe(cfg, run, [*overrides, f"training.batch_size={b}"], memory_limit)
        if "error" in rep:  # not an OOM but a failure (config, import): say so, do not guess
            raise EnlaceError(f"--max-batch probe at batch_size {b} failed: {rep['error']}")
        ok = rep["verdict"] != "oom"
        progress(f"max-batch probe: batch_size {b} {'fits' if ok else 'does not fit'}")
        return rep if ok else {}

    b0 = cfg.training.batch_size
    lo, hi, good_rep, fitted, probes, last = 0, b0, {}, [], 0, "plain"
    if measured["verdict"] != "oom":
        lo, hi, good_rep, fitted = b0, None, measured, [(b0, _peak_mib(measured))]
    total_mib = measured["memory"]["total_mib"]
    while (lo < cap) if hi is None else (hi - lo > _resolution(lo)):
        b, kind = _next_probe(lo, hi, fitted, total_mib, cap, last)
        rep, probes = fits(b), probes + 1
        if rep:
            lo, good_rep = b, rep
            fitted.append((b, _peak_mib(rep)))
        else:
            hi = b
        last = kind if rep else "plain"  # an aimed fit is confirmed one step up; a miss bisects once
    tps = good_rep.get("throughput", {}).get("tokens_per_s", 0.0) if good_rep else 0.0
    return {
        "batch_size": lo,
        "first_failing": hi,
        "tokens_per_s": tps,
        "probes": probes,
        "resolution": _resolution(lo),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _peak_mib(report: dict[str, Any]) -> float:
    mem = report["memory"]
    return mem["peak_reserved_mib"] if mem["kind"] == "cuda" else mem["peak_rss_mib"]


def _resolution(lo: int) -> int:
    """1 below 64; above, a power of two from 8, 1/16 to 1/32 of lo (512: 32, 1024: 64)."""
    return 1 if lo < 64 else max(8, 1 << (lo.bit_length() - 5))


def _next_probe(
    lo: int, hi: int | None, fitted: list[tuple[int, float]], total_mib: float, cap: int, last: str
) -> tuple[int, str]:
    """The next batch to probe, strictly between lo (fits) and hi (does not; None: none failed yet),
    and what kind of probe it is: "confirm" one step above an aimed fit, "aimed" where the two
    largest fits' peaks extrapolate to the cap, else "plain" doubling or bisection."""
    top = min(2 * lo, cap) if hi is None else hi - 1
    step = _resolution(lo)
    if last == "aimed":
        return min(lo + step, top), "confirm"
    if last != "confirm" and len(fitted) >= 2:
        (b1, m1), (b2, m2) = sorted(fitted)[-2:]
        per_sample = (m2 - m1) / (b2 - b1)
        if per_sample > 0:
            guess = int(b2 + (total_mib - m2) / per_sample)
            guess -= guess % _resolution(guess)
            if lo < guess <= top:
                return guess, "aimed"
    if hi is None:
        return top, "plain"
    return max(lo + step, (lo + hi) // 2 // step * step), "plain"  # hi - lo > step: below hi
