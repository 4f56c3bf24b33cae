"""`data push RUN` and `data ls RUN`: bring the server's <remote_dir>/data/ to the files RUN reads here.

    local  data/...                          resolved from RUN's config by the trainer's own rules
                                             (enlace/data/paths.py), so what is pushed is what it will read
    server <remote_dir>/data/...             the same relative paths; a file appears whole (renamed in)
    server <remote_dir>/.partial-push/...    what a dropped connection left: the next push continues it

One conversation with `enlace data-receive` (enlace/server/datarecv.py has the wire) over the host's one SSH
connection: we list our files (path, size, mtime), the server says what it holds, we send what differs
(a file of the same size but another mtime is compared by sha256 first, and only touched when it is the
same), each followed by its sha256, which the server checks before it renames the file in. Nothing is
deleted there unless --delete, and then only files this run's data paths match.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import click

from enlace.config import command
from enlace.config.schema import load_config
from enlace.contract import FRAME, ErrorKind
from enlace.data.paths import DATA_DIR, FileStat, file_stat, match_files, push_files, push_scope, real_dir, under_data
from enlace.errors import EnlaceError
from enlace.hashing import file_sha256
from orchestrator.errors import Transient, UsageError
from orchestrator.ssh.session import Session
from orchestrator.transfer.gitsync import print_sync, sync
from orchestrator.transfer.wire import Progress, Reader, human_bytes, retrying

STALL_S = 60.0  # no byte from the server for this long: the connection is dead, reconnect
CHUNK = 4 << 20
SMALL = 64 << 10  # a file this small goes as one write: its frame, bytes and hash (larger ones are not copied)


@dataclass
class LocalData:
    """What RUN reads here: globs relative to data/, notes on what is not pushed, and each file by its
    path relative to data/ → (local path, size, mtime in ns). The files are listed on a helper thread while
    the server side starts (tens of thousands take a fifth of a second); `files` waits for them, and raises
    what the listing raised (a link leading outside data/, a pattern that matches nothing)."""

    run: str
    globs: list[str]
    notes: list[str]
    listing: Future

    @property
    def files(self) -> dict[str, tuple[str, int, int]]:
        return self.listing.result()

    @property
    def bytes(self) -> int:
        return sum(size for _, size, _ in self.files.values())


@dataclass
class Plan:
    send: list[list] = field(default_factory=list)  # [path, offset, size, mtime_ns]
    touch: list[list] = field(default_factory=list)  # [path, mtime_ns]: same bytes, another mtime
    delete: list[str] = field(default_factory=list)
    same: int = 0
    prefixes: dict[str, Any] = field(default_factory=dict)  # path → sha256 of the bytes the server holds

    @property
    def bytes(self) -> int:
        return sum(size - offset for _, offset, size, _ in self.send)

    def doc(self) -> dict:
        return {"send": self.send, "touch": self.touch, "delete": self.delete}


def local_data(repo: Path, run: str, overrides=(), follow_links: bool = False) -> LocalData:
    """RUN's data files in this checkout, resolved as the trainer resolves them. A link that leads outside
    data/ is refused (a link to /etc/passwd was uploaded), unless `follow_links`."""

    own = command.load(run, repo, overrides)  # a run of your own command: its `data:` globs
    stats: dict[str, FileStat] = {}  # what the listing learns of each file: asked of the system once
    if own is not None:
        globs, notes = [under_data(p, "data") for p in own.data], []
        find = partial(match_files, list(own.data), repo, stats, key=f"configs/runs/{run}.yaml: data", run=run)
    else:
        cfg = load_config(run, overrides, repo)
        globs, notes = push_scope(cfg.data)
        find = partial(push_files, cfg.data, repo, stats)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="data-listing")
    listing = pool.submit(lambda: _listed(repo, find() if globs else [], follow_links, stats))
    pool.shutdown(wait=False)  # the listing goes on meanwhile; `files` waits for it
    return LocalData(run, globs, notes, listing)


def _listed(
    repo: Path, found: list[str], follow_links: bool, stats: dict[str, FileStat]
) -> dict[str, tuple[str, int, int]]:
    """{path relative to data/: (path, size, mtime in ns)} of the files found (`stats`: what their listing
    learnt of them); a link leading outside data/ refused unless `follow_links`."""
    files = {}
    top, real_dirs = str(repo / DATA_DIR) + os.sep, {}
    corpus = os.path.realpath(top) + os.sep
    for name in found:  # in strings, each directory resolved once: tens of thousands of files are common
        got = stats.get(name) or file_stat(name)
        if got is None:
            raise UsageError(f"{os.path.relpath(name, repo)} is gone (or no file): it vanished while listed")
        st, link = got
        if link:
            real = os.path.realpath(name)  # what it points to is what is sent
        else:
            parent, base = os.path.split(name)
            real = os.path.join(real_dir(parent, real_dirs), base)
        if not follow_links and not real.startswith(corpus):
            raise UsageError(
                f"{os.path.relpath(name, repo)} {'is a link to' if link else 'lies, through a linked directory, at'} "
                f"{real}, outside {DATA_DIR}/: refused — copy the "
                "file into the corpus, or pass --follow-links to send what it points to"
            )
        rel = name[len(top) :] if name.startswith(top) else os.path.relpath(name, repo / DATA_DIR)
        files[rel.replace(os.sep, "/")] = (name, st.st_size, st.st_mtime_ns)
    return files


def decide(local: LocalData, have: dict[str, Any], extra: list, delete: bool) -> Plan:
    """What to send, touch and delete, from the server's answer (enlace/server/datarecv.py: STATE)."""
    plan = Plan()
    for rel, (path, size, mtime) in local.files.items():
        state = have.get(rel)
        if state == "same":
            plan.same += 1
            continue
        offset = 0
        if isinstance(state, list) and state[0] == "sha256":
            if file_sha256(path).hexdigest() == state[1]:
                plan.touch.append([rel, mtime])
                plan.same += 1
                continue
        elif isinstance(state, list) and state[0] == "partial":
            held, prefix = int(state[1]), file_sha256(path, int(state[1]))
            if held <= size and prefix.hexdigest() == state[2]:
                offset, plan.prefixes[rel] = held, prefix
        plan.send.append([rel, offset, size, mtime])
    if delete:
        plan.delete = [rel for rel, _ in extra]
    return plan


def converse(
    session: Session, local: LocalData, push: bool, delete: bool = False, force: bool = False, before_send=None
) -> tuple[dict, Plan, dict | None]:
    """The server's answer, the plan and (when `push` and there is something to do) its report. Files that a
    live run reads are not changed unless `force` (the server then tells those runs); `before_send(plan)` may
    refuse the plan (a UsageError) before a byte is sent."""
    kept = "what arrived stays in <remote_dir>/.partial-push on the server"
    return retrying("data push", kept, lambda tick: _once(session, local, push, delete, force, tick, before_send))


def _refuse_in_use(plan: Plan, in_use: dict[str, list[str]]) -> None:
    """Refuse, before a byte is sent, a plan that changes files a live run reads (the server's "in_use")."""
    hit = {rel: in_use[rel] for rel in [r for r, _, _, _ in plan.send] + plan.delete if rel in in_use}
    if not hit:
        return
    names, files = sorted({n for ns in hit.values() for n in ns}), sorted(hit)
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    one = len(names) == 1
    raise UsageError(
        f"data push would change {shown}, which {', '.join(names)} {'reads' if one else 'read'} while alive: a "
        f"restart would then refuse the changed data — push once {'it ends' if one else 'they end'}, or pass "
        "--force (healing then needs launch --allow-data-change)"
    )


def _once(
    session: Session, local: LocalData, push: bool, delete: bool, force: bool, tick, before_send=None
) -> tuple[dict, Plan, dict | None]:
    argv = session.enlace_argv("latest", "data-receive", "--json")
    with session.transport.duplex(argv, STALL_S, tick) as wire:  # the server side starts while our files are listed
        listing = {"files": [[rel, s, m] for rel, (_, s, m) in local.files.items()], "scope": local.globs}
        reader = Reader(wire, "data push")
        try:
            wire.write(json.dumps(listing).encode() + b"\n")
        except Transient:
            _answer(
                session, wire, _past_waiting(session, reader)
            )  # the server refused before reading (e.g. nothing synced)
            raise
        answer = _answer(session, wire, _past_waiting(session, reader))
        plan = decide(local, answer["have"], answer["extra"], delete)
        if not push or not (plan.send or plan.touch or plan.delete):
            wire.finish()
            return answer, plan, None
        try:
            if not force:
                _refuse_in_use(plan, answer.get("in_use") or {})
            if before_send is not None:
                before_send(plan)
        except UsageError:
            wire.finish()  # nothing was sent: the server sees the end of its input
            raise
        try:
            wire.write(json.dumps({**plan.doc(), "force": force}).encode() + b"\n")
            out = _Batched(wire)
            files = local.files  # the listing's result, asked once (not per file: 20,000 lock round trips)
            with Progress(f"push {session.host.name}", plan.bytes + sum(o for _, o, _, _ in plan.send)) as bar:
                for rel, offset, size, _ in plan.send:
                    bar.skip(offset)
                    _send(out, files[rel][0], offset, size, plan.prefixes.get(rel), bar, tick)
            out.flush()
        except Transient:
            _answer(session, wire, reader.readline())  # the server's own refusal, when it gave one
            raise
        report = _answer(session, wire, reader.readline())
        code, err = wire.finish()
        if code != 0:
            raise EnlaceError(f"data push to {session.host.name}: the server side exited {code}: {err.strip()[-500:]}")
    return answer, plan, report


class _Batched:
    """Writes to the wire, small ones gathered into one (thousands of small files: a few large writes)."""

    def __init__(self, wire):
        self.wire, self.pending = wire, bytearray()

    def write(self, data) -> None:
        if len(data) >= CHUNK // 4:
            self.flush()
            self.wire.write(data)
            return
        self.pending += data
        if len(self.pending) >= CHUNK // 4:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.wire.write(bytes(self.pending))
            self.pending.clear()


def _send(out: _Batched, path: str, offset: int, size: int, prefix, bar: Progress, tick) -> None:
    """One file's frame from `offset`, then the whole file's sha256 (prefix: the hash of what the server holds).
    A SMALL file is one write (thousands of small files: a third of the calls)."""
    hasher = prefix.copy() if prefix is not None else hashlib.sha256()
    head = FRAME.pack(offset, size - offset)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))  # Windows: no newline translation
    try:
        if offset:
            os.lseek(fd, offset, os.SEEK_SET)
        left = size - offset
        while left:
            tick()
            chunk = os.read(fd, min(left, CHUNK))
            if not chunk:
                raise EnlaceError(f"{path} shrank while it was being pushed — push again once it is written")
            hasher.update(chunk)
            left -= len(chunk)
            bar.update(len(chunk))
            if head and not left and len(chunk) <= SMALL:
                out.write(head + chunk + hasher.digest())
                return
            if head:
                out.write(head)
                head = b""
            out.write(chunk)
    finally:
        os.close(fd)
    out.write(head + hasher.digest())  # an empty remainder: the frame, then the hash


def _past_waiting(session: Session, reader) -> bytes:
    """The server's next line, past the {"waiting"} lines it sends while another push holds data/'s lock."""
    said = False
    while True:
        line = reader.readline()
        if not line.startswith(b'{"waiting"'):  # the server's answer (a large one is parsed once, by _answer)
            return line
        doc = json.loads(line)
        if not said:
            click.echo(f"data push → {session.host.name}: {doc['waiting']}", err=True)
            said = True


def _answer(session: Session, wire, line: bytes) -> dict:
    """The server's JSON line, or its refusal raised as the error it names."""
    try:
        doc = json.loads(line)
        if isinstance(doc, dict) and doc.get("ok") is not False:
            return doc
    except json.JSONDecodeError:
        pass
    code, err = wire.finish()
    if not line.strip() and code == 0:
        raise Transient("data push: the server side ended early", started=True)
    return session.answer("enlace data-receive", line.decode(errors="replace"), err, code, (0,))


def push(
    session: Session,
    repo: Path,
    local: LocalData,
    delete: bool = False,
    dry_run: bool = False,
    force: bool = False,
    allow_dirty: bool = False,
    before_send=None,
) -> Plan:
    """The whole push to one host (a sync first when it has no tree yet); its summary on stderr. Raises
    when a file arrived corrupted (it was not installed), or would change what a live run reads (unless
    `force`)."""
    t0 = time.perf_counter()
    talk = lambda: converse(session, local, not dry_run, delete, force, before_send)
    answer, plan, report = synced_first(session, repo, talk, allow_dirty)
    if dry_run and not force:  # what the push itself would answer: a dry run says it too
        _refuse_in_use(plan, answer.get("in_use") or {})
    if report and report["bad"]:
        raise EnlaceError(  # not the user's mistake: a transfer that went wrong, said as such
            f"{session.host.name}: {len(report['bad'])} file(s) arrived corrupted and were not installed "
            f"({', '.join(report['bad'][:3])}) — push again"
        )
    click.echo(summary(session.host.name, local, plan, report, dry_run, time.perf_counter() - t0), err=True)
    return plan


def synced_first(session: Session, repo: Path, fn, allow_dirty: bool = False):
    """fn(), after a sync (of HEAD; `allow_dirty`: despite uncommitted changes) when the server has no tree yet
    (data-receive runs in the newest one)."""
    try:
        return fn()
    except EnlaceError as e:
        if getattr(e, "kind", None) != ErrorKind.NOT_SYNCED:
            raise

    print_sync(sync(session, repo, allow_dirty=allow_dirty))
    return fn()


def summary(host: str, local: LocalData, plan: Plan, report: dict | None, dry_run: bool, seconds: float) -> str:
    """One line for the user: what was (or would be) sent, touched, deleted, and what already matched."""
    total = f"{len(local.files)} files, {human_bytes(local.bytes)}"
    if not (plan.send or plan.touch or plan.delete):
        return f"data push {local.run} → {host}: up to date ({total}); nothing sent"
    verb = "would send" if dry_run else "sent"
    parts = [f"{verb} {len(plan.send)} file(s), {human_bytes(plan.bytes)}"]
    resumed = sum(1 for _, o, _, _ in plan.send if o)
    if resumed:
        parts.append(f"{resumed} resumed where an earlier push stopped")
    if plan.touch:
        parts.append(f"{len(plan.touch)} only re-dated (same bytes)")
    if plan.delete:
        parts.append(f"{'would delete' if dry_run else 'deleted'} {len(plan.delete)}")
    parts.append(f"{plan.same - len(plan.touch)} already there")  # the re-dated ones are said above
    rate = f" in {seconds:.1f}s ({human_bytes(plan.bytes / max(seconds, 1e-6))}/s)" if not dry_run else ""
    return f"data push {local.run} → {host}: " + ", ".join(parts) + f" ({total}){rate}"
