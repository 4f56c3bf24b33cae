"""A short job on a compute node (`enlace on-node`: preflight on a Slurm host, whose login node has no GPU):
srun with the host's settings, its queue messages passed on as they come, and the two ways such a job would
never run said as one error (exit 2) instead of a hang or srun's lines twice: Slurm refusing it at submission
(an invalid partition, account, qos or constraint) and a pending reason that waits for a limit to change (its
time over the partition's, ...). Standard library and Slurm's commands."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import threading
import time

from enlace.slurm.settings import GPU_OPTIONS, WILL_NOT_START, SlurmError, SlurmSpec, option_name, time_limit_s

POLL_S = 2.0  # how often the job's pending reason is read while srun waits
REFUSED = re.compile(r"srun: error: (Unable to allocate resources: .*|invalid .*)", re.IGNORECASE)
# extra_sbatch options that choose the node, or what the job is charged to (srun takes them as sbatch does):
# preflight measures the node the job will get; the others (mail, output, requeue, ...) are the batch job's own
NODE_OPTIONS = frozenset(
    [
        "--constraint",
        "-C",
        "--gres",
        "--reservation",
        "--exclude",
        "-x",
        "--nodelist",
        "-w",
        "--exclusive",
        "--clusters",
        "-M",
        "--cluster-constraint",
        "--mem-per-cpu",
        "--mem-per-gpu",
        "--tmp",
        "--switches",
        "--cpus-per-gpu",
        "--partition",
        "-p",
        "--account",
        "-A",
        "--qos",
        "-q",
    ]
) | frozenset(GPU_OPTIONS)


def minutes_for(spec: SlurmSpec, asked: int) -> int:
    """The job's time limit: `asked`, or the host's own job time where that is shorter (a partition that takes
    the host's jobs takes this one; 15 minutes over a 10-minute partition waited for ever)."""
    return max(1, min(asked, time_limit_s(spec.time) // 60)) if spec.time else asked


def srun_argv(spec: SlurmSpec, job_name: str, minutes: int) -> list[str]:
    """`srun` for a short job on one compute node (preflight): the host's partition, GPU request and the
    extra_sbatch options that choose the node."""
    argv = ["srun", "--nodes=1", "--ntasks=1", f"--job-name={job_name}", f"--time={minutes}"]
    argv += [
        f"--{k}={v}"
        for k, v in (("partition", spec.partition), ("account", spec.account), ("qos", spec.qos), ("mem", spec.mem))
        if v
    ]
    if spec.gpus_per_node:
        argv.append(f"--gpus-per-node={spec.gpus_per_node}")
    if spec.cpus_per_task:
        argv.append(f"--cpus-per-task={spec.cpus_per_task}")
    return [*argv, *node_options(spec)]


def node_options(spec: SlurmSpec) -> list[str]:
    """The host's extra_sbatch lines that choose the node (a --constraint=a100 left out measured another card)."""
    chosen = [line for line in spec.extra_sbatch if option_name(line) in NODE_OPTIONS]
    return [w for line in chosen for w in shlex.split(line, comments=True)]  # `--gres gpu:1`: two argv words


def run(argv: list[str], name: str, minutes: int) -> int:
    """srun `argv` (its job named `name`): its exit code, or SlurmError where the job would never run."""
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, errors="replace")
    said: list[str] = []
    reader = threading.Thread(target=_pass_on, args=(proc.stderr, said), daemon=True)
    reader.start()
    pending = True  # squeue is asked only until the job leaves the queue (not for the whole preflight)
    while proc.poll() is None:
        if pending:
            pending, reason = _pending(name)
        if not pending:
            proc.wait()
        elif reason in WILL_NOT_START:
            subprocess.run(["scancel", f"--name={name}"], capture_output=True)
            proc.wait()
            raise SlurmError(
                f"the compute-node job (srun --time={minutes}) is pending for {reason}: {WILL_NOT_START[reason]}, "
                "so it would never start (cancelled) — ask for what the partition allows: the host's time, "
                "partition, qos or account in hosts.yaml (`sinfo` shows the partitions' limits)"
            )
        else:
            time.sleep(POLL_S)
    reader.join(timeout=10)
    refused = next((m.group(1) for line in said if (m := REFUSED.search(line))), None)
    if proc.returncode and refused:  # nothing ran: srun's own error, once, as the host's settings to fix
        raise SlurmError(
            f"Slurm refused the compute-node job: {refused} — check the host's partition, account, qos, "
            "gpus_per_node, mem and extra_sbatch in hosts.yaml"
        )
    return proc.returncode


def _pass_on(stream, said: list[str]) -> None:
    """srun's stderr to ours as it comes (its queue messages are the user's progress), and kept."""
    for line in stream:
        said.append(line)
        sys.stderr.write(line)
        sys.stderr.flush()


def _pending(name: str) -> tuple[bool, str]:
    """Whether the job is still queued (or not listed yet: srun may not have submitted it), and its reason."""
    try:
        out = subprocess.run(
            ["squeue", f"--name={name}", "--noheader", "--format=%T %r"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return True, ""
    state, _, reason = (out.splitlines() or ["PENDING "])[0].partition(" ")
    return state == "PENDING", reason.strip()
