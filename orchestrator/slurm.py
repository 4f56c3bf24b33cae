"""enlace-remote's side of a Slurm host: submit a run (`enlace submit` on the login node), run a verb
as a short job on a compute node (`enlace on-node`), and the batch script for users who submit it
themselves (`launch --slurm --print`). What the job does is enlace/slurm_job.py's."""

from __future__ import annotations

import dataclasses
import json
import shlex

import click

from enlace.slurm import SlurmSpec, job_step_args, sbatch_lines
from orchestrator.session import Session


def spec_for(spec: SlurmSpec, nodes: int | None) -> SlurmSpec:
    """The host's settings with launch's --nodes (when given) in place of its `nodes`."""
    return dataclasses.replace(spec, nodes=nodes) if nodes else spec


def on_node(spec: SlurmSpec, args: tuple[str, ...]) -> tuple[str, ...]:
    """`enlace ARGS` as `enlace on-node`: srun on a compute node (login nodes have no GPU)."""
    return ("on-node", "--slurm", json.dumps(spec.to_json()), "--", *args)


def submit(session: Session, sha: str, run_name: str, spec: SlurmSpec, gpus: int, pyargs: list[str]) -> dict:
    """sbatch the run on the login node; its job id goes into run.json. Not retried after a dropped
    session (it may have been submitted): a rerun says the run is live."""
    doc = session.enlace_json(
        sha,
        "submit",
        run_name,
        "--slurm",
        json.dumps(spec.to_json()),
        "--gpus",
        str(gpus),
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


def print_script(spec: SlurmSpec, run: str, run_name: str, gpus: int, train_args: list[str]) -> str:
    """The batch script for a user who submits it from the repository root on the cluster: the same
    #SBATCH settings and the same job step (time-limit checkpoint and requeue) as `launch` would use."""
    job = [
        "python",
        "-m",
        "enlace",
        "slurm-job",
        *job_step_args(spec, run_name, gpus, ["-m", "enlace", "train", run, *train_args]),
    ]
    return "\n".join(
        [
            "#!/bin/bash",
            f"# enlace run {run_name}. From the repository root on the cluster (runs/ and data/ on the filesystem",
            f"# the compute nodes share): mkdir -p runs/{run_name} && sbatch THIS_FILE",
            "# Near the time limit the trainer checkpoints and the job requeues itself (up to max_requeues).",
            *sbatch_lines(spec, f"enlace-{run_name}", spec.gpus_per_node),
            f"#SBATCH --output=runs/{run_name}/train.log",
            "export PYTHONUNBUFFERED=1",
            "trap '' USR1  # ignored until Python's handler is in place: by default USR1 would kill the step",
            f"exec {shlex.join(job)}",
            "",
        ]
    )
