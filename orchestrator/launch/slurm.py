"""enlace-remote's side of a Slurm host: submit a run (`enlace submit` on the login node), run a verb
as a short job on a compute node (`enlace on-node`), and the batch script for users who submit it
themselves (`launch --slurm --print`). What the job does is enlace/slurm/job.py's."""

from __future__ import annotations

import dataclasses
import json
import shlex

import click

from enlace.contract import trainer_args
from enlace.hashing import venv_key
from enlace.slurm.settings import SlurmSpec, asks_gpu, job_script, job_step_args
from orchestrator.ssh.session import Session


def spec_for(spec: SlurmSpec, nodes: int | None) -> SlurmSpec:
    """The host's settings with launch's --nodes (when given) in place of its `nodes`."""
    return dataclasses.replace(spec, nodes=nodes) if nodes else spec


def on_node(spec: SlurmSpec, args: tuple[str, ...]) -> tuple[str, ...]:
    """`enlace ARGS` as `enlace on-node`: srun on a compute node (login nodes have no GPU)."""
    return ("on-node", "--slurm", json.dumps(spec.to_json()), "--", *args)


def submit(
    session: Session, sha: str, run_name: str, spec: SlurmSpec, gpus: int, pyargs: list[str], extra: list[str] = ()
) -> dict:
    """sbatch the run on the login node; its job id goes into run.json. Not retried after a dropped
    session (it may have been submitted): a rerun says the run is live. `extra`: a command's --command-spec."""
    doc = session.enlace_json(
        sha,
        "submit",
        run_name,
        "--slurm",
        json.dumps(spec.to_json()),
        "--gpus",
        str(gpus),
        *extra,
        "--",
        *pyargs,
        idempotent=False,
    )
    click.echo(
        f"submitted {run_name} to Slurm on {session.host.name}: job {doc['job_id']} (script "
        f"runs/{run_name}/slurm/job-{doc['job_id']}.sh), commit {sha[:12]}",
        err=True,
    )
    return doc


def print_script(spec: SlurmSpec, host, repo, commit: str, run: str, run_name: str, gpus: int, train_args) -> str:
    """The batch script for a user who submits it on the cluster's login node: absolute paths to the synced
    tree of `commit` and the server's python (as setup/sync build them), the same #SBATCH settings and job
    step (time-limit checkpoint and requeue) as `launch` uses — one job_script for both."""
    rd = host.remote_dir
    base = '"$HOME"' + shlex.quote(rd[1:]) if rd == "~" or rd.startswith("~/") else shlex.quote(rd)
    tree = f"{base}/trees/{commit}"
    venv = f"{base}/venvs/{venv_key(repo)}/bin/python"  # the venv remote.sh builds for this tree
    python = venv if host.python == "venv" else shlex.quote(host.python)
    job = job_step_args(spec, run_name, gpus, trainer_args(run, train_args))
    header = (
        f"enlace run {run_name} for host {host.name}: commit {commit[:12]}'s tree and the server's python, as\n"
        f"`enlace-remote --host {host.name} sync` leaves them (sync first). Submit it on the login node:\n"
        "sbatch THIS_FILE. Its output is the run's train.log. Near the time limit the trainer checkpoints\n"
        "and the job requeues itself (up to max_requeues)."
    )
    if "--resume" in train_args:  # a script kept and submitted again later would start over each time
        where = train_args[train_args.index("--resume") + 1]
        header += (
            f"\nIt starts the run at --resume {where} (a new line; its requeues go on from that line).\n"
            "Submitted again later, it starts there again: to continue the run, print it without --resume."
        )
    env = {"ENLACE_COMMIT": commit, "PYTHONUNBUFFERED": "1"}
    return job_script(spec, run_name, tree, python, env, job, header, log_here=True)


def slurm_options(remote, slurm: bool, print_only: bool, nodes: int | None, hosts: str | None, gpus: str | None):
    """The Slurm settings: the host's (with --nodes); for --print on a plain host, defaults asking for --gpus."""
    if print_only and not slurm:
        raise click.UsageError("--print goes with --slurm: `launch RUN --slurm --print`")
    if hosts:
        raise click.UsageError("--hosts is for plain SSH hosts; on Slurm, --nodes K asks the scheduler for K nodes")
    if not remote.host.slurm and not print_only:
        raise click.UsageError(
            f"host {remote.host.name} is not a Slurm host: add `scheduler: slurm` (and partition, "
            "time, ...) to its hosts.yaml entry (README: On a Slurm cluster), or print a script "
            "to submit yourself with --slurm --print"
        )
    plain = SlurmSpec(gpus_per_node=int(gpus) if gpus and gpus.isdigit() else 0)
    return spec_for(remote.host.slurm or plain, nodes)


def nproc_of(gpus: str | None, spec) -> int | str | None:
    """Processes per node: --gpus; on Slurm, the host's gpus_per_node by default (1 on a CPU partition)."""
    if gpus is not None and gpus != "all" and not (gpus.isdigit() and int(gpus) >= 1):
        raise click.BadParameter(f"{gpus!r}: a number of GPUs (processes) or `all`", param_hint="--gpus")
    if not spec:
        return gpus
    if gpus == "all":
        return spec.gpus_per_node or 1
    n = int(gpus) if gpus else (spec.gpus_per_node or 1)
    if spec.gpus_per_node and n > spec.gpus_per_node:
        raise click.BadParameter(
            f"{n} processes per node, but the host's jobs ask for gpus_per_node: {spec.gpus_per_node}",
            param_hint="--gpus",
        )
    return n


def no_gpu_asked(spec: SlurmSpec, host: str, run_name: str, device: str | None) -> str | None:
    """Why a CUDA run cannot start on this Slurm host (its jobs ask Slurm for no GPU), or None. A job asking none
    queued, started on a node without a GPU and failed there, where a plain host refuses it at verify (exit 3)."""
    if not device or not device.startswith("cuda") or asks_gpu(spec):
        return None
    return (
        f"{run_name}: runtime.device is {device}, but the Slurm host {host} asks its jobs for no GPU (no "
        f"gpus_per_node, no GPU option in extra_sbatch): it would start on a node without one — add "
        f"gpus_per_node: N to {host} in hosts.yaml (also where its partition gives every job GPUs by itself), or "
        "train on CPU (--set runtime.device=cpu --set runtime.precision=fp32)"
    )
