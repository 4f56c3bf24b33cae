"""`fetch [RUN]`: pull complete checkpoints back, verified, incrementally, resumably.

    local runs/<run>/.partial-fetch/       one transfer's staging area, kept across interruptions
                                           (rsync --partial, or SFTP appending to a short file)
    local runs/<run>/checkpoints/step-N/   appears only once every file matched the sha256 in the
                                           server's MANIFEST (then renamed in from staging)
Only checkpoints with a MANIFEST are listed by the server. Every remote name is checked before it
becomes a local path: nothing can land outside the destination. One rsync (one SSH connection)
carries the checkpoints and the run files together.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

from enlace.checkpoint import sha256_file
from orchestrator.errors import RemoteError, UsageError
from orchestrator.session import Session
from orchestrator.transport import die_with_us

CKPT_NAME = re.compile(r"step-\d{6,}")
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
STAGING = ".partial-fetch"


class CorruptCheckpoint(RemoteError):
    pass


class Vanished(RemoteError):
    """rsync exit 24 (files vanished while it copied them) or 23 with only missing files (gone before)."""


def _safe(name: str, pattern: re.Pattern, what: str) -> str:
    if not pattern.fullmatch(name) or ".." in name:
        raise RemoteError(f"refusing {what} name {name!r} from the server: it could escape the destination")
    return name


def _already_here(final: Path, files: dict) -> bool:
    """Fetched and verified before: the local MANIFEST lists exactly the server's files."""
    try:
        return json.loads((final / "MANIFEST").read_text())["files"] == files
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return False


def fetch(session: Session, run_name: str, dest: Path, all_checkpoints: bool, attempts: int = 3) -> dict:
    """Fetch; when a checkpoint vanished on the server mid-transfer (pruned by a live run: rsync exit
    24), ask for the manifest again and fetch the new set."""
    for attempt in range(attempts):
        try:
            return _fetch_once(session, run_name, dest, all_checkpoints)
        except Vanished as e:
            if attempt == attempts - 1:
                raise RemoteError(
                    f"fetch {run_name}: files kept vanishing on the server during the transfer "
                    f"(a live run pruning checkpoints): {e.message}"
                ) from None
            click.echo(f"fetch: {e.message}; asking the server for its checkpoints again", err=True)
    raise AssertionError("unreachable")


def _fetch_once(session: Session, run_name: str, dest: Path, all_checkpoints: bool) -> dict:
    m = session.enlace_json("latest", "manifest", run_name)
    if not m["checkpoints"]:
        raise UsageError(
            f"{run_name} on {session.host.name} has no complete checkpoint yet (none with a MANIFEST) "
            "— wait for the first checkpoint.every steps, or stop the run to make it save"
        )
    wanted = m["checkpoints"] if all_checkpoints else [c for c in m["checkpoints"] if c["name"] == m["latest"]]
    root = dest.resolve()
    _claim(root, session.host.name, m["run_dir"], run_name)
    (root / "checkpoints").mkdir(parents=True, exist_ok=True)
    staging = root / STAGING
    todo, sizes = [], {}
    report = {"run_name": run_name, "dest": str(root), "fetched": [], "skipped": [], "bytes": 0}
    for ck in wanted or m["checkpoints"][-1:]:
        name = _safe(ck["name"], CKPT_NAME, "checkpoint")
        if _already_here(root / "checkpoints" / name, ck["files"]):
            report["skipped"].append(name)
            continue
        todo.append(ck)
        for fname, entry in {**ck["files"], "MANIFEST": {"bytes": ck["manifest_bytes"]}}.items():
            sizes[f"checkpoints/{name}/{_safe(fname, FILE_NAME, 'file')}"] = entry["bytes"]
    for fname, size in m["files"].items():
        sizes[_safe(fname, FILE_NAME, "file")] = size
    use_rsync = _use_rsync(m)
    report["method"] = "rsync" if use_rsync else ("copy" if session.host.local else "sftp")
    t0 = time.perf_counter()
    _transfer(session, m["run_dir"], sizes, staging, use_rsync, whole=set(m["files"]))
    for ck in todo:
        partial = staging / "checkpoints" / ck["name"]
        _verify(partial, ck["files"], ck["name"])
        final = root / "checkpoints" / ck["name"]
        if final.exists():
            shutil.rmtree(final)
        os.rename(partial, final)
        report["fetched"].append(ck["name"])
        report["bytes"] += sum(e["bytes"] for e in ck["files"].values())
    latest = m["latest"] if (root / "checkpoints" / str(m["latest"])).is_dir() else None
    if latest:
        tmp = root / "checkpoints" / ".latest.tmp"
        tmp.write_text(latest + "\n")
        os.replace(tmp, root / "checkpoints" / "latest")
    for fname in m["files"]:
        os.replace(staging / fname, root / fname)
    shutil.rmtree(staging, ignore_errors=True)
    report["seconds"] = time.perf_counter() - t0
    return report


def _use_rsync(manifest: dict) -> bool:
    """rsync when both ends have it; ENLACE_FETCH_NO_RSYNC=1 forces the SFTP fallback (tests, odd hosts)."""
    return bool(shutil.which("rsync")) and manifest.get("rsync", False) and not os.environ.get("ENLACE_FETCH_NO_RSYNC")


def fetch_run_files(session: Session, run_name: str, dest: Path, names: tuple[str, ...]) -> list[str]:
    """Only some run files (e.g. metrics.jsonl and run.json for `plot`): the local copies seed the
    transfer, so rsync sends what was appended since. Returns the names fetched."""
    m = session.enlace_json("latest", "manifest", run_name)
    root = dest.resolve()
    _claim(root, session.host.name, m["run_dir"], run_name)
    sizes = {_safe(n, FILE_NAME, "file"): m["files"][n] for n in names if n in m["files"]}
    staging = root / STAGING
    staging.mkdir(parents=True, exist_ok=True)
    for name in sizes:
        if (root / name).is_file():
            shutil.copy2(root / name, staging / name)
    _transfer(session, m["run_dir"], sizes, staging, _use_rsync(m), whole=set(sizes))
    for name in sizes:
        os.replace(staging / name, root / name)
    return list(sizes)


ORIGIN = ".enlace-origin.json"


def _claim(root: Path, host: str, run_dir: str, run_name: str) -> None:
    """A fetched run remembers where it came from; the same name from another host or directory is
    refused (mixing two runs' checkpoints, logs and `latest` in one directory loses both)."""
    origin = {"host": host, "run_dir": run_dir}
    path = root / ORIGIN
    if path.is_file():
        have = json.loads(path.read_text())
        if have != origin:
            raise UsageError(
                f"{root} holds {run_name} fetched from {have['host']} ({have['run_dir']}); fetching "
                f"{run_name} from {host} ({run_dir}) would mix two runs — fetch it elsewhere: "
                f"--dest {root.parent / (run_name + '@' + host)}"
            )
        return
    if (root / "checkpoints").is_dir() and any((root / "checkpoints").iterdir()):
        raise UsageError(
            f"{root} already holds checkpoints of unknown origin (a local run?); fetching {run_name} from "
            f"{host} would mix them — fetch it elsewhere: --dest {root.parent / (run_name + '@' + host)}"
        )
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(origin) + "\n")


def _verify(partial: Path, files: dict, name: str) -> None:
    """sha256 of every file against MANIFEST (in threads: hashlib releases the GIL)."""
    names = list(files)
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda f: sha256_file(partial / f) if (partial / f).is_file() else None, names))
    for fname, digest in zip(names, got):
        if digest != files[fname]["sha256"]:
            (partial / fname).unlink(missing_ok=True)  # a bad copy is never kept: the rerun fetches it again
            raise CorruptCheckpoint(
                f"{name}/{fname}: sha256 does not match the server's MANIFEST — not installed. "
                "If this repeats, the file is corrupt on the server; fetch an older checkpoint "
                "with --all"
            )


def _transfer(
    session: Session, remote_dir: str, sizes: dict[str, int], into: Path, use_rsync: bool, whole: set[str]
) -> None:
    """Copy run_dir-relative paths `sizes` into `into`, keeping partial checkpoint files for a rerun;
    the run files in `whole` (the server rewrites them) are never resumed by appending."""
    into.mkdir(parents=True, exist_ok=True)
    if use_rsync:
        return _rsync(session, remote_dir, list(sizes), into)
    for rel in sizes:
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
    if session.host.local:
        for rel in sizes:
            shutil.copyfile(Path(remote_dir) / rel, into / rel)
        return None
    return _sftp(session, remote_dir, sizes, into, whole)


def _rsync(session: Session, remote_dir: str, paths: list[str], into: Path) -> None:
    t = session.transport
    argv = ["rsync", "-t", "--relative", "--partial", "--inplace", "--files-from=-"]
    if sys.stderr.isatty():  # a progress line for people; none in logs and pipes
        argv.append("--info=progress2")
    if t.ssh_argv():
        argv += ["-e", shlex.join(t.ssh_argv())]
    argv += [t.remote_path(remote_dir.rstrip("/") + "/"), str(into) + "/"]
    # progress (carriage returns) to stderr: stdout stays clean when piped; rsync dies with us
    p = subprocess.run(
        argv,
        input="\n".join(paths) + "\n",
        text=True,
        stdout=sys.stderr,
        stderr=subprocess.PIPE,
        preexec_fn=die_with_us,
    )
    errors = [line for line in p.stderr.splitlines() if line.startswith("rsync: ")]
    gone = errors and all("No such file or directory" in line for line in errors)
    if p.returncode == 24 or (p.returncode == 23 and gone):  # vanished during, or before, the transfer
        raise Vanished(f"{len(errors) or 'some'} file(s) vanished on the server")
    if p.returncode != 0:
        raise RemoteError(f"rsync from {session.host.name} failed ({p.returncode}): {p.stderr.strip()[-500:]}")


def _sftp(session: Session, remote_dir: str, sizes: dict[str, int], into: Path, whole: set[str]) -> None:
    """SFTP fallback with a progress bar; resumes a short checkpoint file (immutable on the server, and
    verified against MANIFEST afterwards) by appending from its size; run files are fetched whole."""
    sftp = session.transport.sftp()
    threading.excepthook = _quiet_prefetch_threads
    # Ctrl-C sets a flag that the copy loop checks between chunks: a KeyboardInterrupt raised inside
    # paramiko's reads leaves its threads and locks half way (a hang, or chained tracebacks).
    # A second Ctrl-C exits at once.
    interrupted = threading.Event()

    def on_sigint(signum, frame):
        if interrupted.is_set():
            os._exit(130)
        interrupted.set()

    old = signal.signal(signal.SIGINT, on_sigint)
    try:
        _sftp_files(sftp, remote_dir, sizes, into, whole, interrupted)
    finally:
        signal.signal(signal.SIGINT, old)


class Interrupted(RemoteError):
    exit_code = 130


def _quiet_prefetch_threads(args) -> None:
    """paramiko's prefetch threads fail when the connection goes (Ctrl-C, a drop); the transfer itself
    reports that in the main thread, so their tracebacks are noise. Other threads: as usual."""
    if "prefetch" not in getattr(args.thread, "name", ""):
        threading.__excepthook__(args)


def _sftp_files(
    sftp, remote_dir: str, sizes: dict[str, int], into: Path, whole: set[str], interrupted: threading.Event
) -> None:
    with click.progressbar(
        length=sum(sizes.values()),
        label="fetch (sftp)",
        show_eta=True,
        show_percent=True,
        file=click.get_text_stream("stderr"),
    ) as bar:
        for rel in sizes:
            local = into / rel
            if rel in whole:
                local.unlink(missing_ok=True)
            have = local.stat().st_size if local.exists() else 0
            bar.update(have)
            with sftp.open(f"{remote_dir}/{rel}", "rb") as rf, open(local, "ab") as lf:
                rf.seek(have)
                rf.prefetch(sizes[rel])  # pipelined requests from the current offset
                while chunk := rf.read(32768):  # paramiko's own chunk size: larger reads are slower
                    lf.write(chunk)
                    bar.update(len(chunk))
                    if interrupted.is_set():
                        raise Interrupted(f"fetch interrupted: what arrived stays in {into}; rerun fetch to resume")
