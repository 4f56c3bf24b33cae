"""The server half of `enlace-remote fetch`: one process answers what may be fetched and then serves
the bytes on the same stdout, so a whole fetch is one SSH channel on the driver's one connection (no
second connection for rsync, no separate manifest call). The driver hashes while it receives.

The wire, on this process's stdin/stdout:

    server → driver   one JSON line: the offer — complete checkpoints with their MANIFEST entries, the
                      exports kept in the run (exports/NAME/, with theirs), the run files with their sizes,
                      a command run's outputs with theirs and "output_digests": "trailing", the checkpoints set
                      aside with their MANIFESTs' files (or {"ok": false, "error", "exit_code"}, then exit)
    driver → server   one JSON line: {"send": [[PATH, OFFSET, PREFIX_SHA256], ...]}, PATHs relative
                      to the run dir, each one the offer lists; OFFSET > 0 resumes a file the driver
                      holds the first OFFSET bytes of, whose sha256 is PREFIX_SHA256 (an output the driver
                      holds whole, fetched before, is asked from its end: nothing travels when it is the same)
    server → driver   per requested file: START and N (8 bytes big-endian each), then N bytes: the file
                      from START, which is OFFSET when the prefixes agree, else 0 (a different file:
                      the driver starts it again); after an output's bytes, the sha256 of the whole file
                      (32 bytes); then this process exits 0

Every checkpoint and run file is opened before the offer is written, and served from that open descriptor: a
checkpoint a live run prunes meanwhile, or a run.json it replaces, is still served whole and consistent (the
sizes in the offer are those of the open files; a growing log is served up to its size at offer time; a
checkpoint's sha256 is in its MANIFEST). A command run's outputs (thousands of a few KiB are common) are only
listed for the offer, then each is read once when sent, as it is then, and hashed as it goes out: the driver
writes one while this process reads the next, where hashing them all for the offer kept the driver waiting.
Small ones go many frames to a write.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from enlace.config.command import CommandRun, expand
from enlace.contract import FRAME, RUN_FILES
from enlace.data.paths import real_dir
from enlace.errors import CheckpointError, EnlaceError
from enlace.hashing import fd_sha256, write_all
from enlace.manifest import MANIFEST, complete_checkpoints, latest_checkpoint, read_manifest, set_aside_listing
from enlace.state import runs
from enlace.sysinfo import grow_pipe

BATCH = 1 << 20  # small frames are gathered into writes of about this size


class BadRequest(EnlaceError):
    pass


def _open(path: str | Path) -> tuple[int, int] | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    return fd, os.fstat(fd).st_size


def _open_verified_dir(directory: Path) -> tuple[dict[str, Any], dict[str, tuple[int, int]]] | None:
    """A directory with a MANIFEST (a complete checkpoint, an export): its manifest and {name: (fd, size)} for
    its files and MANIFEST, all opened; None when it vanished meanwhile (pruned by a live run)."""
    try:
        m = read_manifest(directory)
    except CheckpointError:
        return None
    opened = {name: _open(directory / name) for name in [*m["files"], MANIFEST]}
    if None in opened.values():
        for got in opened.values():
            if got:
                os.close(got[0])
        return None
    return m, opened


Source = int | str  # an open descriptor (checkpoints, run files), or an output's real path (read when sent)


def open_offer(run_dir: Path, outputs: bool = False) -> tuple[dict[str, Any], dict[str, tuple[Source, int]]]:
    """The offer and {path: (source, size)} for every file in it. A checkpoint that vanishes while
    it is being opened (pruned by a live run) is left out whole."""
    held: dict[str, tuple[Source, int]] = {}
    listed: dict[str, list] = {"checkpoints": [], "exports": []}
    dirs = [("checkpoints", c) for c in complete_checkpoints(run_dir / "checkpoints")]
    dirs += [("exports", m.parent) for m in sorted((run_dir / "exports").glob("*/MANIFEST"))]  # enlace export --in-run
    for kind, directory in dirs:
        got = _open_verified_dir(directory)
        if got is None:
            continue
        m, opened = got
        held.update({f"{kind}/{directory.name}/{name}": fd_size for name, fd_size in opened.items()})
        entry = {"name": directory.name, "files": m["files"], "manifest_bytes": opened[MANIFEST][1]}
        listed[kind].append({**entry, "step": m["step"]} if kind == "checkpoints" else entry)
    files = {}
    for name in RUN_FILES:
        got = _open(run_dir / name)
        if got:
            held[name] = got
            files[name] = got[1]
    offered = {}
    for rel, path, size in _outputs(run_dir) if outputs else []:  # a command run's `outputs:` (no MANIFEST)
        held[rel] = (path, size)
        offered[rel] = {"bytes": size}
    latest = latest_checkpoint(run_dir / "checkpoints")
    command = runs.read(run_dir).get("command")
    status = runs.observe(run_dir)["status"] if not listed["checkpoints"] else None  # what an empty offer means
    offer = {
        "status": status,
        "run_name": run_dir.name,
        "run_dir": str(run_dir.resolve()),
        "checkpoints": listed["checkpoints"],
        "exports": listed["exports"],
        "files": files,
        "outputs": offered,
        "output_digests": "trailing",  # each output's sha256 follows its bytes (before: in the offer)
        "command": bool(command),  # a run of the user's own command (no checkpoint due)
        "output_globs": (command or {}).get("outputs") or [],  # its `outputs:`, for a driver to say what matched none
        "latest": latest.name if latest else None,
        "set_aside": set_aside_listing(run_dir),  # a fresh start's old line: the driver moves its copies aside too
    }
    return offer, held


def _outputs(run_dir: Path) -> list[tuple[str, str, int]]:
    """The files a command run's `outputs:` globs match under its directory (relative path, real path, size): regular
    files inside it (not links), neither its checkpoints nor its run files (offered as those). In os.path's
    strings, each directory resolved once: tens of thousands of outputs are common."""
    st = runs.read(run_dir)
    if not st.get("command"):
        return []
    own = CommandRun.from_doc(st["command"], "run.json command")
    values = own.values(run_dir.resolve(), st.get("restarts") or 0)  # {run_dir} and the rest, as the command saw
    root, found, real_dirs = os.path.realpath(run_dir) + os.sep, {}, {}
    for pattern in own.outputs:
        for match in glob.glob(os.path.join(run_dir, expand(pattern, values)), recursive=True):
            try:
                st = os.lstat(match)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):  # a link, a directory
                continue
            parent, name = os.path.split(match)
            real = os.path.join(real_dir(parent, real_dirs), name)
            if not real.startswith(root):
                continue
            rel = real[len(root) :]
            hidden = rel.startswith(".") or "/." in rel  # a partial save, an editor's file
            if rel.split("/", 1)[0] not in ("checkpoints", *RUN_FILES) and not hidden:
                found[rel] = (real, st.st_size)
    return [(rel, real, size) for rel, (real, size) in sorted(found.items())]


def serve(run_dir: Path, requests: BinaryIO, out: BinaryIO, outputs: bool = False) -> None:
    """Write the offer, read the driver's request, send the requested bytes (see the module doc). `outputs`: a
    command run's outputs too (hashed for the offer: only a fetch asks, never the board's polls)."""
    offer, held = open_offer(run_dir, outputs)
    out.write(json.dumps(offer).encode() + b"\n")
    out.flush()
    line = requests.readline()
    if not line:
        return  # the driver had all it wanted already (or went away)
    try:
        wanted = [(str(p), int(o), str(h)) for p, o, h in json.loads(line)["send"]]
    except (ValueError, KeyError, TypeError):
        raise BadRequest(f"fetch: unreadable request {line[:200]!r}") from None
    for path, offset, _ in wanted:
        if path not in held or offset < 0:
            raise BadRequest(f"fetch: {path!r} from byte {offset} is not on offer")
    fd_out, pending = out.fileno(), bytearray()
    grow_pipe(fd_out, BATCH)  # our pipe to sshd holds a whole write: we read the next files while it sends
    for path, offset, prefix_sha256 in wanted:
        source, size = held[path]
        if isinstance(source, str):  # an output, read now: its frames join the next ones in one write
            for part in _output(path, source, offset, prefix_sha256):
                pending += part
                if len(pending) >= BATCH:
                    out.write(pending)
                    pending.clear()
            continue
        start, _ = _true_start(source, offset, size, prefix_sha256)
        out.write(pending + FRAME.pack(start, size - start))
        out.flush()
        pending.clear()
        _send(source, fd_out, start, size - start)
    out.write(pending)
    out.flush()


def _true_start(fd: int, offset: int, size: int, prefix_sha256: str):
    """Where the driver's copy of this file stops being the file: OFFSET when its first OFFSET bytes hash to
    PREFIX_SHA256, else 0 (the file whole); with the sha256 object of the bytes before it."""
    h = fd_sha256(fd, offset) if 0 < offset <= size else None
    return (offset, h) if h is not None and h.hexdigest() == prefix_sha256 else (0, hashlib.sha256())


def _output(rel: str, path: str, offset: int, prefix_sha256: str) -> Iterator[bytes]:
    """An output's frame, its bytes as they are now (from OFFSET when the driver holds their true start), then
    the sha256 of the whole file: read once, hashed as it goes out."""
    try:  # neither a link nor a FIFO swapped in since the listing: a regular file, or no output
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise EnlaceError(f"fetch: the output {rel} was deleted on the server while it was fetched") from None
    except OSError:  # a link now (O_NOFOLLOW): what it points to is not the run's to send
        raise EnlaceError(f"fetch: the output {rel} is no longer a regular file on the server") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise EnlaceError(f"fetch: the output {rel} is no longer a regular file on the server")
        size = st.st_size
        start, h = _true_start(fd, offset, size, prefix_sha256)
        yield FRAME.pack(start, size - start)
        while start < size:
            chunk = os.pread(fd, min(size - start, BATCH), start)
            if not chunk:
                raise EnlaceError(f"fetch: the output {rel} shrank on the server while it was sent")
            h.update(chunk)
            yield chunk
            start += len(chunk)
        yield h.digest()
    finally:
        os.close(fd)


def _send(fd: int, fd_out: int, offset: int, count: int) -> None:
    """`count` bytes of fd from `offset` to fd_out: sendfile, else (an old kernel, an odd stdout) reads."""
    try:
        while count:
            sent = os.sendfile(fd_out, fd, offset, min(count, 1 << 24))
            if sent == 0:
                raise EnlaceError(f"fetch: a file ended {count} bytes early (truncated on the server?)")
            offset, count = offset + sent, count - sent
    except OSError as e:
        if e.errno not in (22, 38):  # EINVAL, ENOSYS: sendfile cannot write there; copy instead
            raise
        while count:
            chunk = os.pread(fd, min(count, 1 << 20), offset)
            if not chunk:
                raise EnlaceError(f"fetch: a file ended {count} bytes early (truncated on the server?)") from None
            write_all(fd_out, chunk)
            offset, count = offset + len(chunk), count - len(chunk)
