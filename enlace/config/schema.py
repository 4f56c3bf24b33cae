"""Typed run configuration.

A run is composed from four layers, later ones winning:

    defaults < configs/data/<data>.yaml < configs/profiles/<profile>.yaml
             < configs/runs/<run>.yaml < --set section.key=value

Every leaf key remembers which layer set it, so an error names the file, the key and the fix.
Unknown keys are refused with the closest valid key; wrong types and bad combinations too.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from enlace.config import cards
from enlace.config import command as command_keys
from enlace.config.keys import check_top, closest
from enlace.config.rules import check_combinations  # the rules need Config: imported here
from enlace.contract import run_name_of
from enlace.errors import ConfigError
from enlace.names import find_root, validate_run_name
from enlace.yamlio import read_yaml


@dataclass
class ModelConfig:
    seq_len: int = 256  # context length, tokens (= bytes)
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    dropout: float = 0.1
    vocab_size: int = 256  # byte-level


@dataclass
class DataConfig:
    kind: Literal["bytes", "shards"] = "bytes"
    # bytes: files or globs, relative to the project root; "{stdlib}" is Python's stdlib dir.
    paths: list[str] = field(default_factory=list)
    val_fraction: float = 0.05  # bytes: the last fraction of the concatenated corpus
    shard_dir: str = ""  # shards: a directory written by `enlace prepare`


@dataclass
class OptimConfig:
    learning_rate: float = 1e-3  # peak LR after warmup
    min_lr: float = 1e-4  # cosine floor
    warmup_steps: int = 20
    weight_decay: float = 0.1  # decoupled (AdamW), on matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 disables


@dataclass
class TrainingConfig:
    batch_size: int = 8  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    max_steps: int = 200  # optimizer steps; the LR schedule spans exactly this
    log_every: int = 10
    eval_every: int = 50  # 0 disables periodic eval (a final eval still runs)
    eval_batches: int = 4
    eval_batch_size: int = 0  # 0 = batch_size
    prefetch: int = 2  # batches drawn ahead on a helper thread (CUDA: pinned, one async copy); 0 = none


@dataclass
class CheckpointConfig:
    every: int = 100  # optimizer steps; 0 = only at the end and on stop
    keep: int = 3  # complete checkpoints kept; the newest is never removed


@dataclass
class RuntimeConfig:
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    compile: bool = False
    deterministic: bool = False
    seed: int = 1337
    threads: int = 0  # intra-op CPU threads; 0 = torch's default (deterministic pins 1)
    fp16_init_scale: float = 65536.0  # GradScaler's initial scale (fp16 only)


@dataclass
class DistillConfig:
    teacher: str = ""  # a run name on this machine (its newest complete checkpoint) or a checkpoint dir; "" = off
    alpha: float = 0.5  # weight of the distillation term: (1 - alpha) * CE + alpha * T² * KL(teacher ‖ student)
    temperature: float = 2.0  # softens both distributions in the KL term


@dataclass
class LoggingConfig:
    """Where metrics go besides metrics.jsonl (the source of truth); each sink is an optional extra."""

    tensorboard: bool = False  # event files in the run dir's tensorboard/ (pip install 'enlace[tensorboard]')
    wandb: Literal["off", "online", "offline"] = "off"  # Weights & Biases (pip install 'enlace[wandb]')
    wandb_project: str = "enlace"
    wandb_entity: str = ""  # "" = your W&B default entity


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "training": TrainingConfig,
    "checkpoint": CheckpointConfig,
    "runtime": RuntimeConfig,
    "distill": DistillConfig,
    "logging": LoggingConfig,
}
# Which sections each kind of file may set (a data file holds DataConfig's keys at its top level).
PROFILE_SECTIONS = ("runtime", "training", "checkpoint")
RUN_TOP_KEYS = tuple(dict.fromkeys(("run_name", "data", "profile", *SECTIONS)))  # ("data" is a section too)
# a run file of your own command has these instead: a mistyped `comand:` makes the file the trainer's
OWN_COMMAND_KEYS = tuple(k for k in command_keys.KEYS if k not in RUN_TOP_KEYS)
_FIELDS = [(f.name, f"{section}.{f.name}") for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
_SECTIONS_OF = collections.Counter(name for name, _ in _FIELDS)
# a section's key written at the top level (`device: cpu`): where it goes, for the names only one section has
FIELD_HOME = {name: home for name, home in _FIELDS if _SECTIONS_OF[name] == 1}


@dataclass
class Config:
    run_name: str
    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    training: TrainingConfig
    checkpoint: CheckpointConfig
    runtime: RuntimeConfig
    distill: DistillConfig
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    root: Path = Path(".")  # project root: configs/, data/, runs/ live here
    files: dict[str, str] = field(default_factory=dict)  # run/profile/data → file used
    profile_why: str = ""  # `profile: auto`: why this profile was chosen (the card), else ""
    runs_root: Path | None = None  # where run dirs go (default: <root>/runs)
    origins: dict[str, str] = field(default_factory=dict)  # "section.key" → the file (or --set) that set it
    warnings: list[str] = field(default_factory=list)  # valid but probably not meant (train logs them)
    overrides: list[str] = field(default_factory=list)  # the --set items it was loaded with (run.json records them)

    def origin(self, key: str) -> str:
        return self.origins.get(key, "defaults")

    def profile_shown(self) -> str:
        """The profile file, and why `profile: auto` chose it."""
        why = f" (profile: auto — {self.profile_why})" if self.profile_why else ""
        return self.files.get("profile", "") + why

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run_name": self.run_name}
        for name in SECTIONS:
            out[name] = dataclasses.asdict(getattr(self, name))
        return out

    @property
    def run_dir(self) -> Path:
        return (self.runs_root or self.root / "runs") / self.run_name

    @property
    def run_file(self) -> str:
        """The run file as launch takes it (configs/runs/NAME.yaml: NAME); RUN for a config built in code."""
        return Path(self.files["run"]).stem if "run" in self.files else "RUN"

    def fingerprint_fields(self) -> dict[str, Any]:
        """The values a checkpoint must share with the run that resumes it (flat, dotted)."""
        d = self.to_dict()
        keep = {
            "model": None,
            "data": None,
            "optim": None,
            "training": ("batch_size", "grad_accum", "max_steps"),
            "runtime": ("precision", "deterministic", "seed", "device"),  # a CUDA checkpoint's RNG is CUDA's
            "distill": ("alpha", "temperature"),  # the teacher itself: by its checkpoint's identity
        }
        flat: dict[str, Any] = {}
        for section, keys in keep.items():
            for k, v in d[section].items():
                if keys is None or k in keys:
                    flat[f"{section}.{k}"] = v
        return flat

    def fingerprint(self) -> str:
        blob = json.dumps(self.fingerprint_fields(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Loading


def _resolve_file(root: Path, kind: str, ref: str, source: str, key: str) -> Path:
    """`ref` is a name under configs/<kind>/ or a path to a .yaml file."""
    if not isinstance(ref, str) or not ref:
        raise ConfigError(source, key, f"expected the name of a file in configs/{kind}/")
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        path = Path(ref) if Path(ref).is_absolute() else root / ref
    else:
        path = root / "configs" / kind / f"{ref}.yaml"
    shown = path.relative_to(root) if path.is_relative_to(root) else path
    if path.exists() and not path.is_file():
        raise ConfigError(
            str(shown), key, "is not a regular file (a directory, a device, or a link to one)", "name a .yaml file"
        )
    if path.is_symlink() and not path.resolve().is_relative_to(root.resolve()):
        raise ConfigError(
            str(shown),
            key,
            f"is a link to {path.resolve()}, outside the project: the server would train from a file no commit holds",
            "commit the file itself (replace the link with a copy)",
        )
    if not path.is_file():
        have = sorted(p.stem for p in (root / "configs" / kind).glob("*.yaml"))
        elsewhere = (  # (it said "one of: none")
            f"configs/{kind}/ holds no .yaml file"
            if (root / "configs" / kind).is_dir()
            else f"{root} holds no configs/{kind}/: run it in a project's folder, or give --root"
        )
        raise ConfigError(
            source,
            key,
            f"{kind.rstrip('s')} config {ref!r} not found ({shown})",
            f"one of: {', '.join(have)}" if have else elsewhere,
        )
    return path


def _flatten_section(layer: dict[str, Any], section: str, source: str, out: dict, origin: dict) -> None:
    """Copy `layer`'s keys into out[section.key], checking they exist in the dataclass."""
    cls = SECTIONS[section]
    valid = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(layer, dict):
        raise ConfigError(source, section, "expected a mapping of keys", f"valid keys: {', '.join(valid)}")
    for k, v in layer.items():
        if k not in valid:
            raise ConfigError(source, f"{section}.{k}", "unknown key", closest(str(k), valid))
        out[f"{section}.{k}"] = v
        origin[f"{section}.{k}"] = source


# type → (accepted Python types, how an error names it); bools are never accepted as numbers
SCALARS: dict[type, tuple[tuple[type, ...], str]] = {
    bool: ((bool,), "true or false"),
    int: ((int,), "an integer"),
    float: ((int, float), "a number"),
    str: ((str,), "a string"),
}


def _coerce(value: Any, hint: Any, source: str, key: str) -> Any:
    """Check `value` against a dataclass field's type; ints are accepted for floats."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ConfigError(source, key, f"{value!r} is not allowed", f"use one of: {', '.join(choices)}")
        return value
    if origin is list:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(source, key, f"expected a list of strings, got {value!r}")
        return list(value)
    if hint in SCALARS:
        accepted, words = SCALARS[hint]
        if not isinstance(value, accepted) or (isinstance(value, bool) and hint is not bool):
            grid = source == "--set" and isinstance(value, str) and "," in value  # launch's --set is one value
            fix = f"a grid of values is a sweep: enlace-remote sweep RUN --set {key}={value}" if grid else ""
            raise ConfigError(source, key, f"expected {words}, got {value!r}", fix)
        if hint is float and not math.isfinite(value):
            raise ConfigError(source, key, f"must be a finite number, got {value!r}")
        return float(value) if hint is float else value
    raise TypeError(f"unsupported config type {hint!r}")  # a bug in this file, not user input


def _build_section(section: str, flat: dict[str, Any], origin: dict[str, str]) -> Any:
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f"{section}.{f.name}"
        if key in flat:
            kwargs[f.name] = _coerce(flat[key], hints[f.name], origin[key], key)
    return cls(**kwargs)


def parse_overrides(items: typing.Sequence[str]) -> dict[str, Any]:
    """`["training.max_steps=10", ...]` → {"training.max_steps": 10}; values are YAML scalars."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError("--set", item, "expected section.key=value", "e.g. --set training.max_steps=10")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str):  # YAML 1.1 reads "1e12" as a string; a user means the number
            with contextlib.suppress(ValueError):
                value = float(value) if value.strip().lower() not in ("nan", "inf", "-inf", "infinity") else value
        out[key.strip()] = value
    return out


def load_config(run: str, overrides: typing.Sequence[str] = (), root: Path | None = None) -> Config:
    """Resolve run name or path `run` into a validated Config."""
    root = find_root(root)
    sets = parse_overrides(overrides)
    run_path = _resolve_file(root, "runs", run, "RUN", "")
    run_src = str(run_path.relative_to(root) if run_path.is_relative_to(root) else run_path)
    run_layer = read_yaml(run_path, "run", run_src)
    if not run_layer:  # it was told `data: missing`, the trainer's word, in a repository of a script of one's own
        fix = "your own script: command: [python, train.py] (docs/own-script.md); enlace's trainer: data: and profile:"
        raise ConfigError(run_src, "", "is empty", fix)
    # a file with the trainer's sections mistyped only `command:` if anything of your own command's
    trainer_like = any((k in SECTIONS and k != "data") or k == "profile" for k in run_layer)
    check_top(run_layer, RUN_TOP_KEYS, run_src, ("command",) if trainer_like else OWN_COMMAND_KEYS, FIELD_HOME)

    def pick(key: str, default: str | None) -> tuple[Any, str]:
        if key in sets:
            return sets.pop(key), "--set"
        return run_layer.get(key, default), run_src

    data_ref, data_src = pick("data", None)
    profile_ref, profile_src = pick("profile", None)
    run_name, given_by = run_name_of(run_layer, run_path.stem, sets)  # the contract's rule, as the driver reads it
    sets.pop("run_name", None)
    name_src = "--set" if given_by == "--set" else run_src
    if data_ref is None:
        raise ConfigError(run_src, "data", "missing", "name a file in configs/data/, e.g. data: smoke")
    if profile_ref is None:
        raise ConfigError(run_src, "profile", "missing", "name a file in configs/profiles/, e.g. profile: cpu")
    validate_run_name(run_name, name_src)

    profile_why = ""
    if profile_ref == cards.AUTO:  # the profile that fits the card here (enlace/config/cards.py)
        profile_ref, profile_why = cards.pick(*cards.card())
    data_path = _resolve_file(root, "data", data_ref, data_src, "data")
    profile_path = _resolve_file(root, "profiles", profile_ref, profile_src, "profile")
    rel = lambda p: str(p.relative_to(root)) if p.is_relative_to(root) else str(p)

    flat: dict[str, Any] = {}
    origin: dict[str, str] = {}
    _flatten_section(read_yaml(data_path, "data", rel(data_path)), "data", rel(data_path), flat, origin)
    profile_layer = read_yaml(profile_path, "profile", rel(profile_path))
    check_top(profile_layer, PROFILE_SECTIONS, rel(profile_path))
    for section, values in profile_layer.items():
        _flatten_section(values, section, rel(profile_path), flat, origin)
    for section in SECTIONS:
        if section in run_layer and section != "data":
            _flatten_section(run_layer[section], section, run_src, flat, origin)
    for key, value in sets.items():
        section, _, leaf = key.partition(".")
        if section in SECTIONS and not leaf:  # `--set model=3`: a section, not one of its keys
            keys = ", ".join(f.name for f in dataclasses.fields(SECTIONS[section]))
            raise ConfigError("--set", key, "is a section, not a key", f"set one of its keys ({section}.KEY=V): {keys}")
        if section not in SECTIONS:
            raise ConfigError("--set", key, "unknown key", closest(section, [*SECTIONS, "run_name", "profile"]))
        _flatten_section({leaf: value}, section, "--set", flat, origin)

    cfg = Config(
        run_name=run_name,
        root=root,
        files={"run": run_src, "profile": rel(profile_path), "data": rel(data_path)},
        profile_why=profile_why,
        origins=origin,
        overrides=list(overrides),
        **{s: _build_section(s, flat, origin) for s in SECTIONS},
    )

    check_combinations(cfg)
    return cfg


def load_data_config(ref: str, root: Path | None = None) -> DataConfig:
    """A data config on its own (for `enlace prepare`): name in configs/data/ or path."""
    root = find_root(root)
    path = _resolve_file(root, "data", ref, "DATA", "")
    flat: dict[str, Any] = {}
    origin: dict[str, str] = {}
    _flatten_section(read_yaml(path, "data"), "data", str(path), flat, origin)
    return _build_section("data", flat, origin)
