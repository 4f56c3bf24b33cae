"""Launching a sweep: the commit shipped to each host once, each point's config checked there (one line only
when something is wrong), the points spread over the hosts by the room each host's queue has, the sweep
recorded here (before any run starts: `stop --sweep` reaches what an interrupted launch started), then each
point's run started detached in its host's queue — none waited for."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import click

from enlace import contract
from enlace.clitypes import shown_url
from enlace.config import command
from enlace.contract import trainer_args
from enlace.errors import EnlaceError
from orchestrator.errors import UsageError
from orchestrator.hosts.resolve import resolve_host, resolve_hosts
from orchestrator.launch import choose, ship, stages
from orchestrator.launch import own as own_launch
from orchestrator.sweep import grid, record
from orchestrator.transfer.gitsync import git


def default_name(repo, run: str) -> str:
    """`RUN-sweepK`, K one more than the sweeps of that run launched from here (`sweepK` for a long RUN)."""
    stem = run if len(run) <= 32 else ""
    k = 1
    while record.exists(repo, f"{stem}-sweep{k}" if stem else f"sweep{k}"):
        k += 1
    return f"{stem}-sweep{k}" if stem else f"sweep{k}"


def place(points: list, hosts: list[str], rooms: dict[str, dict]) -> list[str]:
    """Each point's host: the one with the most free room not yet given out; once every host is full, the one
    whose queue is shortest for its size. Ties go to the host named first."""
    per_run = {h: max(1, rooms[h]["per_run"]) for h in hosts}
    free = {h: rooms[h]["free"] // per_run[h] for h in hosts}
    size = {h: max(1, rooms[h]["slots"] // per_run[h]) for h in hosts}
    waiting = {h: rooms[h]["waiting"] for h in hosts}
    out = []
    for _ in points:
        host = max(hosts, key=lambda h: (free[h], -waiting[h] / size[h]))
        if free[host] > 0:
            free[host] -= 1
        else:
            waiting[host] += 1
        out.append(host)
    return out


def _room(session, host, device: str | None, procs: str | None) -> dict:
    if device is None:  # a server too old to say its device: every host counts as one free slot
        return {"slots": 1, "free": 1, "waiting": 0, "per_run": 1}
    return session.enlace_json("latest", "queue-free", *stages.queue_args(host, device, procs))


def _refuse_taken(remote, targets: list, points: list) -> None:
    """A point whose run name a host already has (another clone's sweep of that name, an earlier one whose
    record here is gone) would resume that run, or fail half-way: said before anything starts."""
    wanted = {p.run_name for p in points}
    for host in targets:
        taken = sorted(wanted & {r["run_name"] for r in remote.session_for(host).enlace_json("latest", "runs")})
        if taken:
            raise UsageError(
                f"{host.name} already has run{'s' if len(taken) > 1 else ''} {', '.join(taken[:3])}"
                f"{' and more' if len(taken) > 3 else ''} (a sweep of this name from elsewhere?) — give the sweep "
                "another --name"
            )


def launch_sweep(remote, run: str, items: tuple[str, ...], hosts: str | None, name: str | None, o) -> record.Sweep:
    """Launch one run per point of the grid `items` (--set KEY=V1,V2 ...) on `hosts` (default: the host)."""
    repo = remote.repo
    run = ship.check_run_config(repo, run)
    own = command.load(run, repo)  # a run file of your own command (its --set: env.NAME, args.NAME), else None
    if own is not None:
        own_launch.check_tracked(repo, own)
    swept, fixed = grid.parse_sets(items)
    name = record.check_name(name or default_name(repo, run))
    try:
        with record.launching(repo, name):
            return _launch(remote, run, own, swept, fixed, name, hosts, o)
    except KeyboardInterrupt:  # click would say only "Aborted!"
        again = f"the same command with --name {name} starts the points it did not (`status --sweep {name}`)"
        said = f"any runs it started go on; {again}" if record.exists(repo, name) else "nothing was started"
        click.echo(f"\nsweep {name}: interrupted — {said}", err=True)
        raise SystemExit(contract.INTERRUPTED) from None


def _launch(remote, run: str, own, swept: dict, fixed: list[str], name: str, hosts: str | None, o) -> record.Sweep:
    repo = remote.repo
    points = grid.points(name, swept)
    # each point's own command (a run file of yours), built and checked before anything connects: a bad --set is
    # one line here; the starts below use them
    mine = {p.run_name: command.load(run, repo, _overrides(fixed, p)) for p in points} if own is not None else {}
    procs = str(own.nproc) if own is not None and own.nproc > 1 else None
    if record.exists(repo, name):  # the same command again: what an interrupted launch never started
        return _finish(remote, record.load(repo, name), run, fixed, list(swept), points, mine, hosts, o)
    targets = resolve_hosts(hosts, repo) or [remote.host]
    if procs and any(h.slurm for h in targets):
        raise UsageError(f"{run}: nproc > 1 on a Slurm host is not supported yet")
    if any(h.slurm for h in targets):
        if len(targets) > 1:
            raise UsageError("a sweep on a Slurm host is one job array there: give that host alone (--hosts NAME)")
        return _on_slurm(remote, targets[0], run, name, points, fixed, o, own is not None)
    if o.max_running:
        click.echo("note: --max-running is a Slurm job array's limit; on these hosts their queues decide", err=True)
    shipped, rooms, first = {}, {}, _overrides(fixed, points[0])
    for host in targets:
        click.echo(f"== {host.name}", err=True)
        # a point's --set (its run_name): the base run's own record, if it was ever launched, is no point's
        try:
            shipped[host.name] = ship.ship(remote.session_for(host), repo, run, o.allow_dirty, False, first)
        except UsageError:  # the first point's config: every point checked, so that the error names each bad one
            head = SimpleNamespace(commit=git(repo, "rev-parse", "HEAD").strip())  # (what sync shipped)
            _check_points(remote, run, fixed, [(p, host.name) for p in points], {host.name: head}, {host.name: host})
            raise
        rooms[host.name] = _room(remote.session_for(host), host, shipped[host.name].device, procs)
    _refuse_taken(remote, targets, points)
    placement = place(points, [h.name for h in targets], rooms)
    by_name = {h.name: h for h in targets}
    pairs = list(zip(points, placement))
    _check_points(remote, run, fixed, pairs, shipped, by_name)  # every point checked, then any start
    sweep = record.Sweep(
        name,
        run,
        fixed,
        list(swept),
        [{"run_name": p.run_name, "host": h, "values": p.values} for p, h in zip(points, placement)],
        shown_url(o.notify) if o.notify else None,  # the record says whom it told, never the secret path
    )
    record.save(repo, sweep)
    _start_points(remote, run, name, fixed, pairs, shipped, by_name, mine, o)
    return sweep


def _check_points(remote, run: str, fixed: list[str], pairs: list, shipped: dict, by_name: dict) -> None:
    """Each (point, host name)'s config checked on its host (one line only when something is wrong); every point
    is checked (a second bad value was found only once the first was fixed), then one error names each failing
    one, and nothing starts."""
    failed: list[tuple[str, EnlaceError]] = []
    for i, (point, host_name) in enumerate(pairs, start=1):
        click.echo(f"== check {i}/{len(pairs)} {point.run_name} on {host_name}: {' '.join(point.sets())}", err=True)
        overrides = _overrides(fixed, point)
        try:
            ship.verify(
                remote.session_for(by_name[host_name]), shipped[host_name].commit, run, True, overrides, quiet=True
            )
        except EnlaceError as e:
            if e.exit_code not in (contract.USAGE, contract.VERIFY):  # the host's fault, not the point's: at once
                raise
            failed.append((point.run_name, e))
    if len(failed) == 1:
        raise failed[0][1]
    if failed:
        err = EnlaceError(
            f"{len(failed)} of the sweep's {len(pairs)} points fail their check; nothing was started — "
            + "; ".join(f"{name}: {e.format_message().splitlines()[0]}" for name, e in failed)
        )
        codes = {e.exit_code for _, e in failed}  # a wrong value (2) before a missing file (3), in any grid order
        err.exit_code = contract.USAGE if contract.USAGE in codes else failed[0][1].exit_code
        raise err


def _start_points(remote, run: str, name: str, fixed, pairs: list, shipped: dict, by_name: dict, mine, o) -> None:
    """Each (point, host name)'s run started detached in its host's queue, and remembered here."""
    share = Counter(host_name for _, host_name in pairs)
    for point, host_name in pairs:
        host, (sha, _, device, _) = by_name[host_name], shipped[host_name]
        overrides = _overrides(fixed, point)
        pyargs, policy = _start_args(run, mine.get(point.run_name), overrides, host, device, o)
        policy += stages.run_end_args(host, o.notify, name, share[host_name])
        stages.start_detached(remote.session_for(host), sha, point.run_name, pyargs, policy)
        choose.remember_run(remote.repo, host.name, point.run_name, run, overrides)


def _finish(remote, earlier: record.Sweep, run: str, fixed: list[str], keys: list[str], points: list, mine, hosts, o):
    """The same sweep launched again (the same run file, fixed items and grid): the points its hosts have no run
    of (a launch cut short by Ctrl-C or a lost connection) are started where the record placed them, with the
    values recorded for them; the others are left as they are. Another grid under that name is refused."""
    name = earlier.name
    again = f"`--name` another, or `status --sweep {name}`"
    same = (earlier.run_file, earlier.fixed, earlier.keys) == (run, fixed, keys)
    if not same or [p["run_name"] for p in earlier.points] != [p.run_name for p in points]:
        raise UsageError(f"sweep {name!r} was launched from here before with another run file or grid — {again}")
    if hosts and [h.strip() for h in hosts.split(",")] != earlier.hosts():
        raise UsageError(f"sweep {name!r} was placed on {', '.join(earlier.hosts())} — launch it again without --hosts")
    if not hosts and remote.host.name not in earlier.hosts():
        click.echo(f"note: sweep {name} was placed on {', '.join(earlier.hosts())}: it goes on there", err=True)
    by_name = {h: resolve_host(h, remote.repo) for h in earlier.hosts()}
    known = {
        h: {r["run_name"] for r in remote.session_for(host).enlace_json("latest", "runs")}
        for h, host in by_name.items()
    }
    unstarted = [(p, rec) for p, rec in zip(points, earlier.points) if rec["run_name"] not in known[rec["host"]]]
    if any(p.values != rec["values"] for p, rec in unstarted):  # numbered names do not tell values apart
        raise UsageError(f"sweep {name!r} was launched from here before with other values — {again}")
    slurm = next((host for host in by_name.values() if host.slurm), None)
    if slurm is not None and any(m.nproc > 1 for m in mine.values()):
        raise UsageError(f"{run}: nproc > 1 on a Slurm host is not supported yet")
    if slurm is not None and len(unstarted) == len(points):  # its job array was never submitted: submit it now
        return _on_slurm(remote, slurm, run, name, points, fixed, o, bool(mine))
    if slurm is not None:
        raise UsageError(f"sweep {name!r} was submitted to Slurm as one job array — `status --sweep {name}`")
    pairs = [(p, rec["host"]) for p, rec in unstarted]
    if not pairs:  # nothing to do: the same command twice is not a mistake
        click.echo(f"sweep {name}: every point of it was launched before; `launch POINT` runs one again", err=True)
        return earlier
    click.echo(
        f"sweep {name}: {len(points) - len(pairs)} of {len(points)} points were launched before; "
        f"launching the {len(pairs)} that were not",
        err=True,
    )
    shipped = {}
    for host_name in dict.fromkeys(h for _, h in pairs):
        click.echo(f"== {host_name}", err=True)
        shipped[host_name] = ship.ship(
            remote.session_for(by_name[host_name]),
            remote.repo,
            run,
            o.allow_dirty,
            False,
            _overrides(fixed, pairs[0][0]),
        )
    _check_points(remote, run, fixed, pairs, shipped, by_name)
    _start_points(remote, run, name, fixed, pairs, shipped, by_name, mine, o)
    return earlier


def _overrides(fixed: list[str], point) -> tuple[str, ...]:
    """A point's --set items: the sweep's fixed ones, its values, its run name."""
    return (*fixed, *point.sets(), f"run_name={point.run_name}")


def _start_args(run: str, mine, overrides: tuple, host, device, o) -> tuple[list[str], list[str]]:
    """`enlace start`'s python arguments and options for one point: enlace's trainer with the point's --set, or
    (`mine`) the run file's own command with them applied (its supervise: policy unless --restarts was given)."""
    if mine is None:
        policy = [
            "--restarts",
            str(o.restarts),
            *(["--stall-timeout", str(o.stall_timeout)] if o.stall_timeout else []),
        ]
        return stages.train_command(run, ship.set_args(overrides), None), policy + stages.queue_args(host, device, None)
    mine = own_launch.effective(mine, o.restarts if o.restarts_given else None, o.stall_timeout)
    policy = own_launch.policy(mine)
    procs = str(mine.nproc) if mine.nproc > 1 else None
    return [], [*policy, *stages.queue_args(host, device, procs), *own_launch.spec_args(mine)]


def _on_slurm(remote, host, run: str, name: str, points: list, fixed: list[str], o, own: bool) -> record.Sweep:
    """The sweep as one job array on a Slurm host (`--array=0-N%max_running`): each task a run, requeued at its
    time limit and resumed exactly, as a single run's job is."""
    if o.notify:
        raise UsageError("--notify: a Slurm run does not notify yet (docs/sweeps.md says what does)")
    session = remote.session_for(host)
    sha, *_ = ship.ship(session, remote.repo, run, o.allow_dirty, False, _overrides(fixed, points[0]))
    _refuse_taken(remote, [host], points)
    tasks = []
    for point in points:
        overrides = _overrides(fixed, point)
        ship.verify(session, sha, run, True, overrides, quiet=True)
        pyargs = [] if own else trainer_args(run, ship.set_args(overrides))
        tasks.append({"run": point.run_name, "pyargs": pyargs, "sets": overrides})
    sweep = record.Sweep(
        name,
        run,
        fixed,
        list(points[0].values),
        [{"run_name": p.run_name, "host": host.name, "values": p.values} for p in points],
        None,
    )
    record.save(remote.repo, sweep)
    gpus = 1 if own else host.slurm.gpus_per_node or 1  # a command is one process (nproc > 1: not on Slurm yet)
    args = ["--slurm", json.dumps(host.slurm.to_json()), "--gpus", str(gpus)]
    # a command's tasks carry their --set: the server builds each command from the run file (small on the wire)
    wire = [{"run": t["run"], "pyargs": t["pyargs"], **({"sets": t["sets"]} if own else {})} for t in tasks]
    args += ["--tasks", json.dumps(wire), *(["--command-run", run] if own else [])]
    args += ["--limit", str(o.max_running)] if o.max_running else []
    doc = session.enlace_json(sha, "submit-array", name, *args, idempotent=False)
    for task in tasks:
        choose.remember_run(remote.repo, host.name, task["run"], run, task["sets"])
    first, last = doc["tasks"][tasks[0]["run"]], doc["tasks"][tasks[-1]["run"]]
    limit = f", at most {o.max_running} at once" if o.max_running else ""
    click.echo(f"submitted sweep {name} to Slurm on {host.name}: job array {first}..{last}{limit}", err=True)
    return sweep
