"""A checkpoint directory's MANIFEST: its one schema, reading and writing it, and which directories under
checkpoints/ are complete (the newest, the one `latest` names). Both halves use it: the trainer writes, the
server verbs list and serve, the driver's fetch reads what the server offers. Standard library only: no torch.

    {"version": 1, "step": N, "files": {NAME: {"sha256", "bytes"}},
     "data": {"files", "bytes", "sha256", "sampled"}, "teacher": SHA256, "world": N}

`data` and `teacher` (the trainer's checkpoints since 2026-12-07; `teacher` a distilled run's): the identity
of the data it was trained on and of its teacher checkpoint, as its trainer.pt holds them; `world` (since
2026-12-08): how many processes saved it. verify compares them with what a launch would resume it with, before
it starts anything (RECORDED: the keys).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from enlace.errors import CheckpointError
from enlace.hashing import file_sha256, open_pieces

MANIFEST = "MANIFEST"
SET_ASIDE = "checkpoints-set-aside"  # in the run dir, beside checkpoints/: what an explicit --resume moved away
STEP_RE = re.compile(r"step-(\d{6,})")
FORMAT_VERSION = 1


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, write) -> None:
    """`write(fh)` into a new file at `path` (in WRITE_PIECE writes: a checkpoint's tensors), then fsync."""
    with open_pieces(path) as fh:
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


def identity(ckpt: Path) -> str:
    """A checkpoint's identity: the sha256 of its MANIFEST (which holds the sha256 of every file). Two lines of a
    run each have a step-N: their identities tell them apart (a teacher's, an export's source)."""
    return file_sha256(ckpt / MANIFEST).hexdigest()


EXPORT_NAME = re.compile(r"(hf|safetensors)-step-\d{6,}-[0-9a-f]{12}")  # what the driver's fetch of one accepts


def export_name(fmt: str, ckpt: Path) -> str:
    """The folder of checkpoint `ckpt`'s export in its run's exports/: FORMAT-step-N-ID, ID its identity's start
    (a new line's step-N after --resume none is another checkpoint, and gets its own)."""
    return f"{fmt}-{ckpt.name}-{identity(ckpt)[:12]}"


def read_manifest(ckpt: Path) -> dict[str, Any]:
    """`ckpt`'s MANIFEST, schema-checked; raises CheckpointError saying exactly what is wrong."""
    try:
        m = json.loads((ckpt / MANIFEST).read_bytes())
    except FileNotFoundError:
        gone = "no such directory" if not ckpt.exists() else "no MANIFEST"  # (a removed one read "no MANIFEST")
        raise CheckpointError(f"{ckpt}: {gone} — an incomplete checkpoint is never loaded") from None
    except NotADirectoryError:  # checkpoints/latest is a file naming the newest: it was a NotADirectoryError
        raise CheckpointError(f"{ckpt}: a file, not a checkpoint directory — name checkpoints/step-N") from None
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


TRAINER_FILES = ("model.pt", "trainer.pt")  # what enlace's trainer saves (a script's enlace.job: its own files)


def not_the_trainers(ckpt: Path) -> str | None:
    """Why a complete checkpoint is not one enlace's trainer saved (a script's own, through enlace.job), or None."""
    held = set(read_manifest(ckpt)["files"])
    missing = [name for name in TRAINER_FILES if name not in held]
    if not missing:
        return None
    return (
        f"{ckpt}: not a checkpoint of enlace's trainer (it lacks {' and '.join(missing)}; it holds "
        f"{', '.join(sorted(held)[:4]) or 'no files'}): a script of yours saves its own, which `fetch` brings back "
        "for you to load"
    )


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


def set_aside_listing(run_dir: Path) -> list[dict[str, Any]]:
    """The complete checkpoints in run_dir/SET_ASIDE/ ({folder, name, files}): what a fresh start or an explicit
    --resume moved out of the run's line (fetch-serve offers it; a fetched copy follows with `set_aside_copies`)."""
    listed = []
    for ckpt in sorted((run_dir / SET_ASIDE).glob("*/step-*")):
        with contextlib.suppress(CheckpointError):  # (an incomplete one: not a checkpoint)
            if STEP_RE.fullmatch(ckpt.name):
                listed.append({"folder": ckpt.parent.name, "name": ckpt.name, "files": read_manifest(ckpt)["files"]})
    return listed


def set_aside_copies(ckpt_root: Path, aside: list[dict[str, Any]], present: dict[str, Any]) -> list[str]:
    """Copies in `ckpt_root` of checkpoints another copy of the run set aside (`aside`, as `set_aside_listing`
    gives it): each whose MANIFEST lists the same files moves to ../SET_ASIDE/FOLDER/NAME, so that this copy's
    checkpoints/ holds the run's present line alone (`present`: {name: files} of that line; one of its checkpoints
    is never moved). Names that are not a step-N in a plain folder are left alone (they come from another
    machine). Returns FOLDER/NAME of each moved."""
    moved = []
    for entry in aside:
        name, folder = str(entry.get("name")), str(entry.get("folder"))
        if not STEP_RE.fullmatch(name) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", folder):
            continue
        if present.get(name) == entry.get("files"):
            continue
        here, there = ckpt_root / name, ckpt_root.parent / SET_ASIDE / folder / name
        try:
            if here.is_symlink() or read_manifest(here)["files"] != entry.get("files"):
                continue
        except CheckpointError:  # none here, or incomplete
            continue
        if not there.exists():
            there.parent.mkdir(parents=True, exist_ok=True)
            os.rename(here, there)
            moved.append(f"{folder}/{name}")
    return moved


RECORDED = ("data", "teacher", "world")  # what a trainer's checkpoint was made from, readable without torch


def world_refused(saved: int, now: int) -> str:
    """The trainer's refusal of a checkpoint saved by `saved` processes, resumed by `now` (verify says it first)."""
    return (
        f"saved by {saved} processes, resuming with {now} — resume on {saved}: launch it with --gpus {saved} "
        "(across hosts or Slurm nodes: processes per host × hosts), or start afresh with --resume none"
    )


def write_manifest(directory: Path, step: int, names: list[str], record: dict[str, Any] | None = None) -> None:
    """MANIFEST (each file's sha256 and size) into `directory`, fsynced: what makes a checkpoint, or an export
    kept in a run directory, complete and verifiable by whoever copies it. `record`: what the trainer's
    checkpoint was made from (RECORDED's keys, as trainer.pt holds them; verify's resume check reads them)."""
    entries = {
        name: {"sha256": file_sha256(directory / name).hexdigest(), "bytes": (directory / name).stat().st_size}
        for name in names
    }
    manifest = {"version": FORMAT_VERSION, "step": step, "files": entries}
    manifest.update({k: v for k, v in (record or {}).items() if k in RECORDED})  # teacher None: none, said
    write_file(directory / MANIFEST, lambda fh: fh.write(json.dumps(manifest, indent=1).encode() + b"\n"))
    fsync_dir(directory)


def name_latest(ckpt_root: Path, ckpt: Path) -> None:
    """`latest` names `ckpt`, in one rename."""
    latest_tmp = ckpt_root / f".latest.tmp-{os.getpid()}"
    write_file(latest_tmp, lambda fh: fh.write(ckpt.name.encode() + b"\n"))
    os.replace(latest_tmp, ckpt_root / "latest")
    fsync_dir(ckpt_root)


def publish(
    ckpt_root: Path, tmp: Path, step: int, keep: int, names: list[str] | None = None, record: dict | None = None
) -> Path:
    """Make `tmp` (its files written) checkpoint `step` under ckpt_root: its MANIFEST written, renamed in whole,
    `latest` naming it, the complete ones beyond `keep` pruned. Only now does it count (the trainer's saves
    and enlace.job's both end here). `names`: its files (default: every file in tmp); `record`: write_manifest's."""
    names = names if names is not None else sorted(p.name for p in tmp.iterdir() if p.name != MANIFEST)
    write_manifest(tmp, step, names, record)
    final = ckpt_root / step_dir_name(step)
    if final.exists():  # saving the same step again (e.g. --until N, then a stop at N)
        old = ckpt_root / f".old-{final.name}-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    name_latest(ckpt_root, final)
    done = [p for p in complete_checkpoints(ckpt_root) if p != final]
    for older in done[: max(0, len(done) - (keep - 1))]:
        shutil.rmtree(older, ignore_errors=True)
    return final
