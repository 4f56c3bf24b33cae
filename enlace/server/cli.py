"""`enlace` verbs for the driver (enlace-remote) on the server: runs, start, wait, stop, logs (fetch-serve,
data-receive and data-files: enlace/server/filescli.py). With --json each answers exactly one JSON document on stdout — errors too,
as {"ok": false, "error", "exit_code"} — and progress on stderr; `logs` streams the raw log bytes."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import click

from enlace.clitypes import (
    gc_options,
    grace_option,
    notify_option,
    queue_options,
    root_option,
    run_end_options,
    supervisor_options,
)
from enlace.names import find_root

NOTIFY_ENV = "ENLACE_NOTIFY_URL"  # start → supervise: the webhook URL (its path is a secret)


def _runs_root(root: Path | None) -> Path:
    return find_root(root) / "runs"


@click.command("runs")
@click.argument("run_name", required=False)
@root_option
@click.option("--json", "as_json", is_flag=True)
def runs_cmd(run_name: str | None, root: Path | None, as_json: bool) -> None:
    """Status of the runs in runs/ (or one RUN_NAME); a run whose process vanished shows crashed."""
    from enlace.server import runfiles
    from enlace.state import runs

    rows = (
        [runs.observe(runfiles.launched_run_dir(_runs_root(root), run_name))]
        if run_name
        else runfiles.all_status(_runs_root(root))
    )
    if as_json:
        click.echo(json.dumps(rows))
        return
    for r in rows:
        loss = f"{r['loss']:.4f}" if r["loss"] is not None else "-"
        of = f"/{r['max_steps']}" if r["max_steps"] is not None else ""  # (a command's run has none: it read /None)
        click.echo(f"{r['run_name']:24} {r['status']:9} step {r['step']}{of} loss {loss}")


@click.command("start", hidden=True)
@click.argument("run_name")
@click.argument("pyargs", nargs=-1, type=click.UNPROCESSED)
@root_option
@supervisor_options()
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda", "auto"]),
    default=None,
    help="The run's runtime.device: it queues for GPUs or a CPU slot (without it: no queue).",
)
@click.option("--procs", default=None, metavar="N|all", help="Processes per host (launch --gpus): GPUs it needs.")
@queue_options
@run_end_options
@notify_option()
@click.option(
    "--command-spec",
    default=None,
    metavar="JSON",
    help="Run the user's own command (enlace/config/command.py's JSON form) instead of `python PYARGS`.",
)
@click.option(
    "--fresh",
    is_flag=True,
    help="With --command-spec (launch --resume none): set the run's checkpoints and metrics aside, to start afresh.",
)
@click.option("--json", "as_json", is_flag=True)
def start_cmd(
    run_name: str,
    pyargs: tuple[str, ...],
    root: Path | None,
    restarts: int,
    stall_timeout: float | None,
    backoff: float,
    device: str | None,
    procs: str | None,
    cpu_slots: int,
    gpu_free_below: float,
    notify: str | None,
    host_name: str,
    sweep: str | None,
    sweep_share: int,
    command_spec: str | None,
    fresh: bool,
    as_json: bool,
) -> None:
    """Start `python PYARGS` (the trainer, or torchrun) detached as RUN_NAME under its supervisor, unless
    it is alive (exit 7). With --device it takes its turn in this server's queue (enlace/server/queue.py);
    a need the server can never meet is refused (exit 3). With --command-spec: the user's own command."""
    from enlace.names import validate_run_name
    from enlace.server import lifecycle, needs, queue

    validate_run_name(run_name, "RUN_NAME")
    command = _command_doc(command_spec, run_name, pyargs) if command_spec else None
    project = find_root(root)
    policy = ["--restarts", str(restarts), "--backoff", str(backoff)]
    policy += ["--stall-timeout", str(stall_timeout)] if stall_timeout else []
    ticket = None
    if device is not None:  # its place in the queue is taken now: first come is the launch that came first
        settings = needs.Settings(cpu_slots, gpu_free_below)
        need = needs.need_for(device, procs, settings)
        queue.note_slots(settings)  # this launch's hosts.yaml entry: the queue's number of CPU slots from now on
        ticket = queue.enqueue(_runs_root(root) / run_name, need, settings)
        policy += ["--need", str(need), "--cpu-slots", str(cpu_slots), "--gpu-free-below", str(gpu_free_below)]
        policy += ["--ticket", str(ticket.path), "--ticket-fd", str(ticket.file.fileno())]
    if sweep:
        validate_run_name(sweep, "--sweep")
        policy += ["--sweep", sweep, "--sweep-share", str(sweep_share)]
    policy += ["--host-name", host_name] if host_name else []
    policy += ["--command"] if command else []
    supervisor = [sys.executable, "-m", "enlace", "supervise", run_name, "--root", str(project), *policy, "--"]
    env = {**os.environ, **({NOTIFY_ENV: notify} if notify else {})}  # not argv: `ps` shows argv to everyone
    try:
        fds = (ticket.file.fileno(),) if ticket else ()
        doc = lifecycle.start(_runs_root(root) / run_name, [*supervisor, *pyargs], project, env, fds, command, fresh)
    except BaseException:
        if ticket:  # refused (already running): its place goes
            ticket.close()
        raise
    if ticket:
        ticket.file.close()  # the supervisor holds it now (the same lock, inherited)
    click.echo(json.dumps(doc) if as_json else f"started {run_name}: pid {doc['pid']}")


def _command_doc(spec: str, run_name: str, pyargs: tuple[str, ...]) -> dict:
    """--command-spec checked as a run file is (one line naming the key, exit 2): its JSON form, for run.json."""
    from enlace.config.command import from_spec

    if pyargs:
        raise click.UsageError("--command-spec runs the command it holds: give no PYARGS")
    return from_spec(spec, run_name).to_doc()


@click.command("supervise", hidden=True)
@click.argument("run_name")
@click.argument("pyargs", nargs=-1, type=click.UNPROCESSED)
@root_option
@supervisor_options()
@click.option("--need", default=None, help="What it waits for in the queue: gpu:N, gpu:all, cpu:N (none: no queue).")
@click.option("--ticket", type=click.Path(path_type=Path), default=None, help="Its place in the queue (start took it).")
@click.option(
    "--ticket-fd", type=click.IntRange(min=0), default=None, help="The ticket's locked descriptor, inherited."
)
@queue_options
@run_end_options
@click.option("--command", "own", is_flag=True, help="Run the user's command kept in run.json (start put it there).")
def supervise_cmd(
    run_name: str,
    pyargs: tuple[str, ...],
    root: Path | None,
    restarts: int,
    stall_timeout: float | None,
    backoff: float,
    need: str | None,
    ticket: Path | None,
    ticket_fd: int | None,
    cpu_slots: int,
    gpu_free_below: float,
    host_name: str,
    sweep: str | None,
    sweep_share: int,
    own: bool,
) -> None:
    """Run `python PYARGS` for RUN_NAME and heal it: restart after a crash or a stall from the newest
    checkpoint, at most --restarts times (enlace/server/supervise.py says what is retried and what is not).
    With --need, first wait for its turn in the server's queue."""
    import functools

    from enlace.server import lifecycle, needs, queue
    from enlace.server.supervise import Policy, Supervisor, exit_code
    from enlace.state import runs

    run_dir = _runs_root(root) / run_name
    notify = os.environ.pop(NOTIFY_ENV, None)  # the supervisor's alone: not the trainer's
    env = {**lifecycle.torchrun_env(run_dir), **os.environ}
    if sweep:
        runs.update(run_dir, sweep=sweep, sweep_share=sweep_share)
    wait_turn = None
    if need:
        wanted = needs.Need.parse(need)
        runs.update(run_dir, need=str(wanted), gpus=None)
        settings = needs.Settings(cpu_slots, gpu_free_below)
        place = queue.Ticket.adopt(ticket, ticket_fd, wanted, run_name) if ticket and ticket_fd is not None else None
        if place:
            runs.update(run_dir, ticket=place.number)
        wait_turn = functools.partial(queue.wait_for_seat, run_dir, wanted, settings, ticket=place)
    policy = Policy(restarts, stall_timeout, backoff)
    command = None
    if own:
        from enlace.config.command import CommandRun

        command = CommandRun.from_doc(runs.read(run_dir)["command"], "run.json command")
    argv = [sys.executable, *pyargs]
    supervisor = Supervisor(run_dir, argv, policy, env, wait_turn=wait_turn, command=command)
    outcome = supervisor.run()
    if supervisor.seat is not None:
        supervisor.seat.release()  # the next run in line need not wait for the notification
    if notify:
        from enlace.server import notify as tell
        from enlace.server.supervise import say

        tell.after_run(run_dir, notify, host_name or socket.gethostname(), say)
    sys.exit(exit_code(outcome))


@click.command("seated", hidden=True, context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--for-run", required=True, help="The run whose preflight this is (named to whoever waits).")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), required=True)
@click.option("--procs", default=None, metavar="N|all")
@queue_options
@click.option("--json", "as_json", is_flag=True)
def seated_cmd(
    args: tuple[str, ...],
    for_run: str,
    device: str,
    procs: str | None,
    cpu_slots: int,
    gpu_free_below: float,
    as_json: bool,
) -> None:
    """Run `enlace ARGS` (preflight) on what this server's queue has free now, holding it until it ends, with
    CUDA_VISIBLE_DEVICES set to it; refused (kind queue_busy) when nothing is free: a measurement beside
    another run would be wrong, and could push that run out of memory."""
    from enlace.names import validate_run_name
    from enlace.server import needs, queue

    validate_run_name(for_run, "--for-run")
    settings = needs.Settings(cpu_slots, gpu_free_below)
    here = str(_runs_root(None) / for_run)  # a run re-attached holds its own slot: "(this run)"
    seat, why = queue.seat_now(for_run, needs.need_for(device, procs, settings), settings, here)
    if seat is None:
        raise queue.QueueBusy(why)
    for fd in seat.fds:  # the measuring process holds the seat for as long as it lives
        os.set_inheritable(fd, True)
    tied = click.get_current_context().find_root().params.get("exit_with_client")
    argv = [sys.executable, "-m", "enlace", *(["--exit-with-client"] if tied else []), *args]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, {**os.environ, **seat.env()})


@click.command("queue-free", hidden=True)
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), required=True)
@click.option("--procs", default=None, metavar="N|all")
@queue_options
@click.option("--json", "as_json", is_flag=True)
def queue_free_cmd(device: str, procs: str | None, cpu_slots: int, gpu_free_below: float, as_json: bool) -> None:
    """How much room this server's queue has now for a run of DEVICE: slots, free, waiting (a sweep spreads by it)."""
    from enlace.server import needs, queue

    settings = needs.Settings(cpu_slots, gpu_free_below)
    click.echo(json.dumps(queue.capacity(needs.need_for(device, procs, settings), settings)))


@click.command("wait", hidden=True)
@click.argument("run_name")
@click.option("--launch-id", required=True, help="The launch to wait for (from `start`).")
@click.option("--timeout", type=click.FloatRange(min=0), default=600.0, show_default=True)
@root_option
@click.option("--json", "as_json", is_flag=True)
def wait_cmd(run_name: str, launch_id: str, timeout: float, root: Path | None, as_json: bool) -> None:
    """Wait here, on the server, until that launch has logged its first step or ended; print its status
    row. Phases (building the model, resuming, ...) go to stderr as they change."""
    from enlace.server import lifecycle, runfiles

    run_dir = runfiles.run_dir_of(_runs_root(root), run_name)
    row = lifecycle.wait_started(run_dir, launch_id, timeout, on_phase=lambda p: click.echo(f"  {p} ...", err=True))
    click.echo(json.dumps(row) if as_json else f"{run_name}: {row['status']} at step {row['step']}")


@click.command("stop")
@click.argument("run_name")
@root_option
@grace_option
@click.option("--kill", is_flag=True, help="SIGKILL the run if it has not stopped within --grace.")
@click.option("--json", "as_json", is_flag=True)
def stop_cmd(run_name: str, root: Path | None, grace: float | None, kill: bool, as_json: bool) -> None:
    """SIGTERM a detached run (it checkpoints and exits), wait up to --grace seconds. A run that is not
    running is left as it is (exit 0, says so)."""
    from enlace.server import lifecycle, runfiles

    report = lifecycle.stop(runfiles.run_dir_of(_runs_root(root), run_name), grace, kill)
    click.echo(
        json.dumps(report)
        if as_json
        else f"{run_name}: {report['status']} at step {report['step']}, latest checkpoint {report['latest_checkpoint']}"
    )
    sys.exit(0 if report["stopped"] else 1)


@click.command("logs")
@click.argument("run_name")
@root_option
@click.option("--offset", type=click.IntRange(min=0), default=0, help="Start at this byte of train.log.")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the run ends; exit with its code.")
@click.option(
    "--tail-offset",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Only print (as JSON) the byte offset where the last N lines start.",
)
@click.option(
    "--heartbeat-s",
    type=click.FloatRange(min=0.1),
    default=15.0,
    envvar="ENLACE_HEARTBEAT_S",
    show_default=True,
    help="With -f: a newline on stderr after this many quiet seconds, so the driver tells a quiet run "
    "from a dead connection (env ENLACE_HEARTBEAT_S).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="An error as one JSON document on stdout (--tail-offset's answer is JSON anyway).",
)
def logs_cmd(
    run_name: str,
    root: Path | None,
    offset: int,
    follow: bool,
    tail_offset: int | None,
    heartbeat_s: float,
    as_json: bool,
) -> None:
    """Print RUN_NAME's train.log from a byte offset (raw bytes: the one verb whose stdout is not JSON).
    With -f, exit with the run's exit code once it has ended (0 finished/stopped, 8 crashed)."""
    from enlace.server import runfiles

    run_dir = runfiles.run_dir_of(_runs_root(root), run_name)
    if tail_offset is not None:
        click.echo(json.dumps({"offset": runfiles.tail_offset(run_dir, tail_offset)}))
        return
    sys.exit(runfiles.stream_log(run_dir, offset, follow, heartbeat_s))


@click.command("gc")
@gc_options
@root_option
@click.option("--json", "as_json", is_flag=True)
def gc_cmd(keep: int, dry_run: bool, root: Path | None, as_json: bool) -> None:
    """Remove trees/<sha> and venvs/<hash> no run needs (kept: trees of live or resumable runs, the newest
    --keep, and their venvs). Never touches data/ or runs/: it lists the lines an explicit --resume set aside
    (runs/RUN/checkpoints-set-aside/*) with what deleting each frees. Runs in a tree on the server."""
    from enlace.server.cleanup import collect, remote_dir_of

    rep = collect(remote_dir_of(find_root(root)), keep, dry_run)
    if as_json:
        click.echo(json.dumps(rep))
        return
    for e in rep["remove"]:
        click.echo(f"{'would remove' if dry_run else 'removed'} {e['path']} ({e['bytes'] / 2**20:.1f} MiB)")
    for e in rep["set_aside"]:  # never gc's: only their owner knows whether a line is still wanted
        click.echo(f"kept (set aside by an explicit --resume) {e['path']} (frees {e['bytes'] / 2**20:.1f} MiB alone)")
    if rep["set_aside"]:
        click.echo(f"deleting every set-aside line frees {rep['set_aside_bytes'] / 2**20:.1f} MiB")


COMMANDS = (
    runs_cmd,
    start_cmd,
    supervise_cmd,
    seated_cmd,
    queue_free_cmd,
    wait_cmd,
    stop_cmd,
    logs_cmd,
    gc_cmd,
)
