"""`fetch [RUN]`: pull complete checkpoints back, verified, incrementally, resumably.

    local runs/<run>/.partial-fetch/       one transfer's staging area, kept across interruptions
    local runs/<run>/checkpoints/step-N/   appears only once every file matched the sha256 in the
                                           server's MANIFEST (then renamed in from staging)

The whole fetch is one conversation with `enlace fetch-serve` on the server (enlace/server/fetchserve.py has
the wire) over the host's one SSH connection: it offers the complete checkpoints and run files, we ask
for what is missing here (a short staging file resumes from its end when its bytes still match), and
each file is hashed as it arrives, so verification costs no second pass. A dropped connection is
retried from where it stopped. Every remote name is checked before it becomes a local path: nothing
can land outside the destination.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import click

from enlace import contract
from enlace.contract import NOT_STARTED, Status, not_started
from enlace.errors import EnlaceError
from enlace.hashing import file_sha256
from enlace.manifest import EXPORT_NAME, SET_ASIDE, set_aside_copies
from orchestrator.errors import UsageError
from orchestrator.ssh.session import Session
from orchestrator.transfer.outputs import (
    STAGING,
    TRAILING,
    in_dir,
    install_outputs,
    one_fetch,
    one_name_each,
    regular_in,
    want_outputs,
)
from orchestrator.transfer.wire import Progress, Reader, ServerEnded, receive, retrying

ENDED = {s.value for s in Status if s.is_terminal} - {s.value for s in NOT_STARTED}  # (dropped: not started)
CKPT_NAME = re.compile(r"step-\d{6,}")
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
STALL_S = 60.0  # no byte from the server for this long: the connection is dead, reconnect


class CorruptCheckpoint(EnlaceError):
    pass


def _safe(name: str, pattern: re.Pattern, what: str) -> str:
    if not pattern.fullmatch(name) or ".." in name:
        raise EnlaceError(f"refusing {what} name {name!r} from the server: it could escape the destination")
    return name


def _already_here(final: Path, files: dict) -> bool:
    """Fetched and verified before: the local MANIFEST lists exactly the server's files, and each is here at its
    size (a file lost or cut short since is fetched again; its bytes are checked where it is loaded)."""
    try:
        if json.loads((final / "MANIFEST").read_text())["files"] != files:
            return False
        return all((final / name).stat().st_size == entry["bytes"] for name, entry in files.items())
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return False


def fetch(session: Session, run_name: str, dest: Path, all_checkpoints: bool) -> dict[str, Any]:
    """Fetch RUN's newest (or every) complete checkpoint and its run files into `dest`, one fetch there at once."""
    root = dest.resolve()
    with one_fetch(str(root)):
        return _fetch(session, run_name, root, all_checkpoints)


def _fetch(session: Session, run_name: str, root: Path, all_checkpoints: bool) -> dict[str, Any]:

    def plan(offer: dict[str, Any]) -> dict[str, str | None]:
        if not offer["checkpoints"] and not offer.get("outputs") and offer.get("command"):
            globs = offer.get("output_globs")
            none = (
                f"its outputs ({', '.join(globs)}) match no file"
                if globs
                else "no outputs (a run file's `outputs:` names them; `enlace-remote init` writes one)"
            )
            click.echo(
                f"{run_name}: {none} and no enlace.job checkpoint: fetching its log and run files only", err=True
            )
        elif not offer["checkpoints"] and not offer.get("outputs") and offer.get("status") in NOT_STARTED:
            there = f"enlace-remote --host {session.host.name}"
            raise UsageError(not_started(run_name, offer["status"], "nothing to fetch yet", there))
        elif not offer["checkpoints"] and not offer.get("outputs") and offer.get("status") in ENDED:
            raise UsageError(  # (it was told to wait for a checkpoint, or to stop the run to make one)
                f"{run_name} on {session.host.name} ended ({offer['status']}) with no complete checkpoint: nothing "
                f"to fetch — `enlace-remote --host {session.host.name} launch {run_name}` trains it"
            )
        elif not offer["checkpoints"] and not offer.get("outputs"):
            raise UsageError(
                f"{run_name} on {session.host.name} has no complete checkpoint yet (none with a MANIFEST) "
                "— wait for the first checkpoint.every steps, or stop the run to make it save"
            )
        one_name_each(str(root), [*offer["files"], *offer.get("outputs", {})])  # before anything is written
        _claim(root, session.host.name, offer["run_dir"], run_name)
        if offer["latest"]:  # it names checkpoints/latest here, which sample and export follow
            _safe(offer["latest"], CKPT_NAME, "checkpoint")
        listed = offer["checkpoints"]
        wanted = listed if all_checkpoints else [c for c in listed if c["name"] == offer["latest"]] or listed[-1:]
        want: dict[str, str | None] = {}  # path → its sha256 (None: a run file, taken as it is now)
        for ck in wanted:
            name = _safe(ck["name"], CKPT_NAME, "checkpoint")
            if _already_here(root / "checkpoints" / name, ck["files"]):
                continue
            for fname, entry in ck["files"].items():
                want[f"checkpoints/{name}/{_safe(fname, FILE_NAME, 'file')}"] = entry["sha256"]
            want[f"checkpoints/{name}/MANIFEST"] = None
        for fname in offer["files"]:
            want[_seed(root, root / STAGING, _safe(fname, FILE_NAME, "file"))] = None
        return {**want, **want_outputs(str(root), offer)}

    t0 = time.perf_counter()
    offer, want, got = _converse(session, run_name, root / STAGING, plan, outputs=True)
    (root / "checkpoints").mkdir(parents=True, exist_ok=True)
    method = "local" if session.host.local else "ssh"
    report = {"run_name": run_name, "dest": str(root), "fetched": [], "skipped": [], "bytes": got, "method": method}
    _install_checkpoints(root, offer, want, report)
    for fname in offer["files"]:
        os.replace(root / STAGING / fname, root / fname)
    install_outputs(str(root), [rel for rel in offer.get("outputs", {}) if rel in want])
    report["outputs"] = len(offer.get("outputs", {}))
    if offer["corrupt"]:  # its intact files stay staged: a rerun fetches the bad one alone
        bad = {rel.split("/")[1] for rel in offer["corrupt"]}
        others = [ck["name"] for ck in offer["checkpoints"] if ck["name"] not in bad]
        raise CorruptCheckpoint(_corrupt_words(run_name, offer["corrupt"], report["fetched"], others, all_checkpoints))
    shutil.rmtree(root / STAGING, ignore_errors=True)
    report["seconds"] = time.perf_counter() - t0
    return report


def fetch_export(session: Session, run_name: str, export_name: str, target: Path) -> dict[str, Any]:
    """Bring the export `export_name` kept in the run's directory on the server (exports/NAME/, made by
    `enlace export --in-run`) to `target` here, every file checked against its MANIFEST's sha256; `target`
    appears only once complete."""
    name = _safe(export_name, EXPORT_NAME, "export")
    staging = target.resolve().parent / f".{target.name}{STAGING}"

    def plan(offer: dict[str, Any]) -> dict[str, str | None]:
        entry = next((e for e in offer.get("exports", []) if e["name"] == name), None)
        if entry is None:
            raise EnlaceError(f"{run_name} on {session.host.name} has no export {name} (the server made none?)")
        want: dict[str, str | None] = {
            f"exports/{name}/{_safe(f, FILE_NAME, 'file')}": e["sha256"] for f, e in entry["files"].items()
        }
        want[f"exports/{name}/MANIFEST"] = None
        return want

    t0 = time.perf_counter()
    _, _, got = _converse(session, run_name, staging, plan)
    os.rename(staging / "exports" / name, target)
    shutil.rmtree(staging, ignore_errors=True)
    return {"dest": str(target), "bytes": got, "seconds": time.perf_counter() - t0}


def _seed(root: Path, staging: Path, name: str) -> str:
    """Start a run file's staging copy from the one fetched before: when its bytes are still the start
    of the server's file (metrics.jsonl and train.log only grow), only the rest travels."""
    if (root / name).is_file() and not (staging / name).exists():
        staging.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, staging / name)
    return name


def fetch_run_files(
    session: Session, run_name: str, dest: Path, names: tuple[str, ...], shared: bool = False
) -> list[str]:
    """Only some run files (e.g. metrics.jsonl and run.json for `plot`). A local copy whose bytes are
    still the start of the server's file is only extended (_seed). Returns the names fetched. `shared`: over
    the host's one connection (Transport.duplex)."""
    root = dest.resolve()
    staging = root / f"{STAGING}-{os.getpid()}-{threading.get_ident()}"  # its own: a fetch (or plot) may be under way
    _drop_dead_stagings(root)

    def plan(offer: dict[str, Any]) -> dict[str, str | None]:
        _claim(root, session.host.name, offer["run_dir"], run_name)
        return {_seed(root, staging, _safe(n, FILE_NAME, "file")): None for n in names if n in offer["files"]}

    try:
        offer, _, _ = _converse(session, run_name, staging, plan, shared)
        fetched = [n for n in names if n in offer["files"]]
        for name in fetched:
            os.replace(staging / name, root / name)
    finally:  # its run files come whole again next time: nothing of it is kept
        shutil.rmtree(staging, ignore_errors=True)
    return fetched


def _drop_dead_stagings(root: Path) -> None:
    """The staging folders of run-file fetches whose process is gone (a plot killed by SIGKILL kept its own)."""
    for old in root.glob(f"{STAGING}-*-*"):
        pid = old.name.split("-")[-2]
        try:
            os.kill(int(pid), 0) if pid.isdigit() else None
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except OSError:  # (alive, another account's)
            pass


def _converse(
    session: Session, run_name: str, staging: Path, plan, shared: bool = False, outputs: bool = False
) -> tuple[dict[str, Any], dict, int]:
    """One fetch-serve conversation (again after a dropped connection, resuming): the offer, what was
    fetched and how many bytes arrived. `plan(offer)` says which paths to fetch ({path: sha256 or None});
    each lands in staging/path, verified when it has a sha256."""
    kept = f"what arrived stays in {staging}"
    once = lambda tick: _converse_once(session, run_name, staging, plan, tick, shared, outputs)
    return retrying("fetch", kept, once)


def _converse_once(
    session: Session, run_name: str, staging: Path, plan, tick, shared: bool, outputs: bool
) -> tuple[dict[str, Any], dict, int]:
    argv = session.enlace_argv("latest", "fetch-serve", run_name, "--json", *(["--outputs"] if outputs else []))
    with session.transport.duplex(argv, STALL_S, tick, shared=shared) as wire:
        reader = Reader(wire)
        line = reader.readline()
        offer = _answer(session, wire, line)
        want = plan(offer)
        request, hashers, made, dirs, at = [], {}, set(), {}, f"{staging}{os.sep}"
        for rel in want:  # strings, each directory looked at and made once: 20,000 outputs are common (rel: checked,
            local = at + rel  # relative: os.path.join's answer, without its 5 calls per file)
            st = regular_in(local, dirs)
            have = st.st_size if st is not None else 0
            in_dir(local, made)
            hashers[rel] = file_sha256(local) if have else hashlib.sha256()
            request.append([rel, have, hashers[rel].hexdigest()])
        wire.write(json.dumps({"send": request}).encode() + b"\n")
        got = 0
        with Progress("fetch", sum(_size(offer, rel) for rel in want)) as bar:
            for rel, offset, _ in request:
                try:
                    hashers[rel], n = receive(reader, at + rel, offset, hashers[rel], bar)
                    if want[rel] == TRAILING:
                        want[rel] = reader.exactly(32).hex()
                except ServerEnded:
                    raise _server_stopped(session, wire) from None
                got += n
        code, err = wire.finish()
        if code != 0:
            raise EnlaceError(f"fetch from {session.host.name}: the server side exited {code}: {err.strip()[-500:]}")
    bad = [rel for rel, sha in want.items() if sha is not None and hashers[rel].hexdigest() != sha]
    for rel in bad:
        (staging / rel).unlink(missing_ok=True)  # a bad copy is never kept: the rerun fetches it again
    if any(not rel.startswith("checkpoints/") for rel in bad):  # an output, an export: nothing installed
        raise CorruptCheckpoint(f"{bad[0]}: sha256 does not match the server's — not installed; fetch it again")
    # a bad checkpoint is left out, the others installed (with --all: the older ones), then it is said
    corrupt = {rel.split("/")[1] for rel in bad}
    want = {rel: sha for rel, sha in want.items() if not any(rel.startswith(f"checkpoints/{c}/") for c in corrupt)}
    return {**offer, "corrupt": sorted(bad)}, want, got


def _install_checkpoints(root: Path, offer: dict[str, Any], want: dict, report: dict[str, Any]) -> None:
    """Each checkpoint whose every file arrived verified renamed into place (one here already: skipped), and
    `latest`: the server's, where it is here verified; else (a corrupt one left out) the newest that is. Copies
    here of checkpoints the server set aside (a launch that started afresh) go aside here too, first."""
    present = {ck["name"]: ck["files"] for ck in offer["checkpoints"]}  # (its new step-N may have an old one's name)
    report["set_aside"] = set_aside_copies(root / "checkpoints", offer.get("set_aside", []), present)
    for ck in offer["checkpoints"]:
        final = root / "checkpoints" / ck["name"]
        partial = root / STAGING / "checkpoints" / ck["name"]
        if f"checkpoints/{ck['name']}/MANIFEST" in want:  # each file arrived and matched its sha256
            if final.exists():
                shutil.rmtree(final)
            os.rename(partial, final)
            report["fetched"].append(ck["name"])
        elif _already_here(final, ck["files"]):
            report["skipped"].append(ck["name"])
    good = [ck["name"] for ck in offer["checkpoints"] if ck["name"] in report["fetched"] + report["skipped"]]
    newest = offer["latest"] if offer["latest"] in good else (good[-1] if good and offer["corrupt"] else None)
    if newest:
        tmp = root / "checkpoints" / ".latest.tmp"
        tmp.write_text(newest + "\n")
        os.replace(tmp, root / "checkpoints" / "latest")


def _corrupt_words(run_name: str, corrupt: list[str], fetched: list[str], others: list[str], every: bool) -> str:
    """A checkpoint's files (`corrupt`) whose bytes did not match the server's MANIFEST: not installed; what was,
    and what next (`others`: the server's other checkpoints; `every`: this was fetch --all)."""
    said = f"{', '.join(corrupt)} of {run_name}: sha256 does not match the server's MANIFEST — not installed"
    if fetched:
        said += f" ({', '.join(fetched)} {'was' if len(fetched) == 1 else 'were'})"
    said += ". If this repeats, it is corrupt on the server"
    if others and not every:
        said += f": this fetch with --all brings the older ones ({', '.join(others)})"
    return said


def _server_stopped(session: Session, wire) -> EnlaceError:
    """The server side ended in mid-stream: its own words (an output deleted while it was fetched), rerun to resume."""
    code, err = wire.finish()
    said = err.strip().splitlines()[-1] if err.strip() else "no word from it"
    return EnlaceError(
        f"fetch from {session.host.name}: the server side stopped in mid-transfer (exit {code}): {said} — "
        f"fetch again to go on from there"
    )


def _answer(session: Session, wire, line: bytes) -> dict[str, Any]:
    """The offer, or the server's refusal raised as the error it names."""
    try:
        doc = json.loads(line)
        if doc.get("ok") is not False:
            return doc
    except json.JSONDecodeError:
        pass
    code, err = wire.finish()
    return session.answer("enlace fetch-serve", line.decode(errors="replace"), err, code, (0,))


def _size(offer: dict[str, Any], rel: str) -> int:
    if rel in offer["files"]:
        return offer["files"][rel]
    if rel in offer.get("outputs", {}):
        return offer["outputs"][rel]["bytes"]
    kind, name, fname = rel.split("/")  # checkpoints/NAME/FILE or exports/NAME/FILE
    entry = next(c for c in offer[kind] if c["name"] == name)
    return entry["manifest_bytes"] if fname == "MANIFEST" else entry["files"][fname]["bytes"]


ORIGIN = contract.FETCH_ORIGIN


def _claim(root: Path, host: str, run_dir: str, run_name: str) -> None:
    """A fetched run remembers where it came from; the same name from another host or directory is
    refused (mixing two runs' checkpoints, logs and `latest` in one directory loses both)."""
    origin = {"host": host, "run_dir": run_dir}
    path = root / ORIGIN
    if path.is_file():
        have = json.loads(path.read_text())
        if have != origin:
            held = Path(have["run_dir"]).name  # the run it holds (a path the server gave: its last part alone)
            raise UsageError(
                f"{root} holds {held} fetched from {have['host']} ({have['run_dir']}); fetching "
                f"{run_name} from {host} ({run_dir}) would mix two runs — fetch (or plot) it elsewhere: "
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


def summary(run_name: str, rep: dict) -> str:
    """fetch's one line: what came, what was here, the bytes and their rate, where it all is."""
    mib = rep["bytes"] / 2**20
    rate = mib / rep["seconds"] if rep["seconds"] > 0 else 0
    aside = (
        f"{len(rep['set_aside'])} of an earlier line moved to {SET_ASIDE}/, as there; " if rep.get("set_aside") else ""
    )
    return (
        f"fetch {run_name}: {len(rep['fetched'])} checkpoint(s) fetched ({', '.join(rep['fetched']) or '-'}), "
        f"{len(rep['skipped'])} already here; "
        + (f"{rep['outputs']} output file(s) verified; " if rep.get("outputs") else "")
        + aside
        + f"{mib:.1f} MiB in {rep['seconds']:.2f}s ({rate:.0f} MiB/s, {rep['method']}) → {rep['dest']}"
    )
