"""Build once, use twice: the pieces `train` and `preflight` share.

`build_setup` makes the model, optimizer, GradScaler, autocast and determinism settings from a
Config; `train_step` runs one optimizer step (with gradient accumulation) from any batch source;
`evaluate` runs the fixed val batches; `capture_state` / `restore_state` move every piece of state
into and out of a checkpoint.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from enlace.config.rules import no_cuda_error
from enlace.config.schema import Config
from enlace.errors import CheckpointError
from enlace.manifest import world_refused
from enlace.train import determinism
from enlace.train.checkpoint import first_difference
from enlace.train.dist import Dist
from enlace.train.distill import kd_loss, load_teacher
from enlace.train.model import ByteGPT
from enlace.train.optim import AdamW, build_optimizer, lr_at

Batch = tuple[torch.Tensor, torch.Tensor]
STATE_VERSION = 1
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class TrainingSetup:
    """What build_setup makes once and every step uses: the model (raw and as run), optimizer, scaler,
    the settings it chose, and the distillation teacher if any."""

    cfg: Config
    device: torch.device
    dist: Dist
    raw_model: ByteGPT  # the module whose state_dict is saved
    model: torch.nn.Module  # what runs forward: raw, compiled and/or DDP-wrapped
    optimizer: AdamW
    scaler: torch.amp.GradScaler
    settings: dict[str, Any] = field(default_factory=dict)
    teacher: torch.nn.Module | None = None  # distillation: frozen, eval mode, on the device (enlace/train/distill.py)
    teacher_info: dict[str, Any] | None = None  # its checkpoint, identity (MANIFEST sha256) and size
    schedule_steps: int = 0  # where the LR's cosine reaches min_lr: the max_steps the run started with

    def autocast(self):
        precision = self.cfg.runtime.precision
        return torch.autocast(self.device.type, dtype=AMP_DTYPES.get(precision), enabled=precision != "fp32")


@dataclass
class StepResult:
    """A step's figures, left on the device: reading `loss`, `skipped` or `scale` waits for the GPU (a host
    sync), so the loop reads them on logging steps only."""

    loss: torch.Tensor  # mean loss over the micro-batches, nats per byte (0-dim, on device)
    lr: float
    scale_before: torch.Tensor | None  # GradScaler's scale before and after the step (fp16; None otherwise)
    scale_after: torch.Tensor | None
    terms: dict[str, torch.Tensor] = field(default_factory=dict)  # distillation: "ce" and "kd", as `loss`
    grad_norm: torch.Tensor | None = None  # global L2 norm of the gradients before clipping (optim.grad_clip > 0)

    @property
    def skipped(self) -> bool:
        """GradScaler skipped the update (inf/NaN gradients): it lowered the scale. Syncs."""
        return self.scale_after is not None and bool(self.scale_after < self.scale_before)

    @property
    def scale(self) -> float:
        """The scale after the step (1.0 without fp16). Syncs."""
        return float(self.scale_after.item()) if self.scale_after is not None else 1.0


def pick_device(want: str) -> torch.device:
    """runtime.device (or a --device option) as a device type: auto is the GPU when one is visible."""
    if want == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(want)


def resolve_device(cfg: Config, dist: Dist) -> torch.device:
    want = cfg.runtime.device
    if want == "cuda" and not torch.cuda.is_available():
        raise no_cuda_error(cfg)
    if pick_device(want).type == "cpu":
        if cfg.runtime.precision == "fp16" and want == "auto":
            cfg.warnings.append(
                f"{cfg.origin('runtime.precision')}: runtime.precision: fp16 on CPU (no GPU here) "
                "is ≈20x slower than fp32; use bf16 or fp32 on CPU"
            )
        return torch.device("cpu")
    return torch.device("cuda", dist.local_rank)


def build_setup(cfg: Config, dist: Dist | None = None) -> TrainingSetup:
    dist = dist or Dist()
    device = resolve_device(cfg, dist)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    settings = determinism.configure(cfg.runtime, device)
    raw_model = ByteGPT(cfg.model).to(device)
    model: torch.nn.Module = raw_model
    if dist.world > 1:
        if cfg.runtime.deterministic:  # gradients averaged in one fixed layout (Dist.average_gradients)
            dist.broadcast_parameters(raw_model)
        else:
            model = torch.nn.parallel.DistributedDataParallel(
                raw_model, device_ids=[device.index] if device.type == "cuda" else None
            )
        # every rank has rank 0's weights now; from here each draws its own numbers (dropout masks)
        determinism.seed_everything((cfg.runtime.seed + dist.rank) % 2**64)
    if cfg.runtime.compile:
        model = torch.compile(model)
    optimizer = build_optimizer(raw_model, cfg.optim, cfg.runtime.deterministic, device.type)
    scaler = torch.amp.GradScaler(
        device.type, enabled=cfg.runtime.precision == "fp16", init_scale=cfg.runtime.fp16_init_scale
    )
    settings.update(
        device=str(device),
        params=raw_model.num_params(),
        precision=cfg.runtime.precision,
        compile=cfg.runtime.compile,
        world=dist.world,
    )
    teacher = teacher_info = None
    if cfg.distill.teacher:
        teacher, teacher_info = load_teacher(cfg, device)
    return TrainingSetup(
        cfg, device, dist, raw_model, model, optimizer, scaler, settings, teacher, teacher_info, cfg.training.max_steps
    )


def _no_phase(name: str) -> None:
    pass


def ddp_of(model: torch.nn.Module) -> torch.nn.parallel.DistributedDataParallel | None:
    """The DistributedDataParallel under `model`: itself, or inside torch.compile's wrapper (`_orig_mod`)."""
    inner = getattr(model, "_orig_mod", model)
    return inner if isinstance(inner, torch.nn.parallel.DistributedDataParallel) else None


def train_step(
    setup: TrainingSetup, step: int, next_batch: Callable[[], Batch], phase: Callable[[str], None] = _no_phase
) -> StepResult:
    """One optimizer step: grad_accum micro-batches, clip, scaler step. `step` counts from 0.

    `phase(name)` is called as each phase starts ("forward", "backward", "optimizer step") and
    with "done" at the end: preflight uses it to say where memory ran out."""
    cfg, model, opt, scaler = setup.cfg, setup.model, setup.optimizer, setup.scaler
    lr = lr_at(step, cfg.optim, setup.schedule_steps)
    for group in opt.param_groups:
        group["lr"] = lr
    model.train()
    accum = cfg.training.grad_accum
    total = torch.zeros((), device=setup.device)
    terms = {k: torch.zeros((), device=setup.device) for k in (("ce", "kd") if setup.teacher is not None else ())}
    for micro in range(accum):
        x, y = (t.to(setup.device, non_blocking=True) for t in next_batch())
        # DDP: all-reduce gradients only on the last micro-step (under compile too: the DDP is inside its wrapper)
        ddp = ddp_of(model)
        sync = ddp.no_sync() if ddp is not None and micro < accum - 1 else contextlib.nullcontext()
        with sync:
            phase("forward")
            with setup.autocast():
                logits, loss = model(x, y)
                if setup.teacher is not None:  # distillation: the teacher's forward, without gradients
                    with torch.no_grad():
                        teacher_logits, _ = setup.teacher(x)
                    kd = kd_loss(logits, teacher_logits, cfg.distill.temperature)
                    terms["ce"] += loss.detach() / accum
                    terms["kd"] += kd.detach() / accum
                    loss = (1 - cfg.distill.alpha) * loss + cfg.distill.alpha * kd
            del logits  # (B, T, V): backward does not need it; held, it sat beside backward's own peak
            phase("backward")
            scaler.scale(loss / accum).backward()
        total += loss.detach() / accum
    if setup.dist.world > 1 and model is setup.raw_model:  # deterministic DDP: no reducer, one fixed layout
        setup.dist.average_gradients(setup.raw_model.parameters())
    phase("optimizer step")
    grad_norm = None
    if cfg.optim.grad_clip > 0:
        scaler.unscale_(opt)
        grad_norm = torch.nn.utils.clip_grad_norm_(setup.raw_model.parameters(), cfg.optim.grad_clip)
    # the scale read on the device, not with get_scale() (a host sync each): the step's only sync is then
    # GradScaler's own check for inf/NaN gradients (fp16); fp32 and bf16 steps have none
    before = scaler._get_scale_async().clone() if scaler.is_enabled() else None
    scaler.step(opt)
    scaler.update()
    after = scaler._get_scale_async() if scaler.is_enabled() else None
    opt.zero_grad(set_to_none=True)
    phase("done")
    return StepResult(total, lr, before, after, terms, grad_norm)


@torch.no_grad()
def evaluate(setup: TrainingSetup, val_stream, n_batches: int, beat=lambda: None) -> dict[str, float]:
    """Mean val loss over the fixed val batches 0..n-1 (same batches every eval), and bits per byte.
    `beat` is called once per batch (the run's heartbeat: a long eval is work, not a stall)."""
    setup.model.eval()
    total = 0.0
    for k in range(n_batches):
        beat()
        x, y = (t.to(setup.device) for t in val_stream.batch_at(k))
        with setup.autocast():
            _, loss = setup.raw_model(x, y)
        total += loss.item()
    setup.model.train()
    val_loss = total / n_batches
    return {"val_loss": val_loss, "val_bpb": val_loss / math.log(2)}


def rank_state(data_stream) -> dict[str, Any]:
    """What differs between DDP ranks: the data position and every RNG."""
    return {"data": data_stream.state_dict(), "rng": determinism.rng_state()}


def capture_state(
    setup: TrainingSetup,
    ranks: list[dict[str, Any]],
    progress: dict[str, int],
    commit: str,
    data_id: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The checkpoint's files: name → object for torch.save (all weights_only-loadable).

    `ranks` holds rank_state() of every rank, gathered on rank 0 (one entry without DDP)."""
    trainer = {
        "version": STATE_VERSION,
        "step": progress["step"],
        "tokens": progress["tokens"],
        "scaler": setup.scaler.state_dict(),
        "ranks": ranks,
        "config": setup.cfg.to_dict(),
        "fingerprint": setup.cfg.fingerprint_fields(),
        "commit": commit,
        "torch": str(torch.__version__),
        "threads": torch.get_num_threads(),
        "data": data_id,
        "teacher": setup.teacher_info["identity"] if setup.teacher_info else None,
        "schedule_steps": setup.schedule_steps,
    }
    return {
        "model.pt": setup.raw_model.state_dict(),
        "optimizer.pt": setup.optimizer.state_dict(),
        "trainer.pt": trainer,
    }


def check_compatible(
    setup: TrainingSetup,
    trainer: dict[str, Any],
    where: str,
    data_id: dict[str, Any] | None = None,
    allow_data_change: bool = False,
    allow_teacher_change: bool = False,
) -> None:
    """Refuse a checkpoint from another config, data, world size or (deterministic) thread count. A larger
    (or smaller) training.max_steps is allowed while the run has not reached it: that extends the run,
    and the learning rate keeps the run's own schedule (restore_state)."""
    if trainer.get("version") != STATE_VERSION:
        raise CheckpointError(f"{where}: trainer state v{trainer.get('version')}, expected v{STATE_VERSION}")
    saved, current = dict(trainer["fingerprint"]), setup.cfg.fingerprint_fields()
    if current["training.max_steps"] > trainer["step"]:
        saved["training.max_steps"] = current["training.max_steps"]
    diff = first_difference(saved, current)
    if diff and diff[0] == "training.max_steps":  # lowered below the step reached (it read as another config's)
        raise CheckpointError(
            f"{where}: the checkpoint is at step {trainer['step']}, and training.max_steps={diff[2]} is not above it:"
            f" nothing to train — extend it with a training.max_steps above {trainer['step']}, or start afresh with"
            " --resume none"
        )
    if diff:
        key, old, new = diff
        raise CheckpointError(
            f"{where}: the checkpoint was made with {key}={old!r}, this run has {new!r} — "
            f"resume with the same {key} (--set {key}={old}: on a host that has it), or start afresh with --resume none"
        )
    old = trainer.get("data")
    if (
        old
        and data_id
        and (old["sha256"], old["bytes"]) != (data_id["sha256"], data_id["bytes"])
        and not allow_data_change
    ):
        raise CheckpointError(
            f"{where}: the data differs from the checkpoint's ({old['files']} files, {old['bytes']} bytes, "
            f"sha256 {old['sha256'][:12]} then; {data_id['files']} files, {data_id['bytes']} bytes, "
            f"sha256 {data_id['sha256'][:12]} now): resuming would not reproduce the run — put the "
            "same data back, or resume on this data anyway with --allow-data-change"
        )
    teacher = setup.teacher_info["identity"] if setup.teacher_info else None
    if trainer.get("teacher") != teacher and not allow_teacher_change:
        then, now = (t[:12] if t else "none" for t in (trainer.get("teacher"), teacher))
        raise CheckpointError(
            f"{where}: the teacher changed: the checkpoint was distilled from teacher {then} (its "
            f"MANIFEST's sha256), this run's teacher is {now} ({setup.cfg.distill.teacher or 'none'}) "
            "— put the same teacher back, or continue with this one: --allow-teacher-change"
        )
    if len(trainer["ranks"]) != setup.dist.world:
        raise CheckpointError(f"{where}: {world_refused(len(trainer['ranks']), setup.dist.world)}")
    threads = torch.get_num_threads()
    if setup.cfg.runtime.deterministic and trainer["threads"] != threads and setup.device.type == "cpu":
        raise CheckpointError(
            f"{where}: saved with {trainer['threads']} CPU threads, this process uses {threads}; "
            "deterministic resume needs the same — set runtime.threads accordingly"
        )


def restore_state(
    setup: TrainingSetup,
    files: dict[str, Any],
    data_stream,
    where: str,
    data_id: dict[str, Any] | None = None,
    allow: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Load model, optimizer, scaler, this rank's RNG and data position; returns the trainer record.
    `allow`: "data" and/or "teacher" may differ from the checkpoint's (said, not exact)."""
    trainer = files["trainer.pt"]
    check_compatible(setup, trainer, where, data_id, "data" in allow, "teacher" in allow)
    try:
        setup.raw_model.load_state_dict(files["model.pt"])
    except RuntimeError as e:
        raise CheckpointError(f"{where}: model weights do not fit this model: {str(e).splitlines()[0]}") from None
    setup.optimizer.load_state_dict(files["optimizer.pt"])
    setup.scaler.load_state_dict(trainer["scaler"])
    mine = trainer["ranks"][setup.dist.rank]
    data_stream.load_state_dict(mine["data"])
    determinism.set_rng_state(mine["rng"])
    # An extended run keeps the schedule it started with: the cosine still reaches min_lr where it did, and
    # the added steps train at min_lr (never a jump back up the curve). Older checkpoints: their max_steps.
    setup.schedule_steps = trainer.get("schedule_steps") or trainer["fingerprint"]["training.max_steps"]
    return trainer
