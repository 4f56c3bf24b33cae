"""`fetch [RUN]`: pull complete checkpoints back, verified, incrementally, resumably.

    local runs/<run>/checkpoints/.partial-step-000200/   kept across interruptions (rsync --partial,
                                                          or SFTP appending to a short file)
    local runs/<run>/checkpoints/step-000200/            appears only once every file matched the
                                                          sha256 in the server's MANIFEST
Only checkpoints with a MANIFEST are listed by the server. Every remote name is checked before it
becomes a local path: nothing can land outside the destination.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import click

from orchestrator.errors import RemoteError, UsageError
from orchestrator.session import Session

CKPT_NAME = re.compile(r"step-\d{6,}")
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class CorruptCheckpoint(RemoteError):
    pass


def _safe(name: str, pattern: re.Pattern, what: str) -> str:
    if not pattern.fullmatch(name) or ".." in name:
        raise RemoteError(f"refusing {what} name {name!r} from the server: it could escape the destination")
    return name


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def fetch(session: Session, run_name: str, dest: Path, all_checkpoints: bool) -> dict:
    m = session.enlace_json("latest", "manifest", run_name)
    ckpts = m["checkpoints"]
    if not ckpts:
        raise UsageError(f"{run_name} on {session.host.name} has no complete checkpoint yet (none with a MANIFEST) "
                         "— wait for the first checkpoint.every steps, or stop the run to make it save")  # fmt: skip
    wanted = ckpts if all_checkpoints else [c for c in ckpts if c["name"] == m["latest"]] or ckpts[-1:]
    root = dest.resolve()
    (root / "checkpoints").mkdir(parents=True, exist_ok=True)
    use_rsync = bool(shutil.which("rsync")) and session.setup().get("rsync", False)
    report = {"run_name": run_name, "dest": str(root), "fetched": [], "skipped": [], "bytes": 0,
              "method": "rsync" if use_rsync else ("copy" if session.host.local else "sftp")}  # fmt: skip
    t0 = time.perf_counter()
    for ck in wanted:
        name = _safe(ck["name"], CKPT_NAME, "checkpoint")
        for fname in ck["files"]:
            _safe(fname, FILE_NAME, "file")
        final = root / "checkpoints" / name
        manifest_text = json.dumps(ck["files"], sort_keys=True)
        if (final / "MANIFEST").is_file() and json.dumps(json.loads((final / "MANIFEST").read_text())["files"],
                                                         sort_keys=True) == manifest_text:  # fmt: skip
            report["skipped"].append(name)
            continue
        partial = root / "checkpoints" / f".partial-{name}"
        partial.mkdir(exist_ok=True)
        remote_dir = f"{m['run_dir']}/checkpoints/{name}"
        files = {**{f: e["bytes"] for f, e in ck["files"].items()}, "MANIFEST": ck["manifest_bytes"]}
        _transfer(session, remote_dir, list(files), partial, sum(files.values()), use_rsync)
        _verify(partial, ck["files"], name)
        if final.exists():
            shutil.rmtree(final)
        os.rename(partial, final)
        report["fetched"].append(name)
        report["bytes"] += sum(files.values())
    latest = m["latest"] or wanted[-1]["name"]
    if (root / "checkpoints" / latest).is_dir():
        tmp = root / "checkpoints" / ".latest.tmp"
        tmp.write_text(latest + "\n")
        os.replace(tmp, root / "checkpoints" / "latest")
    run_files = [_safe(f, FILE_NAME, "file") for f in m["files"]]
    staging = root / ".partial-run-files"
    staging.mkdir(exist_ok=True)
    _transfer(session, m["run_dir"], run_files, staging, sum(m["files"].values()), use_rsync, quiet=True)
    for f in run_files:
        os.replace(staging / f, root / f)
    shutil.rmtree(staging, ignore_errors=True)
    report["seconds"] = time.perf_counter() - t0
    return report


def _verify(partial: Path, files: dict, name: str) -> None:
    for fname, entry in files.items():
        path = partial / fname
        if not path.is_file() or _sha256(path) != entry["sha256"]:
            path.unlink(missing_ok=True)  # a bad copy is never kept: the rerun fetches it again
            raise CorruptCheckpoint(f"{name}/{fname}: sha256 does not match the server's MANIFEST — not installed. "
                                    "If this repeats, the file is corrupt on the server; fetch an older checkpoint "
                                    "with --all")  # fmt: skip


def _transfer(session: Session, remote_dir: str, names: list[str], into: Path, total: int, use_rsync: bool,
              quiet: bool = False) -> None:  # fmt: skip
    if use_rsync:
        _rsync(session, remote_dir, names, into, quiet)
    elif session.host.local:
        for n in names:
            shutil.copyfile(Path(remote_dir) / n, into / n)
    else:
        _sftp(session, remote_dir, names, into, total, quiet)


def _rsync(session: Session, remote_dir: str, names: list[str], into: Path, quiet: bool) -> None:
    t = session.transport
    src = t.remote_path(remote_dir.rstrip("/") + "/")
    argv = ["rsync", "-t", "--partial", "--inplace", "--files-from=-", "--no-relative"]
    if t.ssh_argv():
        argv += ["-e", shlex.join(t.ssh_argv())]
    if not quiet:
        argv.append("--info=progress2")
    argv += [src, str(into) + "/"]
    p = subprocess.run(argv, input="\n".join(names) + "\n", text=True, stdout=None if not quiet else subprocess.PIPE,
                       stderr=subprocess.PIPE)  # fmt: skip
    if p.returncode != 0:
        raise RemoteError(f"rsync from {session.host.name} failed ({p.returncode}): {p.stderr.strip()[-500:]}")


def _sftp(session: Session, remote_dir: str, names: list[str], into: Path, total: int, quiet: bool) -> None:
    """SFTP fallback: resumes a short local file by appending from its current size."""
    sftp = session.transport._connection().sftp()
    done = 0
    with click.progressbar(length=total, label="fetch", show_eta=True, file=None if not quiet else open(os.devnull, "w"),
                           item_show_func=lambda _: f"{done / 2**20:.1f} MiB") as bar:  # fmt: skip
        for n in names:
            local = into / n
            have = local.stat().st_size if local.exists() else 0
            with sftp.open(f"{remote_dir}/{n}", "rb") as rf, open(local, "ab") as lf:
                rf.seek(have)
                bar.update(have)
                while chunk := rf.read(1 << 20):
                    lf.write(chunk)
                    done += len(chunk)
                    bar.update(len(chunk))
