"""The server half of `enlace-remote data push` and `data ls`: one process compares the driver's list of
files with the data directory, then receives what differs on the same stdin (fetch's wire, the other way;
enlace/server/fetchserve.py). Standard library only.

The wire, on this process's stdin/stdout (PATHs and GLOBs relative to the data directory):

    driver → server   one JSON line: {"files": [[PATH, SIZE, MTIME_NS], ...], "scope": [GLOB, ...]}
    server → driver   one JSON line: {"ok": true, "data_dir", "have": {PATH: STATE}, "extra": [[PATH, SIZE]]}
                      STATE: "same" (size and mtime agree); ["sha256", HEX] (same size, another mtime: its
                      hash); ["partial", N, PREFIX_HEX] (an earlier push left N bytes of it); null (absent,
                      or another size). extra: files the scope matches here that the driver did not list
    driver → server   one JSON line: {"send": [[PATH, OFFSET, SIZE, MTIME_NS], ...], "touch": [[PATH, MTIME_NS]],
                      "delete": [PATH, ...]}; or nothing (end of input: `ls`, --dry-run, nothing to do)
    driver → server   per sent file: START and N (8 bytes big-endian each; START is OFFSET), N bytes, then the
                      sha256 of the whole file (32 bytes)
    server → driver   one JSON line: {"ok": true, "written": [PATH], "bad": [PATH], "touched": K, "deleted": [PATH]}

A file arrives in <data_dir>/../.partial-push/PATH, is hashed as it arrives, and lands in data/ only when
its sha256 matches the driver's: a running job never reads a half-written file, and what a dropped
connection left there is where the next push continues. How it lands (a new top directory whole, in one
rename; data/ on another file system) is enlace/server/datalanding.py. One push at a time per data
directory: a second one waits on a lock, sending {"waiting": ...} lines meanwhile, and then finds what the first one sent. The answer's "in_use"
names the active runs that read files this push would change (enlace/server/datainuse.py); a plan with
"force" records the change in those runs. A full disk is one NoSpaceError line (exit 9).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import select
import shutil
import socket
import stat
import time
from pathlib import Path
from typing import Any, BinaryIO

from enlace.contract import FRAME
from enlace.data.paths import in_scope, real_dir, stat_in
from enlace.errors import EnlaceError, NoSpaceError
from enlace.hashing import file_sha256, write_all
from enlace.server import datainuse
from enlace.server.datalanding import BESIDE, land, land_whole, mkdir_once, new_tops
from enlace.sysinfo import grow_pipe

STAGING = ".partial-push"
CHUNK = 4 << 20
SMALL = 64 << 10  # a file this small is read whole before it is written (larger ones as they arrive)
WAITING_EVERY_S = 5.0  # while another push holds the lock, a {"waiting"} line this often (the driver's stall clock)
IDLE_S = 180.0  # no byte from the driver for this long: it is gone (a silent network drop); end, freeing the lock


class BadRequest(EnlaceError):
    pass


def checked(data_dir: str | Path, rel: str, dirs: dict[str, str]) -> str:
    """data_dir/rel, refused unless it is a plain relative path that stays inside data_dir. `dirs`: the
    directories resolved so far (paths.real_dir)."""
    parts = rel.split("/")  # as given: PurePosixPath would quietly drop "." and empty parts
    if "\0" in rel or rel.startswith("/") or any(p in ("..", ".", "") for p in parts):
        raise BadRequest(f"data push: refusing path {rel!r}: it could escape the data directory")
    if parts[0] == STAGING or BESIDE in parts:
        raise BadRequest(f"data push: refusing path {rel!r}: a staging directory is not data")
    return inside(data_dir, rel, dirs)


def inside(data_dir: str | Path, rel: str, dirs: dict[str, str]) -> str:
    """data_dir/rel, refused when its directory resolves outside data_dir (a link): for a path checked() let
    through, whose directory may have been swapped since (the writes resolve each one again, once)."""
    target = f"{data_dir}/{rel}"  # a POSIX server; rel checked (os.path's calls cost 20,000 files a second)
    real = real_dir(target.rpartition("/")[0], dirs)
    top = str(data_dir)
    if real != top and not real.startswith(top + os.sep):
        raise BadRequest(f"data push: {rel!r} leads outside {data_dir} (a link?): refused")
    return target


def state_of(
    data_dir: str | Path,
    staging: str,
    rel: str,
    size: int,
    mtime_ns: int,
    hashers: dict,
    dirs: dict[str, str],
    present: dict[str, bool],
) -> Any:
    """What this side holds of one file (see the wire); a partial's prefix hash is kept in `hashers`. `dirs`: the
    directories resolved so far; `present`: those found missing (a first push of thousands has none of them)."""
    target = checked(data_dir, rel, dirs)
    st = stat_in(target, present)
    if st is not None and st.st_size == size and (st.st_mtime_ns == mtime_ns or _redated_link(target, st, mtime_ns)):
        return "same"
    partial = f"{staging}/{rel}"
    held = stat_in(partial, present)
    if held is not None and stat.S_ISREG(held.st_mode) and 0 < held.st_size <= size:
        hashers[rel] = file_sha256(partial)
        return ["partial", held.st_size, hashers[rel].hexdigest()]
    if st is not None and st.st_size == size:
        return ["sha256", file_sha256(target).hexdigest()]
    return None


def _redated_link(target: str, st: os.stat_result, mtime_ns: int) -> bool:
    """A link (to a shared copy) that a push re-dated (its own time, never its file's), its file unchanged
    since: the file's mtime is no later than the link's change."""
    own = os.lstat(target)
    return own.st_mtime_ns == mtime_ns and st.st_mtime_ns <= own.st_ctime_ns


def receive(
    data_dir: Path, requests: BinaryIO, out: BinaryIO, runs_root: Path | None = None, root: Path | None = None
) -> dict[str, Any] | None:
    """Answer the driver's list, then take what it sends (see the module doc). Returns the final report,
    or None when the driver only looked. `runs_root`: the runs whose data this push may change; `root`: the
    project root their data paths are relative to (data_dir's parent unless said: data/ may be a link)."""
    root = root or data_dir.parent
    with contextlib.suppress(OSError, ValueError, AttributeError):  # not a real pipe (a test's BytesIO)
        grow_pipe(requests.fileno(), CHUNK // 4)  # sshd's pipe to us: 1 MiB reads instead of 64 KiB ones
    data_dir = Path(os.path.realpath(data_dir))  # a tree's `data` link: its target (made again if removed)
    data_dir.mkdir(parents=True, exist_ok=True)
    requests = _Watched(requests)
    with one_push_at_a_time(data_dir, out):
        return _receive(data_dir, requests, out, runs_root or data_dir.parent / "runs", root)


@contextlib.contextmanager
def one_push_at_a_time(data_dir: Path, out: BinaryIO):
    """An exclusive lock on the data directory's push (the kernel drops it when a holder dies)."""
    with open(data_dir.parent / ".data-push.lock", "a") as fh:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                _write_line(out, {"waiting": f"another data push to {data_dir} is under way: waiting for it"})
                deadline = time.monotonic() + WAITING_EVERY_S
                while time.monotonic() < deadline:
                    with contextlib.suppress(BlockingIOError):
                        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    time.sleep(0.2)
                else:
                    continue
                break
        yield


def _receive(data_dir: Path, requests: BinaryIO, out: BinaryIO, runs_root: Path, root: Path) -> dict[str, Any] | None:
    staging = str(data_dir.parent / STAGING)
    data = str(data_dir)  # in strings from here: tens of thousands of files pass through the same few calls
    first = _json_line(requests, "file list")
    if first is None:
        return None
    files = {str(p): (int(s), int(m)) for p, s, m in first["files"]}
    hashers: dict[str, Any] = {}
    dirs: dict[str, str] = {}
    present: dict[str, bool] = {}
    have = {rel: state_of(data, staging, rel, s, m, hashers, dirs, present) for rel, (s, m) in files.items()}
    for parent in {f"{data}/{rel}".rpartition("/")[0] for rel in files}:
        if os.path.lexists(os.path.join(parent, BESIDE)):  # what a failed cross-file-system copy left
            shutil.rmtree(os.path.join(parent, BESIDE), ignore_errors=True)
    extra = [[rel, (data_dir / rel).stat().st_size] for rel in in_scope(data_dir, first["scope"]) if rel not in files]
    changing = [rel for rel, state in have.items() if state != "same"] + [rel for rel, _ in extra]
    in_use = datainuse.readers(data_dir, changing, runs_root, root)
    _write_line(out, {"ok": True, "data_dir": str(data_dir), "have": have, "extra": extra, "in_use": in_use})
    plan = _json_line(requests, "plan")
    if plan is None:
        return None
    report: dict[str, Any] = {"ok": True, "written": [], "bad": [], "touched": 0, "deleted": []}
    # each directory resolved again for the writes, once: one swapped for a link outside data/ since the listing
    # (the driver may have waited on its user) is refused; within the writes, as a directory is first written to
    dirs = {}
    for rel, mtime_ns in plan.get("touch", []):
        if isinstance(have.get(rel), list) and have[rel][0] == "sha256":  # the same bytes: only the mtime differs
            # a link (to a shared copy on the server): its own time, never the file it points at
            os.utime(inside(data, rel, dirs), ns=(mtime_ns, mtime_ns), follow_symlinks=False)
            report["touched"] += 1
    made: set[str] = set()
    whole = new_tops(data, staging, [rel for rel, _, _, _ in plan.get("send", [])])
    for rel, offset, size, mtime_ns in plan.get("send", []):
        if files.get(rel, (None,))[0] != size or not 0 <= offset <= size:
            raise BadRequest(f"data push: {rel!r} from byte {offset} was not in the list")
        hasher = hashers.get(rel) if offset else None
        target, partial = inside(data, rel, dirs), f"{staging}/{rel}"  # rel: one the listing checked
        try:
            ok = _take(requests, partial, offset, size, mtime_ns, hasher or hashlib.sha256(), made)
            if ok and rel.partition("/")[0] not in whole:  # (a new top directory's files land with it, below)
                land(partial, target, made)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):  # a full disk, or the account's quota
                raise
            raise no_space(target, size - offset) from None
        report["written" if ok else "bad"].append(rel)
    for top in sorted(whole):
        land_whole(f"{staging}/{top}", f"{data}/{top}", made)
    extras = {rel for rel, _ in extra}
    for rel in plan.get("delete", []):
        if rel not in extras:
            raise BadRequest(f"data push: {rel!r} is not one this run's data paths match here: not deleted")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(checked(data, rel, dirs))
        report["deleted"].append(rel)
    changed = [rel for rel in report["written"] + report["deleted"] if rel in in_use]
    if changed and plan.get("force"):
        datainuse.mark_changed(runs_root, {n for rel in changed for n in in_use[rel]}, changed)
    _write_line(out, report)
    return report


class _Watched:
    """The driver's stream, read here straight from its descriptor (so that waiting for it can be bounded):
    a read that gets no byte for IDLE_S ends the push (BadRequest), so a driver gone in a silent network
    drop never holds the data directory's lock for sshd's keepalive hours. A stream without a descriptor
    (a test's BytesIO) is read as it is."""

    def __init__(self, stream: BinaryIO):
        self.stream, self.buf = stream, bytearray()
        try:
            self.fd = stream.fileno()
        except (OSError, ValueError, AttributeError):
            self.fd = None
        self.raw = io.FileIO(self.fd, "rb", closefd=False) if self.fd is not None else None

    def _wait(self) -> None:
        if not select.select([self.fd], [], [], IDLE_S)[0]:
            raise BadRequest(f"data push: nothing from the driver for {IDLE_S:g}s: it is gone (what arrived stays)")

    def _fill(self) -> bytes:
        self._wait()
        chunk = os.read(self.fd, CHUNK // 4)
        self.buf += chunk
        return chunk

    def readline(self) -> bytes:
        if self.fd is None:
            return self.stream.readline()
        while b"\n" not in self.buf and self._fill():
            pass
        end = self.buf.find(b"\n") + 1 or len(self.buf)
        line = bytes(self.buf[:end])
        del self.buf[:end]
        return line

    def read(self, n: int) -> bytes:
        if self.fd is None:
            return self.stream.read(n)
        if not self.buf:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def readinto(self, view) -> int:
        if self.fd is None:
            return self.stream.readinto(view)
        if not self.buf:  # straight from the pipe into the caller's buffer: a large file's bytes copied once
            self._wait()
            return self.raw.readinto(view) or 0
        n = min(len(view), len(self.buf))
        with memoryview(self.buf) as held:
            view[:n] = held[:n]
        del self.buf[:n]
        return n


def no_space(target: str | Path, needed: int) -> NoSpaceError:
    """The one line a full disk during a push is: host, path, bytes needed, what is free."""
    target = Path(target)
    try:
        free = shutil.disk_usage(target.parent if target.parent.exists() else target.parent.parent).free
    except OSError:
        free = 0
    return NoSpaceError(
        f"data push: no space left on {socket.gethostname()} for {target} ({needed:,} bytes to write, "
        f"{free:,} free there) — free space there and push again: what arrived stays and the push resumes"
    )


def _take(requests: BinaryIO, partial: str, offset: int, size: int, mtime_ns: int, hasher, made: set[str]) -> bool:
    """One file's frame into `partial`, its mtime set: whether its sha256 matches the trailer (a file that does
    not is removed). `made`: the directories this push has created (thousands of small files share a few)."""
    start, count = FRAME.unpack(_exactly(requests, FRAME.size))
    if start != offset or start + count != size:
        raise BadRequest(f"data push: {os.path.basename(partial)}: frame {start}+{count} does not match the plan")
    mkdir_once(partial.rpartition("/")[0], made)
    whole = _exactly(requests, count + 32) if count <= SMALL else None  # a small file's bytes and hash, at once
    # A new file is created empty (O_TRUNC truncates nothing a create made); a resumed one keeps its first `start`
    # bytes, what follows dropped only where there is some: ext4 writes a file truncated to 0 back to disk when
    # it is closed (auto_da_alloc), which cost every new file of a push a flush
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | (0 if start else os.O_TRUNC), 0o666)
    try:
        if start:
            if os.fstat(fd).st_size > start:
                os.ftruncate(fd, start)
            os.lseek(fd, start, os.SEEK_SET)
        if whole is not None:
            body = memoryview(whole)[:count]
            write_all(fd, body)
            hasher.update(body)
            trailer = whole[count:]
        else:
            _stream_into(requests, fd, count, hasher)  # a large file: written as it arrives
            trailer = _exactly(requests, 32)
        ok = trailer == hasher.digest()
        if ok:
            os.utime(fd, ns=(mtime_ns, mtime_ns))
    finally:
        os.close(fd)
    if not ok:
        os.unlink(partial)
    return ok


def _stream_into(requests: BinaryIO, fd: int, count: int, hasher) -> None:
    """`count` bytes of the driver's stream into `fd` as they arrive (what arrived stays for the next push)."""
    buf = memoryview(bytearray(min(count, CHUNK)))
    while count:
        n = requests.readinto(buf[: min(count, len(buf))])
        if not n:
            raise BadRequest("data push: the driver went away in mid-file (what arrived stays for the next push)")
        write_all(fd, buf[:n])
        hasher.update(buf[:n])
        count -= n


def _exactly(stream: BinaryIO, n: int) -> bytes:
    first = stream.read(n)
    if len(first) == n:  # all of it was there (small files: nearly always)
        return first
    buf = bytearray(first)
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise BadRequest("data push: the driver went away in mid-transfer")
        buf.extend(chunk)
    return bytes(buf)


def _json_line(stream: BinaryIO, what: str) -> dict | None:
    line = stream.readline()
    if not line.strip():
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        raise BadRequest(f"data push: unreadable {what} {line[:200]!r}") from None
    if not isinstance(doc, dict):
        raise BadRequest(f"data push: unreadable {what}")
    return doc


def _write_line(out: BinaryIO, doc: dict) -> None:
    out.write(json.dumps(doc).encode() + b"\n")
    out.flush()
