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
import itertools
import json
import os
import pickle
import shutil
import time
from pathlib import Path
from typing import Any

from enlace import contract
from enlace.errors import CheckpointError, NoSpaceError
from enlace.hashing import file_sha256
from enlace.manifest import (
    SET_ASIDE,
    STEP_RE,
    complete_checkpoints,
    latest_checkpoint,
    manifest_problem,
    name_latest,
    publish,
    read_manifest,
    step_dir_name,
    write_file,
)
from enlace.state.runs import atomic_write


def remove_stale_temps(ckpt_root: Path) -> None:
    """Temp dirs left by a save that was killed, and a `latest` it never put in place: they were never visible
    as checkpoints."""
    if ckpt_root.is_dir():
        for p in ckpt_root.iterdir():
            if p.name.startswith((".tmp-", ".old-")):
                shutil.rmtree(p, ignore_errors=True)
            elif p.name.startswith(".latest.tmp-"):
                p.unlink(missing_ok=True)


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
            "space on the server (old runs, a run's checkpoints-set-aside/, trees, venvs) or lower checkpoint.keep"
        )


def save_checkpoint(ckpt_root: Path, step: int, files: dict[str, Any], keep: int, record: dict | None = None) -> Path:
    """Write `files` (name → object for torch.save) as checkpoint `step`; returns its directory. `record`: what it
    was made from, also in its MANIFEST (manifest.RECORDED). A full disk removes the partial copy and raises
    NoSpaceError naming the step and the sizes."""
    final = ckpt_root / step_dir_name(step)
    tmp = ckpt_root / f".tmp-{final.name}-{os.getpid()}"
    try:
        return _save(ckpt_root, step, tmp, files, keep, record)
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


def _save(ckpt_root: Path, step: int, tmp: Path, files: dict[str, Any], keep: int, record: dict | None) -> Path:
    import torch  # here, not at the top: the server's status/fetch verbs must not pay for torch

    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, obj in files.items():
        write_file(tmp / name, lambda fh, obj=obj: torch.save(obj, fh))
    return publish(ckpt_root, tmp, step, keep, list(files), record)


def verify_checkpoint(ckpt: Path) -> dict[str, Any]:
    """Check every file against MANIFEST; returns the manifest or raises CheckpointError."""
    manifest = read_manifest(ckpt)
    for name, entry in manifest["files"].items():
        path = ckpt / name
        if not path.is_file():
            raise CheckpointError(f"{ckpt}: {name} is listed in MANIFEST but missing")
        if file_sha256(path).hexdigest() != entry["sha256"]:
            again = _fetch_again(ckpt)
            raise CheckpointError(  # (the run's own copy, on its server: deleting it would lose it)
                f"{ckpt}: {name} does not match its sha256 in MANIFEST (a corrupt copy){again}"
            )
    return manifest


def _fetch_again(ckpt: Path) -> str:
    """How a corrupt checkpoint `fetch` brought here comes again (the host and run its origin file names, into
    this folder); "" for a run's own copy on its server, which deleting would lose."""
    run_dir = ckpt.resolve().parent.parent
    try:
        origin = json.loads((run_dir / contract.FETCH_ORIGIN).read_text())
        host, run = origin["host"], Path(origin["run_dir"]).name
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return f" — delete {ckpt} and `enlace-remote --host {host} fetch {run} --dest {run_dir}` brings it again, verified"


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
    PATH is looked up in the run directory first (checkpoints/step-000040), then in checkpoints/ (step-000040),
    then the current one."""
    if resume == "none":
        return None
    if resume == "latest":
        return latest_checkpoint(ckpt_root)
    path = Path(resume)
    for base in (ckpt_root.parent, ckpt_root):  # checkpoints/step-000040, or step-000040 as lists name it
        if not path.is_absolute() and (base / path).is_dir():
            path = base / path
            break
    problem = "no such directory" if not path.is_dir() else manifest_problem(path)
    if problem:
        # as --resume takes them (a bare step-000020 from the list was refused the same way)
        have = ", ".join(f"checkpoints/{p.name}" for p in complete_checkpoints(ckpt_root)) or "none"
        raise CheckpointError(
            f"--resume {resume}: not a complete checkpoint ({problem.split(': ', 1)[-1]}) — "
            f"complete checkpoints of this run: {have}"
        )
    return path


def resume_problem_at(ckpt_root: Path, resume: str) -> str | None:
    """Why `train --resume RESUME` would refuse its checkpoint (not a complete one, no such path), or None:
    verify asks before a launch starts a trainer (a typo of the path failed the run)."""
    try:
        resolve_resume(ckpt_root, resume)
    except CheckpointError as e:
        return e.message.removeprefix(f"--resume {resume}: ")  # verify's check names the --resume already
    return None


def start_line(ckpt_root: Path, start: Path | None) -> Path | None:
    """An explicit --resume (none, or a checkpoint) starts the run's history again at `start` (None: step 0),
    once that start has loaded. This run's step dirs past `start` — all of them when `start` is not one of them
    (another run's, a set-aside one, a copy named otherwise) — move to ../SET_ASIDE/<time>-<pid>/ (never
    deleted: they are hours of training); such a `start` is linked in as this run's step dir of its step;
    `latest` names it (or nothing). A restart or a requeue, which resume from `latest`, and the pruning of
    old checkpoints then see this line only. Returns where the checkpoints went, or None when there were none."""
    own = start is not None and start.resolve().parent == ckpt_root.resolve() and STEP_RE.fullmatch(start.name)
    aside = start is not None and not own and start.resolve().parent.parent == (ckpt_root.parent / SET_ASIDE).resolve()
    came_from = start.resolve().parent if aside else None  # a line of this run's, set aside
    since = int(own.group(1)) if own else -1
    ckpt_root.mkdir(parents=True, exist_ok=True)
    later = [p for p in ckpt_root.iterdir() if (m := STEP_RE.fullmatch(p.name)) and int(m.group(1)) > since]
    linked = None
    if start is not None and not own:  # linked beside first: nothing moves unless it is in place
        linked = ckpt_root / f".tmp-start-{os.getpid()}"
        shutil.rmtree(linked, ignore_errors=True)
        try:
            shutil.copytree(start, linked, copy_function=_link_or_copy)
        except OSError as e:
            shutil.rmtree(linked, ignore_errors=True)
            if e.errno != errno.ENOSPC:
                raise
            raise NoSpaceError(
                f"No space left on device while copying {start} into {ckpt_root.resolve()} (another filesystem: "
                "it cannot be linked) — free disk space, or resume from a checkpoint on this filesystem"
            ) from None
    moved = None
    if later:
        moved = _aside_folder(ckpt_root.parent)
        for path in later:
            os.rename(path, moved / path.name)
    if linked is not None:
        start = ckpt_root / step_dir_name(read_manifest(linked)["step"])
        os.rename(linked, start)
    if start is None:
        (ckpt_root / "latest").unlink(missing_ok=True)
    else:
        name_latest(ckpt_root, start)
    # a set-aside line gone back to brings its own history (its folder keeps the metrics.jsonl it had)
    history = came_from / "metrics.jsonl" if came_from is not None else ckpt_root.parent / "metrics.jsonl"
    upto = since if came_from is None else read_manifest(start)["step"]
    return _metrics_of_line(ckpt_root.parent, _records(history, upto), moved)


def _records(path: Path, upto: int) -> str:
    """The metrics records in `path` of the steps up to `upto` (-1: none)."""
    try:
        lines = path.read_text().splitlines(keepends=True)
    except FileNotFoundError:
        return ""
    return "".join(line for line in lines if -1 < _step_of(line) <= upto)


def _metrics_of_line(run_dir: Path, kept: str, moved: Path | None) -> Path | None:
    """metrics.jsonl becomes the line's own history, `kept`; the file as it was goes beside the checkpoints set
    aside (plot and the board showed the line left, its evals and its resumes). Returns that folder (made here
    when only records go). The trainer reopens its handle after."""
    path = run_dir / "metrics.jsonl"
    try:
        before = path.read_text()
    except FileNotFoundError:
        before = ""
    if before == kept:
        return moved
    if before:
        moved = moved or _aside_folder(run_dir)
        shutil.copy2(path, moved / "metrics.jsonl")
    atomic_write(path, kept)
    return moved


def _step_of(line: str) -> int:
    """A metrics record's step; -1 for a line that is none (a write cut short by a kill)."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return -1
    return step if isinstance(step, int) else -1


def _aside_folder(run_dir: Path) -> Path:
    """run_dir/SET_ASIDE/<time>-<pid> made now, or <time>-<pid>-2, -3, ...: never a folder that holds another
    line (two starts in one second, in one process, each get their own)."""
    parent, name = run_dir / SET_ASIDE, f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        folder = parent / (name if n == 1 else f"{name}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def _link_or_copy(src: str, dst: str) -> None:
    """A checkpoint's file in a second place: a hard link (no bytes copied; checkpoints are never written in
    place), or a copy across filesystems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def previous_complete(ckpt_root: Path, ckpt: Path) -> Path | None:
    """The newest complete checkpoint older than `ckpt` (the way forward when `ckpt` is corrupt)."""
    older = [p for p in complete_checkpoints(ckpt_root) if p.name < ckpt.name]
    return older[-1] if older else None


def first_difference(saved: dict[str, Any], current: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first config field (dotted) whose value differs between a checkpoint and this run. A field the
    checkpoint did not record (an older enlace's, before the field counted) is not compared."""
    for key in sorted(set(saved) | set(current)):
        if key in saved and saved.get(key) != current.get(key):
            return key, saved.get(key), current.get(key)
    return None
