"""A run of your own command: a run file with `command:` (an argv list) instead of enlace's model and training
sections, or `enlace-remote launch --name NAME -- ARGV...`. Both halves read it here: the driver to launch
and to push the data, the server to check it (check-config, verify) and the supervisor to start and restart
the command (enlace/server/supervise.py). docs/own-script.md is the user's page.

    command: [python, train.py, --out_dir, "{run_dir}/out"]   # `python`: the host's python (hosts.yaml)
    data: ["data/shakespeare_char/*.bin"]   # what it reads, relative to the tree: verify, data push
    outputs: ["out/*"]                       # under the run directory: what fetch pulls, sha256-verified
    nproc: 1                                 # > 1: under torchrun, one process per GPU
    device: cpu                              # cpu | cuda | auto: what it waits for in the host's queue
    env: {WANDB_MODE: offline}
    supervise: {restarts: 3, stall_timeout: null, grace: 30, backoff: 10}
    resume: {args: ["--init_from=resume"], when: "{run_dir}/out/ckpt.pt"}

Placeholders, in command, env, resume and outputs: {run_dir}, {run_name}, {restart} ({{ and }} are braces).
launch's --set (and a sweep point's): run_name=NAME, env.NAME=VALUE, args.NAME=VALUE (`--NAME=VALUE` appended).
Standard library only: the driver and every server verb read it without torch.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import string
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from enlace import contract
from enlace.datadir import STDLIB, data_relative, outside_words
from enlace.errors import ConfigError
from enlace.manifest import latest_checkpoint
from enlace.names import find_root, validate_run_name
from enlace.yamlio import read_yaml

PLACEHOLDERS = ("run_dir", "run_name", "restart")
KEYS = ("command", "run_name", "data", "outputs", "nproc", "device", "env", "supervise", "resume")
EXAMPLE = 'command: [python, train.py, --out_dir, "{run_dir}/out"]'
GRACE_S = 30.0  # a stop: SIGTERM to the command's process group, then SIGKILL after this long
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ARG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")  # --set args.NAME=VALUE: the option's name, as the script spells it


class Bad(ConfigError):
    """One wrong key of a command run: the message names the file (or the option), the key and the fix."""

    def __init__(self, text: str):
        super().__init__(text, "", "")
        self.message = text
        self.args = (text,)


@dataclass(frozen=True)
class Supervise:
    restarts: int = contract.RESTARTS
    stall_timeout: float | None = None  # only with enlace.job's heartbeat (a script that logs steps)
    grace: float = GRACE_S
    backoff: float = contract.BACKOFF_S  # the wait before the first restart; each next one 3x longer


@dataclass(frozen=True)
class Resume:
    """What changes on a restart: `args` appended to the command once `when` (a glob, placeholders expanded,
    relative to the tree) matches a file; without `when`, once an enlace.job checkpoint exists."""

    args: tuple[str, ...] = ()
    when: str | None = None


@dataclass(frozen=True)
class CommandRun:
    argv: tuple[str, ...]
    run_name: str
    data: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    nproc: int = 1
    device: str = "cpu"
    env: dict[str, str] = field(default_factory=dict)
    supervise: Supervise = Supervise()
    resume: Resume = Resume()

    def to_doc(self) -> dict[str, Any]:
        """The JSON form: `enlace start --command-spec` carries it, run.json keeps it (status shows `command`)."""
        doc = asdict(self)
        doc["command"] = list(doc.pop("argv"))
        return doc

    @classmethod
    def from_doc(cls, doc: Any, where: str) -> CommandRun:
        return parse(doc, where, default_name=None, recorded=True)

    def scripts(self) -> list[str]:
        """The argv's relative paths to files of the tree (train.py, scripts/x.sh): verify checks they arrived."""
        return [a for a in self.argv if not a.startswith(("-", "/", "{")) and Path(a).suffix in SCRIPT_SUFFIXES]

    def values(self, run_dir: Path, restart: int) -> dict[str, str]:
        return {"run_dir": str(run_dir), "run_name": self.run_name, "restart": str(restart)}

    def attempt(self, run_dir: Path, restart: int, python: str = sys.executable) -> tuple[list[str], bool]:
        """The argv of this start (placeholders expanded, `python` the host's, torchrun for nproc > 1, the resume
        args once there is something to resume from) and whether it resumes."""
        values = self.values(run_dir, restart)
        argv = [expand(a, values) for a in self.argv]
        resumes = self.resumable(run_dir, values)
        argv += [expand(a, values) for a in self.resume.args] if resumes else []
        is_python = os.path.basename(argv[0]) in ("python", "python3")
        if self.nproc > 1:
            script = argv[1:] if is_python else ["--no-python", *argv]
            return [
                python,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={self.nproc}",
                *script,
            ], resumes
        return ([python, *argv[1:]] if is_python else argv), resumes

    def resumable(self, run_dir: Path, values: dict[str, str]) -> bool:
        if self.resume.when:
            return bool(glob.glob(expand(self.resume.when, values)))
        return latest_checkpoint(run_dir / "checkpoints") is not None


SCRIPT_SUFFIXES = frozenset({".py", ".sh", ".bash", ".pl", ".rb", ".jl", ".R", ".lua"})


def expand(text: str, values: dict[str, str]) -> str:
    return text.format_map(values)


def _check_placeholders(text: str, where: str) -> str:
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
    except ValueError as e:
        raise Bad(f"{where}: {text!r}: {e} — write a literal brace as {{{{ or }}}}") from None
    unknown = [n for n in names if n not in PLACEHOLDERS]
    if unknown:
        raise Bad(
            f"{where}: {text!r} uses {{{unknown[0]}}}, which enlace does not fill — the placeholders are "
            f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)} (a literal brace: {{{{ or }}}})",
        )
    return text


def _inside(data: tuple[str, ...], outputs: tuple[str, ...], where: str) -> None:
    """data under the project's data/ (what `data push` brings; the server's own files are no run's data) and
    outputs under the run directory (what fetch brings back): refused where the page's check lets them through."""
    for pattern in data:  # ({stdlib}: the server's own Python's sources, as enlace's smoke corpus reads them)
        if STDLIB not in pattern and data_relative(pattern) is None:
            raise Bad(outside_words(pattern, f"{where}: data"))
    for pattern in outputs:
        if pattern.startswith("/") or ".." in pattern.split("/"):
            raise Bad(
                f"{where}: outputs: {pattern!r} is outside the run directory — outputs are globs under it, e.g. "
                '["out/*"] for {run_dir}/out/'
            )


def _strings(value: Any, where: str, fix: str, empty_ok: bool = True) -> tuple[str, ...]:
    if isinstance(value, str) and empty_ok:  # one glob for a list of them (never for the argv: it is not split)
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v and "\0" not in v for v in value):
        raise Bad(f"{where}: {value!r} is not a list of strings — {fix}")
    if not value and not empty_ok:
        raise Bad(f"{where}: is empty — {fix}")
    return tuple(_check_placeholders(v, where) for v in value)


# the most each may be: what `enlace start` takes (restarts, backoff), and what a stop or a host can use
HIGH = {"nproc": 1024, "supervise.restarts": 100, "supervise.backoff": 3600, "supervise.grace": contract.MAX_GRACE_S}


def _number(value: Any, where: str, low: float, whole: bool, fix: str) -> Any:
    kinds = (int,) if whole else (int, float)
    high = next((h for key, h in HIGH.items() if where.endswith(key)), math.inf)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high or value != value:
        span = f"from {low:g} to {high:g}" if high != math.inf else f"≥ {low:g}"
        raise Bad(f"{where}: {value!r} is not a {'whole ' if whole else ''}number {span} — {fix}")
    return value


def _mapping(value: Any, where: str, keys: tuple[str, ...], fix: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Bad(f"{where}: {value!r} is not a mapping — {fix}")
    for key in value:
        if key not in keys:
            joined = f"{where}.{key}" if ": " in where else f"{where}: {key}"  # a section's key, or the file's
            raise Bad(f"{joined}: unknown key — valid: {', '.join(keys)}")
    return value


def parse(layer: Any, where: str, default_name: str | None, recorded: bool = False) -> CommandRun:
    """A command run file's mapping (or the JSON form), every key checked: one ConfigError naming the key.
    `recorded`: run.json's copy of a command launched before, read again (fetch, restarts): its data and outputs
    are not refused again by a rule newer than its launch (its fetch would bring nothing back)."""
    doc = _mapping(layer, where, KEYS, f"a run file holds {EXAMPLE} and the keys in docs/own-script.md")
    argv = _strings(doc.get("command"), f"{where}: command", f"an argv list, e.g. {EXAMPLE}", empty_ok=False)
    name = doc.get("run_name") or default_name
    if not name:
        raise Bad(f"{where}: run_name: missing — name the run (launch --name NAME)")
    name = validate_run_name(name, where)
    env = doc.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and ENV_NAME.fullmatch(k) for k in env):
        raise Bad(f"{where}: env: {env!r} is not a mapping of variable names to values")
    env = {k: _check_placeholders(str(v), f"{where}: env.{k}") for k, v in env.items()}
    sup = _mapping(
        doc.get("supervise"),
        f"{where}: supervise",
        ("restarts", "stall_timeout", "grace", "backoff"),
        "see docs/own-script.md",
    )
    res = _mapping(
        doc.get("resume"),
        f"{where}: resume",
        ("args", "when"),
        'e.g. {args: ["--init_from=resume"], when: "{run_dir}/out/ckpt.pt"}',
    )
    stall = sup.get("stall_timeout")
    device = doc.get("device", "cpu")
    if device not in ("cpu", "cuda", "auto"):
        raise Bad(f"{where}: device: {device!r} — use cpu, cuda or auto")
    when = res.get("when")
    data = _strings(doc.get("data") or [], f"{where}: data", 'globs in the repo, e.g. ["data/shakespeare_char/*.bin"]')
    outputs = _strings(doc.get("outputs") or [], f"{where}: outputs", 'globs under the run directory, e.g. ["out/*"]')
    if not recorded:
        _inside(data, outputs, where)
    return CommandRun(
        argv=argv,
        run_name=name,
        data=data,
        outputs=outputs,
        nproc=_number(doc.get("nproc", 1), f"{where}: nproc", 1, True, "processes (torchrun when > 1), e.g. 2"),
        device=device,
        env=env,
        supervise=Supervise(
            restarts=_number(sup.get("restarts", contract.RESTARTS), f"{where}: supervise.restarts", 0, True, "e.g. 3"),
            stall_timeout=None
            if stall is None
            else float(_number(stall, f"{where}: supervise.stall_timeout", 1, False, "seconds, e.g. 600")),
            grace=float(_number(sup.get("grace", GRACE_S), f"{where}: supervise.grace", 0, False, "seconds, e.g. 30")),
            backoff=float(
                _number(
                    sup.get("backoff", contract.BACKOFF_S), f"{where}: supervise.backoff", 0, False, "seconds, e.g. 10"
                )
            ),
        ),
        resume=Resume(
            args=_strings(res.get("args") or [], f"{where}: resume.args", 'e.g. ["--init_from=resume"]'),
            when=_strings(when, f"{where}: resume.when", 'a glob, e.g. "{run_dir}/out/ckpt.pt"')[0] if when else None,
        ),
    )


def is_command(layer: Any) -> bool:
    """Whether a run file's mapping is a command run (it has `command:`)."""
    return isinstance(layer, dict) and "command" in layer


ADHOC = "launch -- COMMAND"  # where a command given after `--` comes from, as its errors say


def adhoc(argv: list[str], run_name: str, overrides=()) -> CommandRun:
    """`launch --name NAME -- ARGV...`: the command with enlace's defaults, and launch's --set args.NAME=V and
    env.NAME=V applied (they were ignored, without a word)."""
    where = ADHOC
    if any(item.partition("=")[0] == "run_name" for item in overrides):
        raise Bad(f"--set run_name: {where} takes its run's name from --name NAME alone")
    return parse(with_sets({"command": list(argv), "run_name": run_name}, overrides, where), where, default_name=None)


def run_file(run: str, root: Path) -> Path:
    """configs/runs/RUN.yaml, or RUN itself when it is a path to a YAML file (as enlace's run files)."""
    if run.endswith((".yaml", ".yml")) or "/" in run:
        return Path(run) if Path(run).is_absolute() else root / run
    return root / "configs" / "runs" / f"{run}.yaml"


def load(run: str, root: Path | None = None, overrides=()) -> CommandRun | None:
    """RUN's run file as a command run, `overrides` (--set) applied; None when it is one of enlace's trainer (or is
    not there: the trainer's loader says so)."""
    root = find_root(root)
    path = run_file(run, root)
    if not path.is_file():
        return None
    where = str(path.relative_to(root) if path.is_relative_to(root) else path)
    layer = read_yaml(path, "run", where)
    if not is_command(layer):
        return None
    return parse(with_sets(layer, overrides, where), where, default_name=path.stem)


def with_sets(layer: dict, overrides, where: str) -> dict:
    """The run file's mapping with launch's (or a sweep point's) --set applied, in the order given: `run_name=NAME`,
    `env.NAME=VALUE` (an environment variable of the command) and `args.NAME=VALUE` (`--NAME=VALUE` appended to
    the command in place of any earlier `--NAME=...`: argparse, Hugging Face's HfArgumentParser and nanoGPT's
    configurator all read that form)."""
    layer = dict(layer)
    for item in overrides:
        key, _, value = item.partition("=")
        section, dot, name = key.partition(".")
        if key == "run_name":
            layer["run_name"] = value
        elif dot and section == "env" and ENV_NAME.fullmatch(name):
            env = layer.get("env") or {}  # not a mapping: left as it is, for parse to name the file's fault
            layer["env"] = {**env, name: _check_placeholders(value, f"--set {key}")} if isinstance(env, dict) else env
        elif dot and section == "args" and ARG_NAME.fullmatch(name):
            argv, flag = layer.get("command"), f"--{name}="
            arg = flag + _check_placeholders(value, f"--set {key}")
            if isinstance(argv, list):  # (not a list: parse names it) an earlier --NAME=V gives way: one value
                layer["command"] = [*(a for a in argv if not (isinstance(a, str) and a.startswith(flag))), arg]
        else:
            file = where != ADHOC  # (launch -- COMMAND: named by --name, its own arguments given after `--`)
            raise Bad(
                f"--set {key}: {where} runs your own command, which takes --set {'run_name=NAME, ' * file}"
                "env.NAME=VALUE (an environment variable) or args.NAME=VALUE (--NAME=VALUE appended to the command) "
                f"— anything else belongs in {'the run file' if file else 'the command after `--`'}"
            )
    return layer


def from_spec(spec: str, run_name: str) -> CommandRun:
    """A command given as JSON (`--command-spec`: launch's `-- ARGV`, start's), checked as a run file is."""
    try:
        doc = json.loads(spec)
    except json.JSONDecodeError as e:
        raise Bad(f"--command-spec: not JSON ({e.msg})") from None
    own = parse(doc, "--command-spec", default_name=None)  # a launch: checked in full
    if own.run_name != run_name:
        raise Bad(f"--command-spec: run_name {own.run_name!r} is not the run's name {run_name!r}")
    return own


def check_answer(own: CommandRun, run: str, root: Path | None) -> dict[str, Any]:
    """check-config --json for a command run, in the trainer's answer's shape: its run file and the scripts its
    argv names (verify checks they arrived), what it queues for (runtime.device)."""
    path = run_file(run, find_root(root))
    files = {"run": str(path)} if path.is_file() else {}  # launch's `-- ARGV` has no run file
    files |= {f"script {s}": s for s in own.scripts()}
    doc = {"ok": True, "kind": "command", "run_name": own.run_name, "files": files, "warnings": []}
    return doc | {"resume_problem": None, "command": own.to_doc(), "config": {"runtime": {"device": own.device}}}
