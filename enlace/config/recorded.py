"""A run's config as its launches recorded it: the --set values run.json keeps (a plain `train RUN` resumes
a run extended with --set training.max_steps=M), and whether this config can resume its checkpoints.
Apart from enlace/config/schema.py, which composes a config from files alone and is light enough for the driver."""

from __future__ import annotations

import shlex
import typing
from pathlib import Path

from enlace.config.schema import Config, load_config
from enlace.manifest import latest_checkpoint, read_manifest
from enlace.state.runs import read


def load_run_config(
    run: str,
    overrides: typing.Sequence[str] = (),
    root: Path | None = None,
    runs_root: Path | None = None,
    fresh: bool = False,
) -> Config:
    """load_config with the run's own --set values first: those its launches recorded in run.json. A plain
    `train RUN` (or `launch RUN`) then resumes a run that was extended with --set training.max_steps=M.
    `overrides` given now win key by key; `fresh` (--resume none) leaves the recorded ones out."""
    cfg = load_config(run, overrides, root)
    cfg.runs_root = runs_root
    if fresh:
        return cfg
    inherited = _inherited(cfg.run_dir, overrides)
    if not inherited:
        return cfg
    cfg = load_config(run, [*inherited, *overrides], root)
    cfg.runs_root = runs_root
    cfg.warnings.append(
        f"this run's own --set {' '.join(inherited)} (recorded in run.json when it was launched) applies; a --set "
        "given now wins, and --resume none starts afresh without them"
    )
    return cfg


def _inherited(run_dir: Path, overrides: typing.Sequence[str]) -> list[str]:
    """The --set items run.json recorded that `overrides` do not give again."""
    recorded = read(run_dir).get("overrides") or []
    given = {o.partition("=")[0].strip() for o in overrides}
    return [o for o in recorded if isinstance(o, str) and o.partition("=")[0].strip() not in given]


def resume_problem(cfg: Config, overrides: typing.Sequence[str] = ()) -> str | None:
    """Before a launch that resumes: the first value a checkpoint must share (fingerprint_fields) on which
    this config and the one the run last trained with (run.json) disagree, said with what to type. None
    when it would resume, or there is nothing to resume. training.max_steps may differ: that extends (one below
    the newest checkpoint's step is said as such: it read as another config's). `overrides`: this launch's --set
    items; the start-afresh command carries them and the recorded ones, so that it starts the very config this
    launch asked for (--resume none alone drops the recorded ones)."""
    saved, now = dict(read(cfg.run_dir).get("fingerprint") or {}), cfg.fingerprint_fields()
    if not saved or not (cfg.run_dir / "checkpoints" / "latest").exists():
        return None
    sets = "".join(f" --set {shlex.quote(o)}" for o in [*_inherited(cfg.run_dir, overrides), *overrides])
    afresh = f"start afresh with this config (its checkpoints are set aside): enlace-remote launch {cfg.run_name}"
    afresh += f"{sets} --resume none"
    for key in sorted(set(saved) | set(now)):
        if key != "training.max_steps" and key in saved and saved.get(key) != now.get(key):
            old, new = saved.get(key), now.get(key)
            return (
                f"{cfg.run_name}'s checkpoints were trained with {key}={old!r}, this config gives {new!r}: they "
                f"cannot resume it — put it back (--set {key}={old}), or {afresh}"
            )
    latest = latest_checkpoint(cfg.run_dir / "checkpoints")
    reached, steps = read_manifest(latest)["step"] if latest else 0, now["training.max_steps"]
    if steps <= reached and steps != saved.get("training.max_steps"):  # as the trainer's check_compatible refuses
        return (
            f"{cfg.run_name}'s newest checkpoint is at step {reached}, and training.max_steps={steps} is not above it: "
            f"nothing to train — extend it with --set training.max_steps=M, M above {reached}, or {afresh}"
        )
    return None
