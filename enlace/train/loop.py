"""`enlace train RUN`: the training loop, top to bottom.

begin (enlace/train/begin.py: record, build, open the data, resume from `latest`) → loop:
    step → log every log_every → eval every eval_every → checkpoint every checkpoint.every (saving.py)
    → on SIGTERM/SIGINT: finish the step, checkpoint, status "stopped", exit 0
→ final eval + checkpoint → status "finished" (or "stopped" for --until)
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import statistics
import sys
import time
import traceback
from typing import Any

import torch

from enlace import contract
from enlace.config.schema import Config
from enlace.contract import Status
from enlace.errors import EnlaceError, OutOfMemory
from enlace.sysinfo import mib, peak_rss_bytes
from enlace.train import engine
from enlace.train.begin import Start, begin
from enlace.train.checkpoint import resolve_resume
from enlace.train.dist import Dist
from enlace.train.rundir import RunDir
from enlace.train.saving import Saver
from enlace.units import duration


class StopSignal:
    """The first SIGTERM/SIGINT asks the loop to stop after this step (checkpoint, exit 0). A later
    SIGINT (Ctrl-C again) exits at once; a repeated SIGTERM is the same request again, not an
    escalation: under Slurm the trainer can get one from slurmd, one from its batch step and one
    from torchrun for a single stop (their escalation is SIGKILL, after a grace period).

    Exiting at once is safe: a checkpoint becomes visible only by an atomic rename."""

    def __init__(self, on_second):
        self.signame: str | None = None
        self._on_second = on_second
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        if self.signame is not None:
            if signum == signal.SIGTERM:
                return
            self._on_second(signal.Signals(signum).name)
            os._exit(128 + signum)
        self.signame = signal.Signals(signum).name

    def restore(self) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)


def train(
    cfg: Config, resume: str = "latest", until: int | None = None, allow: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Train `cfg` (resuming by default); returns the final run.json fields."""
    if resume not in ("latest", "none"):  # refused before the run's directory is made (it was left half-written)
        resolve_resume(cfg.run_dir / "checkpoints", resume)
    dist = Dist.from_env()
    dist.init(cfg.runtime.device)
    run = RunDir(cfg.run_dir, enabled=dist.is_main)
    # SIGUSR2: every thread's Python stack to stderr (train.log): the supervisor asks before ending a stalled run
    if sys.__stderr__ is not None:  # the process's own fd 2, also where a test harness swapped sys.stderr
        faulthandler.register(signal.SIGUSR2, file=sys.__stderr__, all_threads=True)
    stop = StopSignal(on_second=lambda name: run.update_status(status=Status.STOPPED, exit_code=128, signal=name))
    try:
        with contextlib.ExitStack() as closing:  # the prefetch thread ends before the process does
            summary = _train(cfg, run, dist, stop, resume, until, allow, closing)
        # Every rank waits here until rank 0 has written its last checkpoint: a rank that
        # tore gloo down while its peer was still busy died with SIGABRT (seen under load).
        dist.barrier()
        return summary
    except torch.OutOfMemoryError as e:  # a verdict, not a crash: the same batch fails the same way on restart
        t = cfg.training
        message = (
            f"out of memory at batch_size {t.batch_size} (seq_len {cfg.model.seq_len}, {cfg.runtime.precision}): "
            f"{str(e).splitlines()[0][:160]} — try --set training.batch_size={max(1, t.batch_size // 2)} (with "
            f"training.grad_accum={t.grad_accum * 2} for the same tokens per step), or find the largest that fits: "
            f"enlace-remote preflight {cfg.run_name} --max-batch"
        )
        run.log(f"error: {message}")
        _record_failure(run, contract.OOM, message)
        raise OutOfMemory(message) from None
    except EnlaceError as e:
        run.log(f"error: {e.message}")
        _record_failure(run, e.exit_code, e.message)
        raise
    except BaseException as e:
        run.log("crashed:\n" + traceback.format_exc())
        _record_failure(run, 1, f"{type(e).__name__}: {e}")
        raise
    finally:
        stop.restore()
        run.close()
        dist.close()


def _record_failure(run: RunDir, exit_code: int, error: str) -> None:
    try:
        run.update_status(status=Status.FAILED, exit_code=exit_code, error=error)
    except OSError as e:  # e.g. still no space: status then reads `crashed`, and stderr has the error
        print(f"cannot record the failure in run.json ({e.strerror}): {error}", file=sys.stderr, flush=True)


def _train(
    cfg: Config,
    run: RunDir,
    dist: Dist,
    stop: StopSignal,
    resume: str,
    until: int | None,
    allow: frozenset[str],
    closing: contextlib.ExitStack,
):
    t = cfg.training
    start = begin(cfg, run, dist, resume, allow)
    closing.callback(start.train_stream.close)
    setup, progress = start.setup, start.progress
    if start.resumed_from is None:
        run.phase("evaluating the untrained model")
        _eval(run, setup, start.val_stream, 0)  # the baseline the final eval is compared with
    target = min(until or t.max_steps, t.max_steps)
    run.update_status(until=target if target < t.max_steps else None)  # where this start stops: status's ETA
    if progress["step"] >= target:  # (--until behind the step: raising max_steps, as it said, changed nothing)
        behind = until is not None and until < t.max_steps and progress["step"] < t.max_steps
        run.log(
            f"nothing to train: at step {progress['step']} of {t.max_steps}"
            + (f" (--until {until})" if until else "")
            + (
                f" — give --until above {progress['step']}, or none"
                if behind
                else " — raise training.max_steps to train further"
            )
        )
    _enter_training(cfg, run, start)
    saver, meter, last_eval = Saver(cfg, run, dist, start), Meter(start.tokens_per_step), -1
    while progress["step"] < target:
        t0 = time.perf_counter()
        with run.beating() if meter.steps == 0 else contextlib.nullcontext():  # a start's first step: compile
            result = engine.train_step(setup, progress["step"], start.train_stream.next_batch)
        progress["step"] += 1
        progress["tokens"] += start.tokens_per_step
        step = progress["step"]
        run.beat()
        # the first step of every start is logged too: launch waits for it (also with a large log_every)
        logging = step % t.log_every == 0 or step == target or meter.steps == 0
        loss = result.loss.item() if logging else 0.0  # .item() syncs the device: step times are real
        meter.add(time.perf_counter() - t0)
        if logging:
            _log_step(run, t.max_steps, step, loss, result, meter, progress["tokens"])
        if t.eval_every and step % t.eval_every == 0:
            _eval(run, setup, start.val_stream, step)
            last_eval = step
        if dist.any_rank(stop.signame is not None):
            run.log(f"{stop.signame or 'stop'} received: finishing at step {step}")
            saver.save()
            run.update_status(
                status=Status.STOPPED, exit_code=0, step=step, start_trained_s=time.perf_counter() - meter.started
            )
            return _summary(run, step, meter, Status.STOPPED)
        if saver.due(step):
            saver.save()

    step = progress["step"]
    if last_eval != step:
        _eval(run, setup, start.val_stream, step)
    saver.save_unless_saved()
    status = Status.FINISHED if step >= t.max_steps else Status.STOPPED
    if until is not None and step < t.max_steps:
        run.log(f"--until {until}: stopping at step {step} of {t.max_steps}")
    run.update_status(status=status, exit_code=0, step=step, start_trained_s=time.perf_counter() - meter.started)
    return _summary(run, step, meter, status)


def _enter_training(cfg: Config, run: RunDir, start: Start) -> None:
    """run.json says running (with where this start stands), the metric sinks open, and a `start` record marks
    it in metrics.jsonl (plot marks resumes with it)."""
    step = start.progress["step"]
    resumed = start.resumed_from.name if start.resumed_from else None
    before = run.trained_before() if resumed else 0.0  # a fresh start (--resume none) counts from zero
    run.enter(
        Status.RUNNING,
        phase="training",
        step=step,
        resumed_from=resumed,
        started_at=time.time(),
        start_step=step,  # launch's wait ends at a step past it (a resumed run entered at its checkpoint's step)
        trained_before_s=before,
        start_trained_s=0.0,
    )
    run.open_sinks(cfg, step)
    params = start.setup.settings["params"]
    run.metric({"kind": "start", "step": step, "resumed_from": resumed, "params": params, "time": time.time()})


class Meter:
    """Seconds per optimizer step (eval and checkpoint excluded), and the tokens/s since the last log line."""

    def __init__(self, tokens_per_step: int):
        self.tokens_per_step = tokens_per_step
        self.step_times: list[float] = []
        self.started = time.perf_counter()
        self.interval_s, self.interval_tokens = 0.0, 0

    @property
    def steps(self) -> int:
        return len(self.step_times)

    def add(self, seconds: float) -> None:
        self.step_times.append(seconds)
        self.interval_s += seconds
        self.interval_tokens += self.tokens_per_step

    def take_rate(self) -> float:
        """Tokens per second since the last call (the log line's figure)."""
        rate = self.interval_tokens / max(self.interval_s, 1e-9)
        self.interval_s, self.interval_tokens = 0.0, 0
        return rate


def _log_step(run: RunDir, max_steps: int, step: int, loss: float, result, meter: Meter, tokens: int) -> None:
    """A step's line in train.log, its record in metrics.jsonl (and the sinks), its fields in run.json."""
    rate, elapsed = meter.take_rate(), time.perf_counter() - meter.started
    eta = elapsed / meter.steps * (max_steps - step)  # at this start's pace, evals and saves included
    run.log(
        f"step {step:6d}/{max_steps} | loss {loss:.4f} | lr {result.lr:.3e} | "
        f"{rate:8.0f} tok/s | {elapsed:7.1f}s | {100 * step / max_steps:5.1f}% | ETA {duration(eta)}"
        + (" | skipped (fp16 overflow)" if result.skipped else "")
    )
    terms = {k: v.item() for k, v in result.terms.items()}  # distillation: ce and kd
    if terms:
        run.log(f"           ce {terms['ce']:.4f} | kd {terms['kd']:.4f}")
    grad_norm = {"grad_norm": result.grad_norm.item()} if result.grad_norm is not None else {}
    run.metric(
        {
            "kind": "train",
            "step": step,
            "loss": loss,
            "lr": result.lr,
            "tokens": tokens,
            "tokens_per_s": rate,
            "elapsed_s": elapsed,
            "scale": result.scale,
            "skipped": result.skipped,
            **grad_norm,
            **terms,
        }
    )
    run.update_status(step=step, loss=loss, tokens_per_s=rate, tokens=tokens, start_trained_s=elapsed)


def _eval(run: RunDir, setup: engine.TrainingSetup, val_stream, step: int) -> None:
    ev = engine.evaluate(setup, val_stream, setup.cfg.training.eval_batches, run.beat)
    run.log(f"eval {step:6d} | val_loss {ev['val_loss']:.4f} | val_bpb {ev['val_bpb']:.4f}")
    run.metric({"kind": "eval", "step": step, **ev})
    run.update_status(val_loss=ev["val_loss"], val_bpb=ev["val_bpb"])


def _summary(run: RunDir, step: int, meter: Meter, status: Status) -> dict[str, Any]:
    """Peak memory and steady-state throughput (median step time, first 3 steps excluded)."""
    steady = meter.step_times[3:] or meter.step_times
    median = statistics.median(steady) if steady else 0.0
    record = {
        "kind": "summary",
        "status": str(status),
        "step": step,
        "steps": meter.steps,
        "median_step_s": median,
        "tokens_per_s": meter.tokens_per_step / median if median else 0.0,
        "peak_rss_mib": mib(peak_rss_bytes()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        record["cuda_max_reserved_mib"] = mib(torch.cuda.max_memory_reserved())
    run.metric(record)
    run.log(f"done ({status}): {record['tokens_per_s']:.0f} tok/s median, peak RSS {record['peak_rss_mib']} MiB")
    run.update_status(peak_rss_mib=record["peak_rss_mib"], median_tokens_per_s=record["tokens_per_s"])
    return record
