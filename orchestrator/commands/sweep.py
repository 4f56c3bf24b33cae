"""`enlace-remote sweep` and the `--sweep [NAME]` of status, stop, fetch and plot: a sweep's runs acted on as one
thing, on whichever hosts they were placed (orchestrator/launch/sweep.py launches; orchestrator/sweep/ holds the
grid, the record and the table)."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from types import SimpleNamespace

import click

from enlace.clitypes import notify_option, supervisor_options
from enlace.contract import ErrorKind, Status, metric_words
from enlace.errors import EnlaceError, shown
from orchestrator.commands.common import (
    HostOptionsCommand,
    Remote,
    allow_dirty_option,
    refuse_both,
    server_stop,
    stop_words,
    with_remote,
)
from orchestrator.sweep import record, table

sweep_option = click.option(
    "--sweep",
    "sweep_name",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[NAME]",
    help="Every run of the sweep NAME (bare --sweep: the last one launched from this repo), on its hosts.",
)


@click.command(cls=HostOptionsCommand)
@click.argument("run")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    required=True,
    metavar="KEY=V1,V2,...",
    help="A swept key and its values (two or more, comma-separated), or a fixed one (one value). Repeatable.",
)
@click.option(
    "--hosts", default=None, metavar="H1,H2,...", help="Spread the runs over these hosts (default: the host)."
)
@click.option(
    "--name",
    default=None,
    metavar="NAME",
    help="The sweep's name (default RUN-sweepK); its runs are NAME-<key><value>-... The same command with the same "
    "--name again starts the points a cut-short launch never started.",
)
@notify_option("POST a JSON note here when each run, and the sweep, ends.")
@click.option(
    "--max-running",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="On a Slurm host: at most N of its runs at once (the job array's %N). Elsewhere the hosts' queues decide.",
)
@supervisor_options(backoff=False)
@allow_dirty_option
@with_remote
def sweep(remote: Remote, run: str, overrides: tuple[str, ...], hosts: str | None, name: str | None, **options) -> None:
    """Launch one run of RUN per point of a grid: each --set KEY=V1,V2,... is a swept key (a --set with one value
    applies to every point). The runs are named after their values (smoke-2060-sweep1-lr1e-3-nl4), spread over
    --hosts by the room each host's queue has, started detached in those queues (no preflight: it would measure
    beside the sweep's own runs), and recorded here as the sweep NAME, which `status --sweep`, `stop --sweep`,
    `fetch --sweep` and `plot --sweep` act on (bare --sweep: the last sweep). RUN may be a run file of your own
    command: its keys are args.NAME (--NAME=V appended to the command) and env.NAME, and its `supervise:` sets the
    restarts unless --restarts is given.

    \b
      enlace-remote sweep smoke-2060 --set optim.learning_rate=1e-3,3e-3,1e-2 --set model.n_layer=4,6
      enlace-remote sweep my-script --set args.lr=1e-3,3e-3 --set env.SEED=1,2   # a run file of your own command
      enlace-remote status --sweep          # one table, ranked by val bpb (a script's: its val loss), "2/6 finished"
      enlace-remote stop --sweep            # every run of it, queued ones first"""
    from orchestrator.launch.sweep import launch_sweep

    given = click.get_current_context().get_parameter_source("restarts") == click.core.ParameterSource.COMMANDLINE
    made = launch_sweep(remote, run, overrides, hosts, name, SimpleNamespace(**options, restarts_given=given))
    click.echo(f"sweep {made.name}: {len(made.points)} runs on {', '.join(made.hosts())}")
    show_status(remote, made.name, as_json=False)


def _rows(remote: Remote, sweep: record.Sweep) -> list[dict]:
    """Each run of the sweep as its host reports it, the hosts asked in parallel; ranked."""

    def ask(host_name: str) -> list[dict] | None:
        from orchestrator.hosts.resolve import resolve_host

        session = remote.session_for(resolve_host(host_name, remote.repo))
        try:
            return [{**r, "host": host_name} for r in session.enlace_json("latest", "runs")]
        except EnlaceError as e:
            click.echo(f"warning: {host_name}: {e.format_message().splitlines()[0]}", err=True)
            return None

    with ThreadPoolExecutor(max_workers=max(1, len(sweep.hosts()))) as pool:
        answers = dict(zip(sweep.hosts(), pool.map(ask, sweep.hosts())))
    found = {(r["host"], r["run_name"]): r for rows in answers.values() for r in rows or []}
    return table.rows_of(sweep, found, frozenset(h for h, rows in answers.items() if rows is None))


def alone(run_name: str | None, sweep_name: str, verb: str) -> str:
    """--sweep [NAME] where no run is named too: `stop qa --sweep` stopped the last sweep's runs, not qa."""
    bare = "" if sweep_name else " (bare --sweep: the last one launched from here)"
    given, every = f"--sweep{' ' + sweep_name if sweep_name else ''}", f"--sweep {sweep_name or 'NAME'}"
    refuse_both(run_name, verb, given, "a sweep", f"`enlace-remote {verb} {every}` on every run of the sweep{bare}")
    return sweep_name


def show_status(remote: Remote, name: str, as_json: bool) -> None:
    sweep = record.load(remote.repo, name)
    rows = _rows(remote, sweep)
    click.echo(json.dumps(rows, indent=1) if as_json else shown(table.format_table(sweep, rows)))


def stop_all(remote: Remote, name: str, grace: float | None, kill: bool) -> None:
    """Stop every live run of the sweep: the queued ones first, one by one (none of them may start on a GPU a
    stopping run frees), then the running ones, in parallel. Each run's outcome is said, a failed stop too;
    any failed or unfinished stop exits 1."""
    from orchestrator.hosts.resolve import resolve_host

    sweep = record.load(remote.repo, name)
    rows = _rows(remote, sweep)
    live = [r for r in rows if r.get("alive")]
    queued = [r for r in live if r["status"] == "queued"]
    order = queued + [r for r in live if r["status"] != "queued"]
    begun: set[int] = set()
    said: dict[int, tuple[str, bool]] = {}  # each stop's line and whether it stopped, by its run's place in order

    def stop_one(i: int) -> None:  # its own bookkeeping: a Ctrl-C at any moment knows what was asked and ended
        begun.add(i)
        row = order[i]
        where = f"{row['run_name']} on {row['host']}"
        try:
            rep = server_stop(remote.session_for(resolve_host(row["host"], remote.repo)), row["run_name"], grace, kill)
        except EnlaceError as e:  # that host's failure: the others' stops go on
            said[i] = f"{where}: not stopped — {e.format_message().splitlines()[0]}", False
            return
        late = "" if rep["stopped"] else f" — still running after {rep['grace_s']:g}s (--kill forces it)"
        said[i] = shown(f"{where}: {stop_words(rep)}{late}"), rep["stopped"]

    pool = ThreadPoolExecutor(max_workers=max(1, len(order) - len(queued)))
    try:
        for i in range(len(queued)):
            stop_one(i)
        pending = {pool.submit(stop_one, i) for i in range(len(queued), len(order))}
        while pending:  # a timed wait: a Ctrl-C the kernel gave another thread is seen within a quarter second
            done, pending = wait(pending, timeout=0.25)
            for future in done:
                future.result()  # (stop_one says a host's failure itself: anything raised here is a bug)
    except KeyboardInterrupt:  # in this thread only: the stops under way are the threads'; leave them, say so
        pool.shutdown(wait=False, cancel_futures=True)  # (one not yet begun is never asked)
        asked, ended = set(begun), dict(said)  # one reading of each: the threads go on writing them
        if ended:
            click.echo("\n".join(ended[i][0] for i in sorted(ended)))
        under_way = [order[i] for i in sorted(asked - ended.keys())]
        _say_interrupted(sweep.name, under_way, [r for i, r in enumerate(order) if i not in asked], kill)
        raise
    pool.shutdown()
    for i, row in enumerate(r for r in rows if r["status"] == table.NO_ANSWER):  # (its host's warning came first)
        said[len(order) + i] = f"{row['run_name']} on {row['host']}: not stopped — its host did not answer", False
    click.echo("\n".join(said[i][0] for i in sorted(said)) or f"sweep {sweep.name}: nothing is running or queued")
    if unlaunched := sum(r["status"] == table.NOT_LAUNCHED for r in rows):  # a `sweep` command may be launching them
        click.echo(
            f"note: {unlaunched} point(s) of sweep {sweep.name} not launched: where `enlace-remote sweep` is still"
            f" launching them, Ctrl-C it, then `enlace-remote stop --sweep {sweep.name}` again",
            err=True,
        )
    if not all(ok for _, ok in said.values()):
        sys.exit(1)


def _runs(rows: list[dict]) -> str:
    return ", ".join(f"{r['run_name']} on {r['host']}" for r in rows)


def _say_interrupted(name: str, under_way: list[dict], never: list[dict], kill: bool) -> None:
    """Ctrl-C in `stop --sweep`: the stops under way go on without us, the runs not yet asked stay as they are."""
    said = f"\nsweep {name}: interrupted."
    if under_way:
        said += (
            f" Under way: the stop of {_runs(under_way)} (a running run may already have been sent SIGTERM: it then"
            f" saves a checkpoint and exits on its own{', not killed' if kill else ''})."
        )
    if never:
        said += f" Not asked to stop: {_runs(never)}."
    click.echo(
        f"{said} `enlace-remote status --sweep {name}` says where they stand; `enlace-remote stop --sweep {name}`"
        " stops what is left",
        err=True,
    )


def fetch_all(remote: Remote, name: str, best: bool, which_all: bool) -> None:
    """Fetch the newest checkpoint (or every one) of each run of the sweep, or of its best run only."""
    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.transfer.fetch import fetch as do_fetch

    sweep = record.load(remote.repo, name)
    rows = _rows(remote, sweep)
    # a run of your own command may have outputs and no checkpoint: fetch brings what it has
    unstarted = (table.NOT_LAUNCHED, "queued", "pending")
    have = [r for r in rows if r.get("latest_checkpoint") or (r.get("command_spec") and r["status"] not in unstarted)]
    chosen = [r for r in rows if r.get("best")] if best else have
    if not chosen:
        metric = metric_words(rows[0]["metric"])  # what rows_of ranked them by
        terminal = {str(s) for s in Status if s.is_terminal}  # NOT_LAUNCHED is none: it may yet run
        ended = all(r["status"] in terminal for r in rows)  # then "yet" would say to wait for what never comes
        if best:
            why = (
                f"no run of it finished with a {metric}" if ended else f"no run of it has finished with a {metric} yet"
            )
            own = rows[0]["metric"] == "val_loss"  # a script's: it logs it itself
            why += " (a script of your own is ranked by the val_loss it logs with enlace.job)" if ended and own else ""
        else:
            why = "no run of it has a checkpoint or outputs" + ("" if ended else " yet")
        raise EnlaceError(f"sweep {sweep.name}: {why} — `enlace-remote status --sweep {sweep.name}` shows where it is")
    failed = 0
    for row in chosen:  # one run's failure (a corrupt checkpoint, its host gone) said, the others fetched still
        session = remote.session_for(resolve_host(row["host"], remote.repo))
        try:
            rep = do_fetch(session, row["run_name"], remote.repo / "runs" / row["run_name"], which_all)
        except EnlaceError as e:
            failed += 1
            click.echo(f"fetch {row['run_name']} ({row['host']}): not fetched — {e.format_message()}", err=True)
            continue
        got = [*rep["fetched"], *([f"{rep['outputs']} output file(s) verified"] if rep.get("outputs") else [])]
        got += (
            [f"{len(rep['set_aside'])} of an earlier line moved to checkpoints-set-aside/"]
            if rep.get("set_aside")
            else []
        )
        click.echo(f"fetch {row['run_name']} ({row['host']}): {', '.join(got) or 'up to date'} → {rep['dest']}")
    if failed:
        sys.exit(1)


NEVER = "not launched (`status --sweep` shows it)"  # a point its host has no run of


def plot_all(remote: Remote, name: str, out: Path | None, metrics: list[str]) -> Path:
    """The curves of every run of the sweep, overlaid in one PNG (runs/sweep-NAME.png by default)."""
    from enlace.tools.plot import plot as draw
    from orchestrator.hosts.resolve import resolve_host
    from orchestrator.transfer.fetch import fetch_run_files

    sweep = record.load(remote.repo, name)
    status = {(r["host"], r["run_name"]): r["status"] for r in _rows(remote, sweep)}  # hosts asked in parallel, once
    dirs = []
    for point in sweep.points:
        here, where = remote.repo / "runs" / point["run_name"], status.get((point["host"], point["run_name"]))
        if where in (table.NO_ANSWER, table.NOT_LAUNCHED):  # (a host down was asked again for 90 s, per point)
            before = where == table.NO_ANSWER and (here / "metrics.jsonl").is_file()
            why = NEVER if where == table.NOT_LAUNCHED else "its host did not answer"
            click.echo(f"warning: {point['run_name']}: {why}{': as fetched before' if before else ''}", err=True)
            dirs += [here] if before else []
            continue
        session = remote.session_for(resolve_host(point["host"], remote.repo))
        dirs.append(here)
        try:
            fetch_run_files(session, point["run_name"], dirs[-1], ("metrics.jsonl", "run.json"))
        except EnlaceError as e:  # a run that never started (still queued, or never launched): left out, said
            unknown = getattr(e, "kind", None) == ErrorKind.NO_SUCH_RUN  # (its error lists the host's every run)
            why = NEVER if unknown else e.format_message().splitlines()[0]
            click.echo(f"warning: {point['run_name']}: {why}", err=True)
            dirs.pop()
            continue
        if not (dirs[-1] / "metrics.jsonl").is_file():
            click.echo(f"warning: {point['run_name']}: no step logged, left out", err=True)
            dirs.pop()
    if not dirs:
        raise EnlaceError(
            f"sweep {sweep.name}: no run of it has logged a step (metrics.jsonl: enlace's trainer, or a script of "
            "your own through enlace.job's job.log) — nothing to plot"
        )
    target = out or remote.repo / "runs" / f"sweep-{sweep.name}.png"
    draw(dirs, target, metrics, f"sweep {sweep.name}: {len(dirs)} of its {len(sweep.points)} runs")
    return target


COMMANDS = (sweep,)
