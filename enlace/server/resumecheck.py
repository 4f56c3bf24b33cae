"""What a trainer would refuse as it loads a checkpoint to resume, said before a launch starts anything: another
number of processes than saved it, data other than the checkpoint was trained on, or (distillation) another
teacher, by the record its MANIFEST keeps
(enlace/manifest.py RECORDED: what trainer.pt holds, readable without torch). verify asks it (`enlace data-files
--against-checkpoint`); launch refuses it once it knows the run would train. A finished run's data replaced by
a push passed verify, queued, and failed as it started; a student whose teacher was trained further failed after
its preflight, and a finished one then read `failed`; a run saved by 2 processes, launched on 1, started a trainer
that refused it (torchrun's error lines around the words).
"""

from __future__ import annotations

from pathlib import Path

from enlace.config.machine import teacher_checkpoint
from enlace.config.schema import Config
from enlace.data.streams import data_identity
from enlace.errors import CheckpointError
from enlace.manifest import complete_checkpoints, identity, read_manifest, world_refused
from enlace.train.checkpoint import resolve_resume


def resume_refused(
    cfg: Config, resume: str, allow_data_change: bool, allow_teacher_change: bool, world: int | None = None
) -> str | None:
    """The refusal the trainer would give resuming `resume` (latest or a PATH, as --resume takes them) on `world`
    processes (None: not known before it starts, --gpus all), in its words and fixes; None when it would resume, or
    there is nothing to compare (no such checkpoint: verify's --resume check says it; one saved before MANIFESTs
    recorded what it was made from)."""
    try:
        ckpt = resolve_resume(cfg.run_dir / "checkpoints", resume)
    except CheckpointError:
        return None
    made = read_manifest(ckpt) if ckpt else {}
    if world and made.get("world") and made["world"] != world:
        return f"{_named(cfg, ckpt)} was {world_refused(made['world'], world)}"
    if not allow_data_change and (said := _data_refused(cfg, ckpt, made.get("data") or {})):
        return said
    if "teacher" in made and not allow_teacher_change:
        return _teacher_refused(cfg, ckpt, made["teacher"])
    return None


def _named(cfg: Config, ckpt: Path) -> str:
    """The checkpoint as its refusal names it: the run's own by its name, another (--resume PATH) by its path."""
    own = ckpt.resolve().parent == (cfg.run_dir / "checkpoints").resolve()
    return f"{cfg.run_name}'s checkpoint {ckpt.name}" if own else f"checkpoint {ckpt}"


def _data_refused(cfg: Config, ckpt: Path, then: dict) -> str | None:
    now = data_identity(cfg) if then.get("sha256") else {}
    if not now or (then["sha256"], then.get("bytes")) == (now["sha256"], now["bytes"]):
        return None
    return (
        f"the data differs from what {_named(cfg, ckpt)} was trained on ({then.get('files')} "
        f"files, {then.get('bytes')} bytes then; {now['files']} files, {now['bytes']} bytes now): its resume would "
        "refuse it — put the same data back, resume on this data anyway with launch --allow-data-change (not "
        "exact), or start afresh with --resume none"
    )


def _teacher_refused(cfg: Config, ckpt: Path, then: str | None) -> str | None:
    """As the trainer's rule: the teacher's identity then and now differ (none on either side counts)."""
    teacher = teacher_checkpoint(cfg) if cfg.distill.teacher else None
    now = identity(teacher) if teacher else None
    if now == then:
        return None
    same = (
        next((c for c in complete_checkpoints(teacher.parent) if identity(c) == then), None)
        if teacher and then
        else None
    )
    found = same is not None and same.is_relative_to(cfg.root)
    back = f"--set distill.teacher={same.relative_to(cfg.root)}" if found else "distill.teacher: the one it began with"
    shown = lambda t: t[:12] if t else "none"
    return (
        f"the teacher changed: {_named(cfg, ckpt)} was distilled from teacher {shown(then)}, "
        f"this config's is {shown(now)} ({cfg.distill.teacher or 'no distill.teacher'}) — put the same teacher back "
        f"({back}), continue with this one: launch --allow-teacher-change, or start afresh with --resume none"
    )
