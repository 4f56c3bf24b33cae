"""`enlace preflight RUN --max-batch`: the largest batch_size that fits, found by short preflights
(probes) aimed where the memory curve reaches the cap. On CPU each probe is a child forked from a
process that has already imported torch, so a probe costs its steps, not an interpreter start."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from enlace.config.schema import Config, load_config
from enlace.errors import EnlaceError
from enlace.preflight.measure import WARMUP_STEPS, preflight
from enlace.train import engine

PROBE_MODULES = ["torch", "enlace.config.schema", "enlace.preflight.measure", "enlace.preflight.maxbatch"]


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
    warmup = WARMUP_STEPS if cfg.runtime.precision == "fp16" else 1
    return preflight(cfg, 1, memory_limit, warmup=warmup, budget_s=None)


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
    # aimed at what this run may use: on a GPU the free memory plus its own (others' processes hold the rest)
    total_mib = measured["memory"].get("usable_mib") or measured["memory"]["total_mib"]
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
