"""Slurm, seen from the login node: a host's Slurm settings, the batch script, submission, the job's
state, stopping it. The job's own side (the batch step that runs the trainer, turns Slurm's
signals into checkpoints and requeues itself) is enlace/slurm/job.py.

Stdlib only: the driver validates hosts.yaml with `spec_from` without importing torch, and the
server verbs answer in milliseconds. Every value that reaches the batch script is checked here
(one line, a known shape), paths are shlex-quoted, and sbatch gets its arguments as an argv.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from enlace import contract
from enlace.errors import EnlaceError

KEYS = contract.SLURM_KEYS  # the hosts.yaml keys of a Slurm login node (the contract owns them)
WORD_RE = re.compile(r"[A-Za-z0-9_.,:+-]{1,128}")  # partition, account, qos
TIME_RE = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")  # Slurm's MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
MEM_RE = re.compile(r"\d+[KMGT]?")
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"})
# Job states in which the run is still Slurm's business (queued, running or being requeued)
LIVE_STATES = QUEUED_STATES | {"CONFIGURING", "RUNNING", "COMPLETING", "RESIZING", "SUSPENDED", "SIGNALING"}
LIVE_STATES |= {"STAGE_OUT", "STOPPED"}
# pending reasons that mean the job, as asked, waits for a limit to change rather than for its turn
WILL_NOT_START = {
    "PartitionTimeLimit": "its time is over the partition's limit",
    "PartitionNodeLimit": "its node count is outside the partition's limits (or those nodes are down)",
    "QOSMaxWallDurationPerJobLimit": "its time is over its QOS's limit",
    "QOSMaxNodePerJobLimit": "its node count is over its QOS's limit",
    "BadConstraints": "no node has what its constraints ask",
    "InvalidAccount": "its account is not valid",
    "InvalidQOS": "its QOS is not valid",
}


# sbatch options that ask for GPUs: any of them, or gpus_per_node, makes the job a GPU job
GPU_OPTIONS = (
    "--gpus",
    "-G",
    "--gpus-per-node",
    "--gpus-per-task",
    "--gpus-per-socket",
    "--gres",
    "--tres-per-node",
    "--tres-per-task",
)


def option_name(line: str) -> str:
    """An sbatch option's name as an extra_sbatch line gives it: `--gres=gpu:1` and `--gres gpu:1` → --gres,
    `-G1` and `-G 1` → -G."""
    word = line.split("=", 1)[0].split()[0] if line.strip() else ""
    return word if word.startswith("--") else word[:2]


def asks_gpu(spec: SlurmSpec) -> bool:
    """Whether the host's jobs ask Slurm for a GPU: gpus_per_node, or an extra_sbatch option that asks for more
    than none (a --gres or --tres-* counts only its gpu items: `--gres=gpu:1,tmpdisk:0` asks; `-G 0` does not)."""
    for line in spec.extra_sbatch:
        name = option_name(line)
        if name not in GPU_OPTIONS:
            continue
        items = line[len(name) :].strip(" =").split("#")[0].strip().split(",")
        items = [i for i in items if "gpu" in i] if name.startswith(("--gres", "--tres")) else items
        if any(not (count := i.rsplit(":", 1)[-1].strip()).isdigit() or int(count) > 0 for i in items if i):
            return True
    return bool(spec.gpus_per_node)


class SlurmError(EnlaceError):
    exit_code = contract.USAGE


@dataclass(frozen=True)
class SlurmSpec:
    """A Slurm host's job settings (hosts.yaml, `scheduler: slurm`)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None  # the job's limit, in Slurm's format (minutes, HH:MM:SS, D-HH:MM, ...)
    gpus_per_node: int = 0  # GPUs each node's job asks for (0: a CPU partition, no GRES request)
    cpus_per_task: int | None = None
    mem: str | None = None
    nodes: int = 1
    extra_sbatch: tuple[str, ...] = field(default_factory=tuple)  # raw `#SBATCH` options, one per line
    max_requeues: int = 3  # self-requeues at the time limit before the run is left stopped
    signal_grace: int = 120  # seconds before the limit at which the trainer is told to checkpoint

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "extra_sbatch": list(self.extra_sbatch)}


EARLY_S = 60  # Slurm's docs: the --signal may come up to 60 s before the time asked for


def time_limit_s(text: str) -> int:
    """Slurm's time format in seconds: "60" is 60 minutes, "1:30" 1 min 30 s, "2-12" 2 days 12 hours."""
    m = TIME_RE.fullmatch(text)
    if not m:
        raise ValueError(text)
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    if c is not None:  # HH:MM:SS
        return int(a) * 3600 + int(b) * 60 + int(c)
    return int(a) * 60 + int(b or 0)  # MM or MM:SS


def spec_from(entry: dict[str, Any], where: str) -> SlurmSpec:
    """A SlurmSpec from a hosts.yaml entry (or the JSON the driver sends); one clear error naming the key."""

    def bad(key: str, want: str) -> SlurmError:
        return SlurmError(f"{where}: {key}: {entry[key]!r} — expected {want}")

    out: dict[str, Any] = {}
    for key in ("partition", "account", "qos"):
        if entry.get(key) is not None:
            if not isinstance(entry[key], str) or not WORD_RE.fullmatch(entry[key]):
                raise bad(key, "a Slurm name of [A-Za-z0-9_.,:+-], e.g. gpu")
            out[key] = entry[key]
    for key, low in (
        ("gpus_per_node", 0),
        ("cpus_per_task", 1),
        ("nodes", 1),
        ("max_requeues", 0),
        ("signal_grace", 10),
    ):
        if entry.get(key) is not None:
            if isinstance(entry[key], bool) or not isinstance(entry[key], int) or entry[key] < low:
                raise bad(key, f"a whole number ≥ {low}")
            out[key] = entry[key]
    if entry.get("time") is not None:
        text = str(entry["time"])
        if isinstance(entry["time"], bool) or not TIME_RE.fullmatch(text) or time_limit_s(text) <= 0:
            raise bad("time", "Slurm's time format: minutes (60), HH:MM:SS (4:00:00) or D-HH:MM (1-12:00)")
        out["time"] = text
    if entry.get("mem") is not None:
        if not MEM_RE.fullmatch(str(entry["mem"])):
            raise bad("mem", "a size such as 64G or 16000M")
        out["mem"] = str(entry["mem"])
    extra = entry.get("extra_sbatch") or []
    if not isinstance(extra, list) or not all(isinstance(x, str) for x in extra):
        raise bad("extra_sbatch", "a list of sbatch options, e.g. ['--constraint=a100', '--exclusive']")
    lines = tuple(x.strip().removeprefix("#SBATCH").strip() for x in extra)
    for line in lines:
        try:  # preflight's srun takes it as argv words (shlex.split), as sbatch reads the #SBATCH line
            words = shlex.split(line, comments=True)
        except ValueError as e:  # an unbalanced quote
            raise SlurmError(f"{where}: extra_sbatch: {line!r} — {e} (close the quote)") from None
        if not line.startswith("-") or not words or any(c in line for c in "\n\r\0"):
            raise SlurmError(
                f"{where}: extra_sbatch: {line!r} — each item is one sbatch option starting with "
                "`-`, e.g. --constraint=a100"
            )
    out["extra_sbatch"] = lines
    spec = SlurmSpec(**out)
    limit = time_limit_s(spec.time) if spec.time else None
    if limit is not None and spec.signal_grace + EARLY_S >= limit:  # seen: every start signalled at once
        raise SlurmError(
            f"{where}: signal_grace {spec.signal_grace}s, and the up to {EARLY_S}s early that Slurm may signal, "
            f"leave no time to train in the job's time {spec.time} ({limit}s): the signal would come as it "
            f"starts — set signal_grace below {limit - EARLY_S}s, or ask for more time"
            if limit > EARLY_S
            else f"{where}: the job's time {spec.time} ({limit}s) leaves no time to train: Slurm may signal "
            f"the trainer up to {EARLY_S}s before the limit, plus signal_grace ({spec.signal_grace}s) — ask for more time"
        )
    return spec


def sbatch_lines(spec: SlurmSpec, job_name: str, gpus: int) -> list[str]:
    """The #SBATCH header for a run: the host's settings, requeue on, B:USR1 before the limit."""
    opts = [f"--job-name={job_name}", f"--nodes={spec.nodes}", "--ntasks-per-node=1"]
    opts += [
        f"--{k}={v}"
        for k, v in (("partition", spec.partition), ("account", spec.account), ("qos", spec.qos), ("time", spec.time))
        if v
    ]
    if gpus:
        opts.append(f"--gpus-per-node={gpus}")
    if spec.cpus_per_task:
        opts.append(f"--cpus-per-task={spec.cpus_per_task}")
    if spec.mem:
        opts.append(f"--mem={spec.mem}")
    # B: the batch step alone gets USR1 (enlace's job step turns it into one SIGTERM for the trainer)
    opts += ["--requeue", "--open-mode=append", f"--signal=B:USR1@{spec.signal_grace}", *spec.extra_sbatch]
    return [f"#SBATCH {o}" for o in opts]


def job_script(
    spec: SlurmSpec,
    run_name: str,
    tree: str,
    python: str,
    env: dict[str, str],
    job_args: list[str],
    header: str,
    log_here: bool = False,
) -> str:
    """A run's batch script: it execs `enlace slurm-job` in the synced tree, so Slurm's signals reach Python
    directly (no bash trap, no `wait` dance). `tree` and `python` are shell words (quoted, or "$HOME"/...);
    `log_here`: the script sends its own output to the run's train.log (a script a user submits, where
    #SBATCH --output cannot name a path under $HOME); `launch` passes sbatch --output instead."""
    env = dict(env)
    path = shlex.quote(env.pop("PYTHONPATH")) if env.get("PYTHONPATH") else tree  # a server half first, if any
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    log = f"{tree}/runs/{run_name}"
    return "\n".join(
        [
            "#!/bin/bash",
            *(f"# {line}" for line in header.splitlines()),
            *sbatch_lines(spec, f"enlace-{run_name}", spec.gpus_per_node),
            *(
                [f"#SBATCH --output=enlace-{run_name}-%j.out", f"mkdir -p {log} && exec >>{log}/train.log 2>&1"]
                if log_here
                else []
            ),
            f"export {exports} ENLACE_ROOT={tree} PYTHONPATH={path}",
            # submitted by hand, no launch names the job: its id does, the same across its requeues (a requeue
            # of `--resume none` goes on from the line it began, not from step 0: trainerchild.again_argv)
            *([f'export {contract.LAUNCH_ID_ENV}="slurm-$SLURM_JOB_ID"'] if log_here else []),
            f"cd {tree}",
            "trap '' USR1  # ignored until Python's handler is in place: by default USR1 would kill the step",
            f"exec {python} -m enlace slurm-job {shlex.join(job_args)}",
            "",
        ]
    )


def array_script(
    spec: SlurmSpec,
    sweep: str,
    tasks: list[dict[str, Any]],
    gpus: int,
    limit: int | None,
    tree: str,
    python: str,
    env: dict[str, str],
    header: str,
) -> str:
    """A sweep's job array: task i is tasks[i] ({"run", "launch_id", "pyargs"}), run as the batch step a single
    run's job runs — its output the run's own train.log, its requeue its own — at most `limit` at once."""
    env = dict(env)
    path = shlex.quote(env.pop("PYTHONPATH")) if env.get("PYTHONPATH") else tree  # a server half first, if any
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    arms = []
    for i, task in enumerate(tasks):
        step = job_step_args(spec, task["run"], gpus, task["pyargs"])
        log = f"{tree}/runs/{task['run']}"
        arms.append(
            f"  {i}) mkdir -p {log} && exec >>{log}/train.log 2>&1; "
            f"export {contract.LAUNCH_ID_ENV}={shlex.quote(task['launch_id'])}; set -- {shlex.join(step)} ;;"
        )
    return "\n".join(
        [
            "#!/bin/bash",
            *(f"# {line}" for line in header.splitlines()),
            *sbatch_lines(spec, f"enlace-sweep-{sweep}", spec.gpus_per_node),
            f"#SBATCH --array=0-{len(tasks) - 1}" + (f"%{limit}" if limit else ""),
            "trap '' USR1  # ignored until Python's handler is in place: by default USR1 would kill the step",
            f"export {exports} ENLACE_ROOT={tree} PYTHONPATH={path}",
            f"cd {tree}",
            'case "$SLURM_ARRAY_TASK_ID" in',
            *arms,
            '  *) echo "enlace: this array has no task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;',
            "esac",
            f'exec {python} -m enlace slurm-job "$@"',
            "",
        ]
    )


def job_step_args(spec: SlurmSpec, run_name: str, gpus: int, pyargs: list[str]) -> list[str]:
    """The arguments of `enlace slurm-job` (the batch step) for a run: one owner for both the submitted
    script and the one `launch --slurm --print` shows."""
    return [
        run_name,
        "--gpus",
        str(gpus),
        "--nodes",
        str(spec.nodes),
        "--max-requeues",
        str(spec.max_requeues),
        "--signal-grace",
        str(spec.signal_grace),
        "--",
        *pyargs,
    ]


# -- the job's state --------------------------------------------------------------------------

_cache: dict[str, tuple[float, dict[str, Any]]] = {}


def job_info(job_id: str, max_age: float = 2.0) -> dict[str, Any]:
    """{"state", "reason", "restarts", "exit_code"} from `scontrol show job` (sacct when scontrol has
    forgotten the job and the cluster keeps accounting); state None when nobody knows it. Cached for
    `max_age` s: `logs -f` and `wait` ask often."""
    hit = _cache.get(job_id)
    if hit and time.monotonic() - hit[0] < max_age:
        return hit[1]
    info: dict[str, Any] = {"state": None, "reason": None, "restarts": None, "exit_code": None}
    out = _run(["scontrol", "show", "job", job_id, "-o"])
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f) if out else {}
    if fields.get("JobState"):
        info = {
            "state": fields["JobState"],
            "reason": fields.get("Reason") if fields.get("Reason") != "None" else None,
            "restarts": int(fields.get("Restarts", 0) or 0),
            "exit_code": fields.get("ExitCode"),
        }
    elif shutil.which("sacct"):
        state = (_run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"]) or "").strip().split("\n")[0]
        if state:
            info["state"] = state.split()[0]  # "CANCELLED by 0" → CANCELLED
    _cache[job_id] = (time.monotonic(), info)
    return info


def _run(argv: list[str]) -> str | None:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def time_left_s(job_id: str) -> int | None:
    """Seconds before the job's time limit (squeue %L: [D-][H:]M:S), None if unlimited or unknown."""
    out = (_run(["squeue", "-h", "-j", job_id, "-o", "%L"]) or "").strip()
    days, _, clock = out.rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or (not days.isdigit() and days):
        return None
    secs = sum(int(p) * 60**i for i, p in enumerate(reversed(parts)))
    return secs + int(days or 0) * 86400


def job_alive(job_id: str) -> bool:
    return job_info(job_id)["state"] in LIVE_STATES


def forget(job_id: str) -> None:
    _cache.pop(job_id, None)


# -- submit, stop ------------------------------------------------------------------------------


def submit(script: str, script_dir: Path, output: Path) -> str:
    """sbatch the script, its output appended to `output` (a run's train.log; an array's per-task file, where
    %a is the task); keep it as SCRIPT_DIR/job-ID.sh."""
    if not shutil.which("sbatch"):
        raise SlurmError(
            "sbatch not found on this host: a Slurm host in hosts.yaml must be a login node with the "
            "Slurm client commands on PATH"
        )
    if "%" in str(output.parent):
        raise SlurmError(
            f"{output.parent}: sbatch would read the % in this path as a pattern — use a remote_dir without %"
        )
    script_dir.mkdir(parents=True, exist_ok=True)
    tmp = script_dir / f".job-{os.getpid()}.sh"
    tmp.write_text(script)
    try:
        r = subprocess.run(
            ["sbatch", "--parsable", f"--output={output}", str(tmp)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode != 0:
            raise SlurmError(f"sbatch refused the job: {(r.stderr or r.stdout).strip()[-500:]}")
        job_id = r.stdout.strip().split(";")[0]  # "ID" or "ID;cluster"
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {r.stdout.strip()!r}, not a job id")
        os.replace(tmp, script_dir / f"job-{job_id}.sh")
    finally:
        tmp.unlink(missing_ok=True)
    return job_id


def cancel(job_id: str, signal_name: str | None = None) -> None:
    """scancel the job; with `signal_name`, only signal it — every step *and* the batch step (--full)."""
    argv = ["scancel", *([f"--signal={signal_name}", "--full"] if signal_name else []), job_id]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    forget(job_id)
    if r.returncode != 0:
        raise SlurmError(f"{shlex.join(argv)} failed: {(r.stderr or r.stdout).strip()[-300:]}")
