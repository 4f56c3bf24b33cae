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

import hashlib
import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

from enlace.errors import CheckpointError

MANIFEST = "MANIFEST"
STEP_RE = re.compile(r"step-(\d{6,})")
FORMAT_VERSION = 1


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def sha256_file(path: Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


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


def read_manifest(ckpt: Path) -> dict[str, Any] | None:
    try:
        return json.loads((ckpt / MANIFEST).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def complete_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoint dirs (MANIFEST present), oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.iterdir() if STEP_RE.fullmatch(p.name) and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: int(STEP_RE.fullmatch(p.name).group(1)))


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The checkpoint `latest` names if complete, else the newest complete one, else None."""
    try:
        named = ckpt_root / (ckpt_root / "latest").read_text().strip()
        if STEP_RE.fullmatch(named.name) and (named / MANIFEST).is_file():
            return named
    except FileNotFoundError:
        pass
    done = complete_checkpoints(ckpt_root)
    return done[-1] if done else None


def remove_stale_temps(ckpt_root: Path) -> None:
    """Temp dirs left by a save that was killed; they were never visible as checkpoints."""
    if ckpt_root.is_dir():
        for p in ckpt_root.iterdir():
            if p.name.startswith((".tmp-", ".old-")):
                shutil.rmtree(p, ignore_errors=True)


def save_checkpoint(ckpt_root: Path, step: int, files: dict[str, Any], keep: int) -> Path:
    """Write `files` (name → object for torch.save) as checkpoint `step`; returns its directory."""
    import torch  # here, not at the top: the server's status/fetch verbs must not pay for torch

    final = ckpt_root / step_dir_name(step)
    tmp = ckpt_root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    entries = {}
    for name, obj in files.items():
        _write_file(tmp / name, lambda fh, obj=obj: torch.save(obj, fh))
        entries[name] = {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size}
    manifest = {"version": FORMAT_VERSION, "step": step, "files": entries}
    _write_file(tmp / MANIFEST, lambda fh: fh.write(json.dumps(manifest, indent=1).encode() + b"\n"))
    _fsync_dir(tmp)
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


def _prune(ckpt_root: Path, keep: int, newest: Path) -> None:
    done = [p for p in complete_checkpoints(ckpt_root) if p != newest]
    for old in done[: max(0, len(done) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def verify_checkpoint(ckpt: Path) -> dict[str, Any]:
    """Check every file against MANIFEST; returns the manifest or raises CheckpointError."""
    manifest = read_manifest(ckpt)
    if manifest is None:
        raise CheckpointError(f"{ckpt}: no MANIFEST — an incomplete checkpoint is never loaded")
    for name, entry in manifest["files"].items():
        path = ckpt / name
        if not path.is_file():
            raise CheckpointError(f"{ckpt}: {name} is listed in MANIFEST but missing")
        if sha256_file(path) != entry["sha256"]:
            raise CheckpointError(f"{ckpt}: {name} does not match its sha256 in MANIFEST (corrupt copy?)")
    return manifest


def load_checkpoint(ckpt: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """name → object for every file of a verified checkpoint, loaded with weights_only=True."""
    import torch

    manifest = verify_checkpoint(ckpt)
    if manifest.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{ckpt}: checkpoint format v{manifest.get('version')}, this enlace reads "
                              f"v{FORMAT_VERSION}")  # fmt: skip
    files = {}
    for name in manifest["files"]:
        try:
            files[name] = torch.load(ckpt / name, map_location=map_location, weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
            first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"{ckpt / name}: cannot be loaded with weights_only=True ({first[:200]})") from None
    return files


def resolve_resume(ckpt_root: Path, resume: str) -> Path | None:
    """--resume latest|none|PATH → the checkpoint dir to load (or None for a fresh start)."""
    if resume == "none":
        return None
    if resume == "latest":
        return latest_checkpoint(ckpt_root)
    path = Path(resume)
    if not (path / MANIFEST).is_file():
        have = ", ".join(p.name for p in complete_checkpoints(ckpt_root)) or "none"
        raise CheckpointError(f"--resume {resume}: not a complete checkpoint (no MANIFEST) — "
                              f"complete checkpoints of this run: {have}")  # fmt: skip
    return path


def first_difference(saved: dict[str, Any], current: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first config field (dotted) whose value differs between a checkpoint and this run."""
    for key in sorted(set(saved) | set(current)):
        if saved.get(key) != current.get(key):
            return key, saved.get(key), current.get(key)
    return None
