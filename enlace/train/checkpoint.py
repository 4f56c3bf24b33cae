"""Checkpoints that count only once complete.

    checkpoints/step-000200/   model.pt optimizer.pt trainer.pt MANIFEST
    checkpoints/latest         "step-000200\n"

A save writes every file into checkpoints/.tmp-step-000200-<pid>/, fsyncs them, writes MANIFEST
(sha256 and size of every file) last, fsyncs the directory, then renames it into place and
replaces `latest` atomically. A directory without MANIFEST is never loaded; a kill -9 at any
moment leaves `latest` naming a complete checkpoint. Loading uses torch.load(weights_only=True):
a fetched file never runs code.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

from enlace.errors import CheckpointError, NoSpaceError
from enlace.hashing import file_sha256

MANIFEST = "MANIFEST"
STEP_RE = re.compile(r"step-(\d{6,})")
FORMAT_VERSION = 1


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, write) -> None:
    with open(path, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())


def _schema_problem(m: Any) -> str | None:
    """What is wrong with a parsed MANIFEST, or None. The one definition of its schema."""
    if not isinstance(m, dict):
        return "is not a JSON object"
    if m.get("version") != FORMAT_VERSION:
        return f"has format version {m.get('version')!r}; this enlace reads v{FORMAT_VERSION}"
    if not isinstance(m.get("step"), int) or isinstance(m.get("step"), bool) or m["step"] < 0:
        return "has no valid `step`"
    files = m.get("files")
    if not isinstance(files, dict) or not files:
        return "lists no files"
    for name, e in files.items():
        ok = (
            isinstance(e, dict)
            and isinstance(e.get("sha256"), str)
            and len(e["sha256"]) == 64
            and isinstance(e.get("bytes"), int)
            and not str(name).startswith((".", "/"))
            and "/" not in str(name)
        )
        if not ok:
            return f"has a malformed entry for {name!r}"
    return None


def read_manifest(ckpt: Path) -> dict[str, Any]:
    """`ckpt`'s MANIFEST, schema-checked; raises CheckpointError saying exactly what is wrong."""
    try:
        m = json.loads((ckpt / MANIFEST).read_bytes())
    except FileNotFoundError:
        raise CheckpointError(f"{ckpt}: no MANIFEST — an incomplete checkpoint is never loaded") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{ckpt}: MANIFEST is not valid JSON (a corrupt copy?) — it is never loaded") from None
    problem = _schema_problem(m)
    if problem:
        raise CheckpointError(f"{ckpt}: MANIFEST {problem} — it is never loaded")
    return m


def manifest_problem(ckpt: Path) -> str | None:
    """None for a complete checkpoint, else why it is not one."""
    try:
        read_manifest(ckpt)
    except CheckpointError as e:
        return e.message
    return None


def complete_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoint dirs (a valid MANIFEST), oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.iterdir() if STEP_RE.fullmatch(p.name) and manifest_problem(p) is None]
    return sorted(found, key=lambda p: int(STEP_RE.fullmatch(p.name).group(1)))


def incomplete_checkpoints(ckpt_root: Path) -> list[str]:
    """Why each step-* dir that is not a complete checkpoint is not one (for the log)."""
    if not ckpt_root.is_dir():
        return []
    named = sorted(p for p in ckpt_root.iterdir() if STEP_RE.fullmatch(p.name))
    return [problem for p in named if (problem := manifest_problem(p))]


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The checkpoint `latest` names if complete, else the newest complete one, else None."""
    try:
        named = ckpt_root / (ckpt_root / "latest").read_text().strip()
        if STEP_RE.fullmatch(named.name) and manifest_problem(named) is None:
            return named
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    done = complete_checkpoints(ckpt_root)
    return done[-1] if done else None


def skipped_latest(ckpt_root: Path, fallback: Path | None) -> str | None:
    """When `latest` names a checkpoint that is not complete (MANIFEST gone or empty, the directory
    emptied or removed): one line saying what resuming does instead and how many steps it costs. None
    when `latest` is complete or absent. `fallback`: what latest_checkpoint(ckpt_root) resolved (the
    caller has it: no second pass over the checkpoints)."""
    try:
        name = (ckpt_root / "latest").read_text().strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    m = STEP_RE.fullmatch(name)
    if not m or (fallback is not None and fallback.name == name):  # latest is complete: nothing skipped
        return None
    named = ckpt_root / name
    problem = manifest_problem(named) if named.is_dir() else f"{named}: missing — "
    if problem is None:
        return None
    reason = problem.removeprefix(f"{named}: ").split(" — ")[0].strip()
    start = int(STEP_RE.fullmatch(fallback.name).group(1)) if fallback else 0
    where = f"resuming from {fallback.name}" if fallback else "no complete checkpoint is left: starting from step 0"
    return f"{name} is incomplete ({reason}): {where}; {int(m.group(1)) - start} steps will be trained again"


def remove_stale_temps(ckpt_root: Path) -> None:
    """Temp dirs left by a save that was killed; they were never visible as checkpoints."""
    if ckpt_root.is_dir():
        for p in ckpt_root.iterdir():
            if p.name.startswith((".tmp-", ".old-")):
                shutil.rmtree(p, ignore_errors=True)


def checkpoint_bytes(ckpt_root: Path, n_params: int) -> int:
    """The size of one checkpoint: the newest complete one's, else fp32 weights + two AdamW moments."""
    done = complete_checkpoints(ckpt_root)
    if done:
        return sum(e["bytes"] for e in read_manifest(done[-1])["files"].values())
    return n_params * 4 * 3 + (1 << 16)


def check_free_space(ckpt_root: Path, need_each: int, count: int = 2) -> None:
    """Refuse to start when the disk cannot hold `count` more checkpoints (a save needs a temp copy)."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(ckpt_root).free
    if free < need_each * count:
        raise NoSpaceError(
            f"{ckpt_root.resolve()}: {free / 2**20:.1f} MiB free, but {count} checkpoints need "
            f"≈{need_each * count / 2**20:.1f} MiB (≈{need_each / 2**20:.1f} MiB each) — free disk "
            "space on the server (old runs, trees, venvs) or lower checkpoint.keep"
        )


def save_checkpoint(ckpt_root: Path, step: int, files: dict[str, Any], keep: int) -> Path:
    """Write `files` (name → object for torch.save) as checkpoint `step`; returns its directory.
    A full disk removes the partial copy and raises NoSpaceError naming the step and the sizes."""
    final = ckpt_root / step_dir_name(step)
    tmp = ckpt_root / f".tmp-{final.name}-{os.getpid()}"
    try:
        return _save(ckpt_root, step, final, tmp, files, keep)
    except (OSError, RuntimeError) as e:
        # torch.save reports a full disk as RuntimeError ("unexpected pos ..."): judge by the free space left
        full = getattr(e, "errno", None) == errno.ENOSPC or shutil.disk_usage(ckpt_root).free < (1 << 20)
        if not full:
            raise
        written = sum(f.stat().st_size for f in tmp.glob("*")) if tmp.is_dir() else 0
        shutil.rmtree(tmp, ignore_errors=True)
        done = complete_checkpoints(ckpt_root)
        need = sum(x["bytes"] for x in read_manifest(done[-1])["files"].values()) if done else written
        free = shutil.disk_usage(ckpt_root).free
        raise NoSpaceError(
            f"No space left on device while saving {final.name} (needs ≈{need / 2**20:.1f} MiB, "
            f"{free / 2**20:.1f} MiB free on {ckpt_root.resolve()}) — free disk space, then relaunch: the run "
            "resumes from its last complete checkpoint"
        ) from None


def _save(ckpt_root: Path, step: int, final: Path, tmp: Path, files: dict[str, Any], keep: int) -> Path:
    import torch  # here, not at the top: the server's status/fetch verbs must not pay for torch

    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, obj in files.items():
        _write_file(tmp / name, lambda fh, obj=obj: torch.save(obj, fh))
    write_manifest(tmp, step, list(files))
    if final.exists():  # saving the same step again (e.g. --until N, then a stop at N)
        old = ckpt_root / f".old-{final.name}-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    latest_tmp = ckpt_root / f".latest.tmp-{os.getpid()}"
    _write_file(latest_tmp, lambda fh: fh.write(final.name.encode() + b"\n"))
    os.replace(latest_tmp, ckpt_root / "latest")
    _fsync_dir(ckpt_root)
    _prune(ckpt_root, keep, final)
    return final


def write_manifest(directory: Path, step: int, names: list[str]) -> None:
    """MANIFEST (each file's sha256 and size) into `directory`, fsynced: what makes a checkpoint, or an export
    kept in a run directory, complete and verifiable by whoever copies it."""
    entries = {
        name: {"sha256": file_sha256(directory / name).hexdigest(), "bytes": (directory / name).stat().st_size}
        for name in names
    }
    manifest = {"version": FORMAT_VERSION, "step": step, "files": entries}
    _write_file(directory / MANIFEST, lambda fh: fh.write(json.dumps(manifest, indent=1).encode() + b"\n"))
    _fsync_dir(directory)


def _prune(ckpt_root: Path, keep: int, newest: Path) -> None:
    done = [p for p in complete_checkpoints(ckpt_root) if p != newest]
    for old in done[: max(0, len(done) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def verify_checkpoint(ckpt: Path) -> dict[str, Any]:
    """Check every file against MANIFEST; returns the manifest or raises CheckpointError."""
    manifest = read_manifest(ckpt)
    for name, entry in manifest["files"].items():
        path = ckpt / name
        if not path.is_file():
            raise CheckpointError(f"{ckpt}: {name} is listed in MANIFEST but missing")
        if file_sha256(path).hexdigest() != entry["sha256"]:
            raise CheckpointError(f"{ckpt}: {name} does not match its sha256 in MANIFEST (corrupt copy?)")
    return manifest


def load_checkpoint(ckpt: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """name → object for every file of a verified checkpoint, loaded with weights_only=True."""
    import torch

    manifest = verify_checkpoint(ckpt)
    files = {}
    for name in manifest["files"]:
        try:
            files[name] = torch.load(ckpt / name, map_location=map_location, weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
            first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"{ckpt / name}: cannot be loaded with weights_only=True ({first[:200]})") from None
    return files


def resolve_resume(ckpt_root: Path, resume: str) -> Path | None:
    """--resume latest|none|PATH → the checkpoint dir to load (or None for a fresh start). A relative
    PATH is looked up in the run directory first (checkpoints/step-000040), then the current one."""
    if resume == "none":
        return None
    if resume == "latest":
        return latest_checkpoint(ckpt_root)
    path = Path(resume)
    if not path.is_absolute() and (ckpt_root.parent / path).is_dir():
        path = ckpt_root.parent / path
    problem = manifest_problem(path)
    if problem:
        have = ", ".join(p.name for p in complete_checkpoints(ckpt_root)) or "none"
        raise CheckpointError(
            f"--resume {resume}: not a complete checkpoint ({problem.split(': ', 1)[-1]}) — "
            f"complete checkpoints of this run: {have}"
        )
    return path


def previous_complete(ckpt_root: Path, ckpt: Path) -> Path | None:
    """The newest complete checkpoint older than `ckpt` (the way forward when `ckpt` is corrupt)."""
    older = [p for p in complete_checkpoints(ckpt_root) if p.name < ckpt.name]
    return older[-1] if older else None


def first_difference(saved: dict[str, Any], current: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first config field (dotted) whose value differs between a checkpoint and this run."""
    for key in sorted(set(saved) | set(current)):
        if saved.get(key) != current.get(key):
            return key, saved.get(key), current.get(key)
    return None
