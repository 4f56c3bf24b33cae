"""How a training start begins, before its first step: the trainer records itself in run.json, builds the
model and optimizer, opens the data, loads the checkpoint it resumes from, says all of it in train.log, and
(on a fresh start) evaluates the untrained model as the baseline. What it hands the loop is a `Start`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from enlace.config.schema import Config
from enlace.contract import LAUNCH_ID_ENV, Status
from enlace.data.prefetch import Prefetched
from enlace.data.streams import build_stream, data_identity
from enlace.errors import AlreadyRunning, CheckpointError
from enlace.manifest import incomplete_checkpoints, latest_checkpoint, skipped_latest
from enlace.state import runs
from enlace.sysinfo import git_commit, hostname
from enlace.train import engine
from enlace.train.checkpoint import (
    check_free_space,
    checkpoint_bytes,
    load_checkpoint,
    previous_complete,
    remove_stale_temps,
    resolve_resume,
    start_line,
)
from enlace.train.dist import Dist
from enlace.train.rundir import RunDir

RESUME_HINT = "to resume from another checkpoint: --resume checkpoints/step-N (or --resume none to start afresh)"


@dataclass
class Start:
    """What the loop trains from: the setup, the two streams, where it stands and what it resumed from."""

    setup: engine.TrainingSetup
    train_stream: Any
    val_stream: Any
    progress: dict[str, int]  # {"step", "tokens"}: what the run has done so far (the checkpoint's, or 0)
    resumed_from: Path | None
    commit: str
    data_id: dict[str, Any]
    tokens_per_step: int  # batch × grad_accum × seq_len × world: the tokens one optimizer step consumes


def begin(cfg: Config, run: RunDir, dist: Dist, resume: str, allow: frozenset[str]) -> Start:
    """Everything up to the first step (see the module's docstring)."""
    t = cfg.training
    if dist.is_main and resume != "latest":  # it will move checkpoints: never under a trainer of the run
        _refuse_beside_a_live_trainer(run)
    commit = git_commit(cfg.root)
    run.freeze_config(cfg.to_dict())
    if dist.is_main:
        remove_stale_temps(run.checkpoints)
        # no checkpoint yet: its --set items are its line's at once (a launch cut short before the checkpoint step
        # below left the run with a run file and no --set, and a plain launch dropped them)
        first = resume == "latest" and latest_checkpoint(run.checkpoints) is None  # nothing that could refuse them
        runs.record_self(
            run.path,
            run_name=cfg.run_name,
            run_file=cfg.run_file,  # what `launch RUN_NAME` resumes it from
            status=Status.STARTING,
            phase="building the model",
            commit=commit,
            host=hostname(),
            torch=str(torch.__version__),
            max_steps=t.max_steps,
            exit_code=None,
            error=None,
            launch_id=os.environ.get(LAUNCH_ID_ENV),
            **(_line_fields(cfg) if first else {}),
            data=None,
        )

    setup = engine.build_setup(cfg, dist)
    if dist.is_main:  # two more checkpoints must fit: one being written beside the newest
        check_free_space(run.checkpoints, checkpoint_bytes(run.checkpoints, setup.settings["params"]))
    run.phase("opening the data")
    data_id = data_identity(cfg)
    run.update_status(data=data_id)
    train_stream = Prefetched(build_stream(cfg, "train", t.batch_size, dist.rank, dist.world), setup.device, t.prefetch)
    val_stream = build_stream(cfg, "val", t.eval_batch_size or t.batch_size)
    progress = {"step": 0, "tokens": 0}
    run.phase("loading the checkpoint")
    ckpt, files = _load_resume(cfg, resume, dist)
    if ckpt is not None:
        trainer = engine.restore_state(setup, files, train_stream, str(ckpt), data_id, allow)
        progress = {"step": trainer["step"], "tokens": trainer["tokens"]}
        then = trainer.get("data") or {}
        if then and data_id and then.get("sha256") != data_id.get("sha256"):  # allowed (--allow-data-change)
            run.log(
                f"warning: resuming on other data than the checkpoint's (sha256 {then['sha256'][:12]} then, "
                f"{data_id['sha256'][:12]} now; --allow-data-change): this run is no longer an exact resume"
            )
    # what its checkpoints will need (config.resume_problem), once its checkpoint is accepted (without one: written
    # above): a start the checkpoint refused (another world size) left its --set there, and a plain launch repeated them
    if ckpt is not None and dist.is_main and resume == "latest":
        run.update_status(**_line_fields(cfg))
    if dist.is_main and resume != "latest":  # loaded and accepted: from here on a restart resumes this line
        _start_line(cfg, run, resume, ckpt)
    start = Start(
        setup,
        train_stream,
        val_stream,
        progress,
        ckpt,
        commit,
        data_id,
        t.batch_size * t.grad_accum * cfg.model.seq_len * dist.world,
    )
    _say_how_it_starts(cfg, run, start, resume)
    return start


def _line_fields(cfg: Config) -> dict[str, Any]:
    """What run.json keeps of the config the run's line trains with: its --set items (a plain launch inherits
    them) and the values its checkpoints need (verify's resume check). A start that fails before its checkpoint
    was accepted, or before its explicit --resume began a line, leaves them as they were (seen: the next launch
    inherited the failed start's --set)."""
    return {"overrides": list(cfg.overrides), "fingerprint": cfg.fingerprint_fields()}


def _refuse_beside_a_live_trainer(run: RunDir) -> None:
    """An explicit --resume moves the run's checkpoints: refused while the run is live under another launch (a
    hand `enlace train RUN --resume X` beside a supervised run, even one waiting to restart or queued)."""
    st, mine = runs.read(run.path), os.environ.get(LAUNCH_ID_ENV)
    if mine and st.get("launch_id") == mine:  # this launch's own start, restart or requeue
        return
    if runs.alive(st, run.path):  # a trainer, or its supervisor (waiting to restart, queued) or Slurm job
        raise AlreadyRunning(
            f"{run.path.name} is live (its trainer, supervisor or job): --resume would move its checkpoints "
            f"under it — stop it first (enlace-remote stop {run.path.name})"
        )


def _start_line(cfg: Config, run: RunDir, resume: str, ckpt: Path | None) -> None:
    """The explicit --resume's new line of the run's history (enlace/train/checkpoint.py start_line), its
    config.yaml, and run.json's `line_of`: a restart or requeue of this launch resumes from `latest` now."""
    moved = start_line(run.checkpoints, ckpt)
    run.reopen_metrics()  # metrics.jsonl now holds this line's records only
    run.freeze_config(cfg.to_dict(), new_line=True)
    launch_id = os.environ.get(LAUNCH_ID_ENV)  # (trainerchild.py)
    aside = {"launch_id": launch_id, "path": str(moved.relative_to(run.path.parent.parent))} if moved else None
    runs.update(run.path, line_of=launch_id, set_aside=aside, **_line_fields(cfg))  # aside: launch's summary says it
    if moved is not None:
        kept = sum(f.stat().st_size for f in moved.parent.rglob("*") if f.is_file())
        steps = ", ".join(sorted(p.name for p in moved.iterdir() if p.is_dir())) or "no checkpoint"
        run.log(
            f"--resume {resume}: this run's checkpoints past it moved to {moved.relative_to(run.path)}/ "
            f"({steps}), with metrics.jsonl as it was (this line's keeps the records up to its start); a restart "
            f"resumes from this line's own. {moved.parent.relative_to(run.path)}/ holds {kept / 2**20:.1f} MiB: "
            "remove what you no longer need"
        )


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


def _say_how_it_starts(cfg: Config, run: RunDir, start: Start, resume: str) -> None:
    """train.log's header: the run, its warnings, what it resumed from (or why from step 0)."""
    s, ckpt, progress = start.setup.settings, start.resumed_from, start.progress
    if ckpt is not None and start.setup.schedule_steps != cfg.training.max_steps:
        end, o = start.setup.schedule_steps, cfg.optim
        extra = f"; steps {end + 1}-{cfg.training.max_steps} train at min_lr" if cfg.training.max_steps > end else ""
        run.log(
            f"training.max_steps is {cfg.training.max_steps}, the run started with {end}: the learning rate keeps "
            f"the run's schedule (cosine to min_lr {o.min_lr:g} at step {end}){extra} — to stretch the schedule "
            "instead, start afresh with --resume none"
        )
    run.log(
        f"run {cfg.run_name} | commit {start.commit[:12]} | {s['params'] / 1e6:.2f}M params | {s['device']} "
        f"{s['precision']} | compile {s['compile']} | deterministic {s['deterministic']} | threads "
        f"{s['threads']} | world {start.setup.dist.world} | {start.tokens_per_step} tokens/step"
    )
    for warning in cfg.warnings:
        run.log(f"warning: {warning}")
    if start.setup.teacher_info:
        d, info = cfg.distill, start.setup.teacher_info
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
