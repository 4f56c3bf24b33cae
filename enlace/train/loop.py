"""`enlace train RUN`: the training loop, top to bottom.

resolve config → run dir → build setup → resume from `latest` → loop:
    step → log every log_every → eval every eval_every → checkpoint every checkpoint.every
    → on SIGTERM/SIGINT: finish the step, checkpoint, status "stopped", exit 0
→ final eval + checkpoint → status "finished" (or "stopped" for --until)
"""

from __future__ import annotations

import faulthandler
import os
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from enlace.config.schema import Config
from enlace.contract import Status
from enlace.data.streams import build_stream, data_identity
from enlace.errors import CheckpointError, EnlaceError
from enlace.preflight.report import duration
from enlace.server import runs
from enlace.sysinfo import git_commit, hostname, mib, peak_rss_bytes
from enlace.train import engine
from enlace.train.checkpoint import (
    check_free_space,
    checkpoint_bytes,
    incomplete_checkpoints,
    load_checkpoint,
    previous_complete,
    remove_stale_temps,
    resolve_resume,
    save_checkpoint,
    skipped_latest,
)
from enlace.train.dist import Dist
from enlace.train.rundir import RunDir


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


RESUME_HINT = "to resume from another checkpoint: --resume checkpoints/step-N (or --resume none to start afresh)"


def _load_resume(cfg: Config, resume: str, dist: Dist) -> tuple[Any, Any]:
    """Rank 0 finds and loads the checkpoint; under DDP it is broadcast to the other ranks (which,
    on other hosts, have no checkpoints of their own: rank 0 alone writes them)."""
    ckpt = files = None
    if dist.is_main:
        ckpt = resolve_resume(cfg.run_dir / "checkpoints", resume)
        try:
            files = load_checkpoint(ckpt, "cpu") if ckpt is not None else None
        except CheckpointError as e:
            if resume != "latest":
                raise
            prev = previous_complete(cfg.run_dir / "checkpoints", ckpt)
            way = (
                (
                    f"resume from the previous complete checkpoint with --resume checkpoints/{prev.name}, or start "
                    "afresh with --resume none"
                )
                if prev
                else "no older complete checkpoint: --resume none starts afresh"
            )
            raise CheckpointError(f"the newest checkpoint is unusable: {e.message} — {way}") from None
    ckpt, files = dist.broadcast((ckpt, files))
    return ckpt, files  # on the CPU: load_state_dict moves weights and optimizer state to the device


def train(
    cfg: Config, resume: str = "latest", until: int | None = None, allow: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Train `cfg` (resuming by default); returns the final run.json fields."""
    dist = Dist.from_env()
    dist.init(cfg.runtime.device)
    run = RunDir(cfg.run_dir, enabled=dist.is_main)
    # SIGUSR2: every thread's Python stack to stderr (train.log): the supervisor asks before ending a stalled run
    if sys.__stderr__ is not None:  # the process's own fd 2, also where a test harness swapped sys.stderr
        faulthandler.register(signal.SIGUSR2, file=sys.__stderr__, all_threads=True)
    stop = StopSignal(on_second=lambda name: run.update_status(status=Status.STOPPED, exit_code=128, signal=name))
    try:
        summary = _train(cfg, run, dist, stop, resume, until, allow)
        # Every rank waits here until rank 0 has written its last checkpoint: a rank that
        # tore gloo down while its peer was still busy died with SIGABRT (seen under load).
        dist.barrier()
        return summary
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
    cfg: Config, run: RunDir, dist: Dist, stop: StopSignal, resume: str, until: int | None, allow: frozenset[str]
):
    t = cfg.training
    commit = git_commit(cfg.root)
    run.freeze_config(cfg.to_dict())
    if dist.is_main:
        remove_stale_temps(run.checkpoints)
        runs.record_self(
            run.path,
            run_name=cfg.run_name,
            run_file=Path(cfg.files["run"]).stem,  # what `launch RUN_NAME` resumes it from
            status=Status.STARTING,
            phase="building the model",
            commit=commit,
            host=hostname(),
            torch=str(torch.__version__),
            max_steps=t.max_steps,
            exit_code=None,
            error=None,
            launch_id=os.environ.get("ENLACE_LAUNCH_ID"),
            overrides=list(cfg.overrides),
            fingerprint=cfg.fingerprint_fields(),  # what its checkpoints will need (config.resume_problem)
            data=None,
        )

    setup = engine.build_setup(cfg, dist)
    if dist.is_main:  # two more checkpoints must fit: one being written beside the newest
        check_free_space(run.checkpoints, checkpoint_bytes(run.checkpoints, setup.settings["params"]))
    run.phase("opening the data")
    data_id = data_identity(cfg)
    run.update_status(data=data_id)
    train_stream = build_stream(cfg, "train", t.batch_size, dist.rank, dist.world)
    val_stream = build_stream(cfg, "val", t.eval_batch_size or t.batch_size)
    progress = {"step": 0, "tokens": 0}
    run.phase("loading the checkpoint")
    ckpt, files = _load_resume(cfg, resume, dist)
    if ckpt is not None:
        trainer = engine.restore_state(setup, files, train_stream, str(ckpt), data_id, allow)
        progress = {"step": trainer["step"], "tokens": trainer["tokens"]}
        if setup.schedule_steps != t.max_steps and dist.is_main:
            end, o = setup.schedule_steps, cfg.optim
            extra = f"; steps {end + 1}-{t.max_steps} train at min_lr" if t.max_steps > end else ""
            run.log(
                f"training.max_steps is {t.max_steps}, the run started with {end}: the learning rate keeps the "
                f"run's schedule (cosine to min_lr {o.min_lr:g} at step {end}){extra} — to stretch the "
                "schedule instead, start afresh with --resume none"
            )

    target = min(until or t.max_steps, t.max_steps)
    tokens_per_step = t.batch_size * t.grad_accum * cfg.model.seq_len * dist.world
    s = setup.settings
    run.log(
        f"run {cfg.run_name} | commit {commit[:12]} | {s['params'] / 1e6:.2f}M params | {s['device']} "
        f"{s['precision']} | compile {s['compile']} | deterministic {s['deterministic']} | threads "
        f"{s['threads']} | world {dist.world} | {tokens_per_step} tokens/step"
    )
    for warning in cfg.warnings:
        run.log(f"warning: {warning}")
    if setup.teacher_info:
        d, info = cfg.distill, setup.teacher_info
        run.log(
            f"distilling from {info['checkpoint']} ({info['params'] / 1e6:.2f}M params, MANIFEST sha256 "
            f"{info['identity'][:12]}): alpha {d.alpha}, temperature {d.temperature}"
        )
    if ckpt is not None:
        shown = ckpt.relative_to(cfg.run_dir) if ckpt.is_relative_to(cfg.run_dir) else ckpt
        run.log(f"resumed from {shown} at step {progress['step']} ({progress['tokens']} tokens seen)")
    if resume == "latest" and (skipped := skipped_latest(run.checkpoints, ckpt)):
        run.log(f"warning: {skipped} — {RESUME_HINT}")
    if ckpt is None:
        for problem in incomplete_checkpoints(run.checkpoints) if resume == "latest" else ():
            run.log(f"ignored (not a complete checkpoint): {problem}")
        run.log(
            "no complete checkpoint: starting from step 0"
            if resume == "latest"
            else f"starting from step 0 (--resume {resume})"
        )
        run.phase("evaluating the untrained model")
        _eval(run, setup, val_stream, 0)  # the baseline the final eval is compared with
    if progress["step"] >= target:
        run.log(
            f"nothing to train: at step {progress['step']} of {t.max_steps}"
            + (f" (--until {until})" if until else "")
            + " — raise training.max_steps to train further"
        )
    run.enter(
        Status.RUNNING,
        phase="training",
        step=progress["step"],
        resumed_from=ckpt.name if ckpt else None,
        started_at=time.time(),
    )
    run.open_sinks(cfg, progress["step"])
    run.metric(
        {
            "kind": "start",
            "step": progress["step"],
            "resumed_from": ckpt.name if ckpt else None,
            "params": s["params"],
            "time": time.time(),
        }
    )  # plot marks resumes with it

    def checkpoint() -> str:
        states = dist.gather(engine.rank_state(train_stream))
        if not dist.is_main:
            return ""
        run.beat(force=True)
        path = save_checkpoint(
            run.checkpoints,
            progress["step"],
            engine.capture_state(setup, states, progress, commit, data_id),
            cfg.checkpoint.keep,
        )
        run.beat(force=True)
        run.log(f"checkpoint {path.name} saved")
        return path.name

    step_times: list[float] = []  # seconds per optimizer step, eval and checkpoint excluded
    last_saved = progress["step"] if ckpt is not None else -1
    last_eval = -1
    interval_s, interval_tokens = 0.0, 0  # since the last log line
    t_run = time.perf_counter()
    while progress["step"] < target:
        t0 = time.perf_counter()
        result = engine.train_step(setup, progress["step"], train_stream.next_batch)
        progress["step"] += 1
        progress["tokens"] += tokens_per_step
        step = progress["step"]
        run.beat()
        # the first step of every start is logged too: launch waits for it (also with a large log_every)
        logging = step % t.log_every == 0 or step == target or len(step_times) == 0
        loss = result.loss.item() if logging else 0.0  # .item() syncs the device: step times are real
        step_times.append(time.perf_counter() - t0)
        interval_s += step_times[-1]
        interval_tokens += tokens_per_step
        if logging:
            rate = interval_tokens / max(interval_s, 1e-9)
            elapsed = time.perf_counter() - t_run
            eta = elapsed / len(step_times) * (t.max_steps - step)  # at this start's pace, evals and saves included
            run.log(
                f"step {step:6d}/{t.max_steps} | loss {loss:.4f} | lr {result.lr:.3e} | "
                f"{rate:8.0f} tok/s | {elapsed:7.1f}s | {100 * step / t.max_steps:5.1f}% | ETA {duration(eta)}"
                + (" | skipped (fp16 overflow)" if result.skipped else "")
            )
            terms = {k: v.item() for k, v in result.terms.items()}  # distillation: ce and kd
            if terms:
                run.log(f"           ce {terms['ce']:.4f} | kd {terms['kd']:.4f}")
            run.metric(
                {
                    "kind": "train",
                    "step": step,
                    "loss": loss,
                    "lr": result.lr,
                    "tokens": progress["tokens"],
                    "tokens_per_s": rate,
                    "elapsed_s": elapsed,
                    "scale": result.scale,
                    "skipped": result.skipped,
                    **({"grad_norm": result.grad_norm.item()} if result.grad_norm is not None else {}),
                    **terms,
                }
            )
            run.update_status(step=step, loss=loss, tokens_per_s=rate, tokens=progress["tokens"])
            interval_s, interval_tokens = 0.0, 0
        if t.eval_every and step % t.eval_every == 0:
            _eval(run, setup, val_stream, step)
            last_eval = step
        if dist.any_rank(stop.signame is not None):
            run.log(f"{stop.signame or 'stop'} received: finishing at step {step}")
            checkpoint()
            run.update_status(status=Status.STOPPED, exit_code=0, step=step)
            return _summary(run, step, step_times, tokens_per_step, Status.STOPPED)
        if cfg.checkpoint.every and step % cfg.checkpoint.every == 0:
            last_saved = step
            checkpoint()

    step = progress["step"]
    if last_eval != step:
        _eval(run, setup, val_stream, step)
    if last_saved != step:
        checkpoint()
    status = Status.FINISHED if step >= t.max_steps else Status.STOPPED
    if until is not None and step < t.max_steps:
        run.log(f"--until {until}: stopping at step {step} of {t.max_steps}")
    run.update_status(status=status, exit_code=0, step=step)
    return _summary(run, step, step_times, tokens_per_step, status)


def _eval(run: RunDir, setup: engine.TrainingSetup, val_stream, step: int) -> None:
    ev = engine.evaluate(setup, val_stream, setup.cfg.training.eval_batches, run.beat)
    run.log(f"eval {step:6d} | val_loss {ev['val_loss']:.4f} | val_bpb {ev['val_bpb']:.4f}")
    run.metric({"kind": "eval", "step": step, **ev})
    run.update_status(val_loss=ev["val_loss"], val_bpb=ev["val_bpb"])


def _summary(run: RunDir, step: int, step_times: list[float], tokens_per_step: int, status: Status) -> dict[str, Any]:
    """Peak memory and steady-state throughput (median step time, first 3 steps excluded)."""
    steady = step_times[3:] or step_times
    median = statistics.median(steady) if steady else 0.0
    record = {
        "kind": "summary",
        "status": str(status),
        "step": step,
        "steps": len(step_times),
        "median_step_s": median,
        "tokens_per_s": tokens_per_step / median if median else 0.0,
        "peak_rss_mib": mib(peak_rss_bytes()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        record["cuda_max_reserved_mib"] = mib(torch.cuda.max_memory_reserved())
    run.metric(record)
    run.log(f"done ({status}): {record['tokens_per_s']:.0f} tok/s median, peak RSS {record['peak_rss_mib']} MiB")
    run.update_status(peak_rss_mib=record["peak_rss_mib"], median_tokens_per_s=record["tokens_per_s"])
    return record
