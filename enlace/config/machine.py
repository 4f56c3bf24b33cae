"""What a valid config needs of the machine it runs on (a GPU's bf16, a teacher checkpoint). Apart from the
config rules, which judge values alone: this module reaches the checkpoints (and torch, for a GPU run), the
driver never. check-config imports it before every launch, so torch stays out of a CPU run's checks."""

from __future__ import annotations

import difflib
import importlib.util
import os
from pathlib import Path

from enlace.config.cards import NATIVE_BF16
from enlace.config.schema import Config
from enlace.errors import ConfigError
from enlace.manifest import latest_checkpoint, manifest_problem, not_the_trainers
from enlace.names import RUN_NAME_RE
from enlace.state.runs import read


def check_environment(cfg: Config) -> None:
    """What a valid config needs of the machine it will run on: a GPU that computes bf16 natively when bf16
    runs there, and a complete teacher checkpoint. Checked where the run starts (check-config and verify on
    the server, train, preflight), never when a config is only loaded: the driver's machine has neither
    the server's GPU nor its checkpoints."""
    rt = cfg.runtime  # (a missing GPU is said where the device is picked: a Slurm login node has none)
    if rt.precision == "bf16" and rt.device != "cpu":
        import torch

        card = int(os.environ.get("LOCAL_RANK", "0"))  # the run's own card (a torchrun rank's), not the current one
        if torch.cuda.is_available() and torch.cuda.get_device_capability(card) < NATIVE_BF16:
            major, minor = torch.cuda.get_device_capability(card)
            raise ConfigError(
                cfg.origin("runtime.precision"),
                "runtime.precision",
                f"bf16 on {torch.cuda.get_device_name(card)} (compute capability {major}.{minor}) is emulated: "
                "GEMMs run slowly and attention falls back to its math kernel (B·H·T² scores in memory)",
                "bf16 needs compute capability 8.0 (Ampere) or newer; use fp16 (with GradScaler) or fp32 here",
            )
    for key, package, on in (
        ("logging.tensorboard", "tensorboard", cfg.logging.tensorboard),
        ("logging.wandb", "wandb", cfg.logging.wandb != "off"),
    ):
        if on and importlib.util.find_spec(package) is None:
            raise ConfigError(
                cfg.origin(key),
                key,
                f"asks for the {package} sink, but the {package} package is not installed in this python",
                f"pip install 'enlace[{package}]' here (on a server: enlace-remote shell -- pip install {package}), "
                f"or turn it off (--set {key}={'false' if package == 'tensorboard' else 'off'})",
            )
    if cfg.distill.teacher:  # a missing or incomplete teacher, or one the student does not fit: before anything runs
        ckpt = teacher_checkpoint(cfg)
        # the teacher run's config as its last start recorded it (config.yaml is its first start's); no torch here
        trained = read(ckpt.parent.parent).get("fingerprint") or {}
        vocab, seq = trained.get("model.vocab_size"), trained.get("model.seq_len")
        if isinstance(vocab, int) and isinstance(seq, int):
            check_fit(cfg, vocab, seq)


def check_fit(cfg: Config, vocab_size: int, seq_len: int) -> None:
    """The student fits its teacher: one vocabulary, and no more positions than the teacher has. Checked from
    the teacher run's run.json before the run (check-config, verify), and from its checkpoint as it loads."""
    s = cfg.model
    if vocab_size != s.vocab_size:
        raise ConfigError(
            cfg.origin("model.vocab_size"),
            "model.vocab_size",
            f"the teacher's vocab_size {vocab_size} differs from the student's {s.vocab_size}",
            "distill between models of one vocabulary",
        )
    if seq_len < s.seq_len:
        raise ConfigError(
            cfg.origin("model.seq_len"),
            "model.seq_len",
            f"{s.seq_len} is longer than the teacher's seq_len {seq_len}",
            f"use model.seq_len <= {seq_len}",
        )


def _runs_with_checkpoints(runs: Path) -> list[str]:
    return sorted(p.parent.name for p in runs.glob("*/checkpoints")) if runs.is_dir() else []


def teacher_checkpoint(cfg: Config) -> Path:
    """The teacher's complete checkpoint; a ConfigError naming the file, the key and the fix if there is none."""
    ref = cfg.distill.teacher
    where = cfg.origin("distill.teacher")
    if "/" in ref:
        path = Path(ref) if Path(ref).is_absolute() else cfg.root / ref
        problem = manifest_problem(path)
        if problem:
            latest = path.name == "latest" and path.parent.name == "checkpoints"  # the file naming the newest
            run = path.parent.parent.name if latest else path.name if (path / "checkpoints").is_dir() else ""
            raise ConfigError(
                where,
                "distill.teacher",
                f"{ref} is not a complete checkpoint ({problem.split(': ', 1)[-1]})",
                f"name the run ({run}: its newest checkpoint)"
                if run
                else "name a checkpoint dir with a MANIFEST, or a run name",
            )
        return _trainers(path, where)

    if not RUN_NAME_RE.fullmatch(ref):
        raise ConfigError(where, "distill.teacher", f"{ref!r} is neither a run name nor a checkpoint path")
    if ref == cfg.run_name:  # each checkpoint it saved would be another teacher: every resume refused
        raise ConfigError(where, "distill.teacher", f"{ref!r} is this run itself", "name another run as its teacher")
    runs = cfg.root / "runs"
    ckpt = latest_checkpoint(runs / ref / "checkpoints")
    near = difflib.get_close_matches(ref, _runs_with_checkpoints(runs), n=1) if not (runs / ref).is_dir() else []
    if near:  # a mistyped teacher (it was told to train a run of that name)
        raise ConfigError(where, "distill.teacher", f"no run {ref!r} here — did you mean {near[0]!r}?")
    if ckpt is None:
        raise ConfigError(
            where,
            "distill.teacher",
            f"run {ref!r} has no complete checkpoint on this machine "
            f"(looked in {cfg.root / 'runs' / ref / 'checkpoints'})",
            f"train the teacher first (enlace-remote launch {ref} on that host, or enlace train {ref} here), or "
            "name a checkpoint dir",
        )
    return _trainers(ckpt, where)


def _trainers(ckpt: Path, where: str) -> Path:
    """`ckpt`, when enlace's trainer saved it (a script's own, through enlace.job, is no teacher)."""
    problem = not_the_trainers(ckpt)
    if problem:
        raise ConfigError(where, "distill.teacher", problem, "a teacher is a checkpoint of enlace's trainer")
    return ckpt
