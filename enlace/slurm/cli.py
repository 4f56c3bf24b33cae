"""`enlace` verbs for runs on a Slurm cluster, called by enlace-remote on the login node (submit,
on-node) and by the job script on a compute node (slurm-job). See enlace/slurm/settings.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import click

from enlace.clitypes import root_option
from enlace.contract import LAUNCH_ID_ENV
from enlace.names import find_root, validate_run_name

spec_option = click.option(
    "--slurm", "spec_json", required=True, metavar="JSON", help="The host's Slurm settings (hosts.yaml), as JSON."
)


def _spec(spec_json: str):
    from enlace.slurm.settings import SlurmError, spec_from

    try:
        entry = json.loads(spec_json)
    except json.JSONDecodeError as e:
        raise SlurmError(f"--slurm: not JSON ({e})") from None
    return spec_from(entry, "the host's Slurm settings")


@click.command("submit", hidden=True)
@click.argument("run_name")
@click.argument("pyargs", nargs=-1, type=click.UNPROCESSED)
@spec_option
@click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True, help="Processes per node.")
@click.option("--command-spec", default=None, metavar="JSON", help="The user's own command instead of PYARGS.")
@click.option("--fresh", is_flag=True, help="With --command-spec: set its checkpoints and metrics aside first.")
@root_option
@click.option("--json", "as_json", is_flag=True)
def submit_cmd(
    run_name: str,
    pyargs: tuple[str, ...],
    spec_json: str,
    gpus: int,
    command_spec: str | None,
    fresh: bool,
    root: Path | None,
    as_json: bool,
) -> None:
    """sbatch a job that runs `python PYARGS` (the trainer) as RUN_NAME, unless the run is live (exit 7);
    the script is kept as runs/RUN_NAME/slurm/job-ID.sh, the job's output is train.log."""
    from enlace.server import lifecycle
    from enlace.slurm import settings as slurm

    validate_run_name(run_name, "RUN_NAME")
    spec = _spec(spec_json)
    project = find_root(root)
    run_dir = (project / "runs").resolve() / run_name  # runs/ is the shared dir the compute nodes see
    env = {"ENLACE_COMMIT": os.environ.get("ENLACE_COMMIT", ""), "PYTHONUNBUFFERED": "1"}
    # what remote.sh set: the server half beside a repository of the user's own, the shared data directory
    env |= {k: os.environ[k] for k in ("PYTHONPATH", "ENLACE_DATA_DIR") if os.environ.get(k)}
    job_args = slurm.job_step_args(spec, run_name, gpus, list(pyargs))

    def submit_job(launch_id: str) -> str:
        header = (
            f"enlace run {run_name}: written and submitted by `enlace-remote launch` "
            f"({time.strftime('%Y-%m-%d %H:%M:%S')}). Its output is the run's train.log."
        )
        script = slurm.job_script(
            spec,
            run_name,
            shlex.quote(str(project)),
            shlex.quote(sys.executable),
            {**env, LAUNCH_ID_ENV: launch_id},
            job_args,
            header,
        )
        return slurm.submit(script, run_dir / "slurm", run_dir / "train.log")

    from enlace.config.command import from_spec  # the run file's rules: loaded only by the verb that needs them

    own = from_spec(command_spec, run_name).to_doc() if command_spec else None  # run.json keeps it for the job
    doc = lifecycle.submit(run_dir, submit_job, own, fresh)
    click.echo(json.dumps(doc) if as_json else f"submitted {run_name}: Slurm job {doc['job_id']}")


@click.command("submit-array", hidden=True)
@click.argument("sweep")
@spec_option
@click.option(
    "--tasks",
    "tasks_json",
    required=True,
    metavar="JSON",
    help='[{"run": NAME, "pyargs": [...]} or, with --command-run, {"run": NAME, "pyargs": [], "sets": [...]}, ...]',
)
@click.option(
    "--command-run", default=None, metavar="RUN", help="The tasks run RUN's own command, each with its --set."
)
@click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True, help="Processes per node.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many tasks at once (%N).")
@root_option
@click.option("--json", "as_json", is_flag=True)
def submit_array_cmd(
    sweep: str,
    spec_json: str,
    tasks_json: str,
    command_run: str | None,
    gpus: int,
    limit: int | None,
    root: Path | None,
    as_json: bool,
) -> None:
    """sbatch one job array for the sweep SWEEP: task i runs tasks[i] as a single run's job would (train.log,
    checkpoints, the time-limit requeue of that task alone); refused if any of its runs is live (exit 7)."""
    from enlace.server import lifecycle
    from enlace.slurm import settings as slurm

    validate_run_name(sweep, "SWEEP")
    spec = _spec(spec_json)
    tasks = json.loads(tasks_json)
    for task in tasks:
        validate_run_name(task["run"], "a task's run")
    project = find_root(root)
    commands = [_own_command(command_run, project, t) if command_run else None for t in tasks]
    runs_root = (project / "runs").resolve()
    env = {"ENLACE_COMMIT": os.environ.get("ENLACE_COMMIT", ""), "PYTHONUNBUFFERED": "1"}
    # what remote.sh set: the server half beside a repository of the user's own, the shared data directory
    env |= {k: os.environ[k] for k in ("PYTHONPATH", "ENLACE_DATA_DIR") if os.environ.get(k)}

    def submit_job(launch_ids: list[str]) -> str:
        header = f"enlace sweep {sweep}: one task per run, written and submitted by `enlace-remote sweep`."
        script = slurm.array_script(
            spec,
            sweep,
            [{**t, "launch_id": lid} for t, lid in zip(tasks, launch_ids)],
            gpus,
            limit,
            shlex.quote(str(project)),
            shlex.quote(sys.executable),
            env,
            header,
        )
        where = runs_root / ".sweeps" / sweep
        return slurm.submit(script, where, where / "task-%a.out")

    ids = lifecycle.submit_array([runs_root / t["run"] for t in tasks], submit_job, commands)
    click.echo(
        json.dumps({"ok": True, "tasks": ids}) if as_json else "\n".join(f"{r}: job {j}" for r, j in ids.items())
    )


def _own_command(run: str, project: Path, task: dict) -> dict:
    """A sweep task's own command: RUN's run file in this tree with the task's --set items, as verify checked it
    (kept in the task's run.json for its batch step)."""
    from enlace.config import command  # the run file's rules: loaded only by the verbs that need them

    own = command.load(run, project, task.get("sets") or ())
    if own is None or own.run_name != task["run"]:
        raise click.UsageError(f"--command-run {run}: not a run of your own command named {task['run']} here")
    return own.to_doc()


@click.command("slurm-job", hidden=True)
@click.argument("run_name")
@click.argument("pyargs", nargs=-1, type=click.UNPROCESSED)
@click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True, help="Processes per node.")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--max-requeues", type=click.IntRange(min=0), default=3, show_default=True)
@click.option(
    "--signal-grace",
    type=click.IntRange(min=0),
    default=120,
    show_default=True,
    help="The job's --signal lead (s): less time left at the start counts as the limit being near.",
)
@root_option
def slurm_job_cmd(
    run_name: str,
    pyargs: tuple[str, ...],
    gpus: int,
    nodes: int,
    max_requeues: int,
    signal_grace: int,
    root: Path | None,
) -> None:
    """Inside a Slurm batch job: run `python PYARGS` (the trainer), turn Slurm's signals into a checkpoint,
    requeue at the time limit (see enlace/slurm/job.py)."""
    from enlace.slurm.job import run_job

    validate_run_name(run_name, "RUN_NAME")
    sys.exit(run_job(find_root(root) / "runs" / run_name, list(pyargs), gpus, nodes, max_requeues, signal_grace))


@click.command("on-node", hidden=True, context_settings={"ignore_unknown_options": True})
@spec_option
@click.option("--minutes", type=click.IntRange(min=1), default=15, show_default=True, help="Its limit (or the host's).")
@click.argument("args", nargs=-1, required=True, type=click.UNPROCESSED)
def on_node_cmd(spec_json: str, minutes: int, args: tuple[str, ...]) -> None:
    """Run `enlace ARGS` as a short job on a compute node (srun): preflight on a Slurm host, where the login
    node has no GPU. Its stdout is ARGS' answer; srun's queue messages go to stderr."""
    spec = _spec(spec_json)
    from enlace.slurm import onnode

    name, minutes = f"enlace-{args[0]}-{os.getpid()}", onnode.minutes_for(spec, minutes)
    # on the node, first: is the synced tree there (remote_dir on the filesystem the nodes share)?
    check = (
        'test -w "$1" || { echo "remote_dir is not on $(hostname): $1 is missing or not writable there — put '
        'remote_dir on the filesystem the compute nodes share" >&2; exit 3; }; shift; exec "$@"'
    )
    argv = [
        *onnode.srun_argv(spec, name, minutes),
        "bash",
        "-c",
        check,
        "on-node",
        str(find_root(None)),
        sys.executable,
        "-m",
        "enlace",
        *args,
    ]
    # the driver went away: cancel the job (a killed srun would leave its step running for a while)
    ctx = click.get_current_context()
    ctx.obj["when_client_gone"].append(lambda: subprocess.run(["scancel", f"--name={name}"], capture_output=True))
    click.echo(f"  {args[0]} on a compute node: {shlex.join(argv[: argv.index('bash')])}", err=True)
    sys.exit(onnode.run(argv, name, minutes))


COMMANDS = (submit_cmd, submit_array_cmd, slurm_job_cmd, on_node_cmd)
