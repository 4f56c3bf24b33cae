"""A command run's outputs in a fetch (orchestrator/transfer/fetch.py holds the conversation): which to ask for, how
one fetched before is offered as its own start, how they land from staging; and the staging area's small helpers.
Thousands of outputs of a few KiB are common: all of it works in os.path's strings."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import tempfile
import unicodedata
from stat import S_ISREG
from typing import Any

from enlace.data.paths import stat_in
from enlace.errors import AlreadyRunning, EnlaceError
from enlace.hashing import file_sha256
from orchestrator.ssh.portable import held_alone

STAGING = ".partial-fetch"
LOCK = ".fetch.lock"
TRAILING = "after its bytes"  # what a plan holds for a file whose sha256 the server sends after it

# a part empty, `.`, `..` or hidden (so a leading `/` too), a control character or a backslash anywhere
BAD_OUTPUT = re.compile(r"(?:^|/)(?:[./]|$)|[\x00-\x1f\\]")


@contextlib.contextmanager
def one_fetch(root: str):
    """One fetch into `root` at a time: a second one (another terminal) is refused in one line, where it swept
    the first one's staging away under it (a traceback). A folder made only for it is not left behind."""
    made = not os.path.isdir(root)
    os.makedirs(root, exist_ok=True)
    try:
        with open(os.path.join(root, LOCK), "a") as lock:
            if not held_alone(lock):
                raise AlreadyRunning(
                    f"another fetch into {root} is under way — let it end (or Ctrl-C it), then fetch again"
                )
            yield
    finally:
        with contextlib.suppress(OSError):
            if made and os.listdir(root) == [LOCK]:
                os.unlink(os.path.join(root, LOCK))
                os.rmdir(root)


def safe_output(rel: str) -> str:
    """An output's path from the server: relative, no part empty, `.`, `..` or hidden, no control character,
    outside checkpoints/ and staging, and on Windows no `:` (a drive, a stream): nothing can land outside the
    destination."""
    if BAD_OUTPUT.search(rel) or rel.split("/", 1)[0] == "checkpoints" or (os.name == "nt" and ":" in rel):
        raise EnlaceError(f"refusing output path {rel!r} from the server: it could escape the destination")
    return rel


def one_name_each(root: str, rels: list[str]) -> None:
    """Refuse files two of which would be one here: paths (or their folders) that differ in case or Unicode
    normalisation alone, where the destination's file system does not tell them apart (macOS and Windows by
    default): the second would silently replace the first."""
    seen: dict[str, str] = {}
    folds = functools.cache(lambda: folds_case(root))  # the disk asked once, and only when two names fold together
    for rel in rels:
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            other = seen.setdefault(unicodedata.normalize("NFD", prefix).lower(), prefix)  # (lower: ß stays ß)
            if other != prefix and folds():
                raise EnlaceError(
                    f"the server's {other!r} and {prefix!r} would be one file in {root}: its file system does not "
                    "tell upper from lower case — rename one on the server, or fetch with --dest on a "
                    "case-sensitive volume"
                )


def folds_case(root: str) -> bool:
    """Whether the file system that holds `root` (or will: its nearest folder there is) takes a name in upper
    case for the same in lower."""
    while not os.path.isdir(root) and os.path.dirname(root) != root:
        root = os.path.dirname(root)
    try:
        fd, probe = tempfile.mkstemp(prefix=".enlace-case-", dir=root)  # (mkstemp's names are lower case)
    except OSError:  # a folder we cannot write to: the fetch says so itself, as it makes the destination
        return False
    os.close(fd)
    try:
        return os.path.exists(os.path.join(root, os.path.basename(probe).upper()))
    finally:
        os.unlink(probe)


def want_outputs(root: str, offer: dict[str, Any]) -> dict[str, str]:
    """A command run's outputs to ask for, each with its sha256 or TRAILING (the server sends it after the bytes,
    and an output fetched before is staged as its start: nothing travels when it is unchanged). A server tree
    older than this driver (until its next sync) lists their sha256 in the offer: only those that differ here."""
    want, dirs, made = {}, {}, set()
    trailing = offer.get("output_digests") == "trailing"
    here, staged = f"{root}{os.sep}", f"{root}{os.sep}{STAGING}{os.sep}"  # + a checked rel: os.path.join's answer
    for rel, entry in offer.get("outputs", {}).items():
        local = here + safe_output(rel)
        if trailing:
            _link_into_staging(local, staged + rel, entry["bytes"], dirs, made)
            want[rel] = TRAILING
        elif not _output_here(local, entry, dirs):
            want[rel] = entry["sha256"]
    return want


def _link_into_staging(local: str, staged: str, size: int, dirs: dict[str, bool], made: set[str]) -> None:
    """An output fetched before, of the size offered, becomes its staging copy's start (a hard link: no byte
    copied): the server sends nothing when that is the whole file still, and the file anew when not (the driver
    never writes through the link: fetch._receive)."""
    st = regular_in(local, dirs)
    if st is None or size == 0 or st.st_size != size or os.path.islink(local) or os.path.lexists(staged):
        return
    with contextlib.suppress(OSError):  # no hard links here (some network file systems): fetched whole
        os.link(local, in_dir(staged, made))


def _output_here(local: str, entry: dict, dirs: dict[str, bool]) -> bool:
    """Fetched before and unchanged: the same size and sha256 here."""
    st = regular_in(local, dirs)
    return st is not None and st.st_size == entry["bytes"] and file_sha256(local).hexdigest() == entry["sha256"]


def install_outputs(root: str, rels: list[str]) -> None:
    """Move verified outputs from staging into place: a top directory this destination lacks goes whole (one
    rename for thousands of files: a first fetch) when staging holds exactly what was fetched into it; the rest
    file by file, but for a copy fetched before and unchanged (staged as a link to it: left as it is)."""
    staging, made = os.path.join(root, STAGING), set()
    by_top: dict[str, list[str]] = {}
    for rel in rels:
        top, sep, _ = rel.partition("/")
        by_top.setdefault(top if sep else "", []).append(rel)
    for top, group in by_top.items():
        whole = os.path.join(staging, top)
        if top and not os.path.lexists(os.path.join(root, top)) and _holds_exactly(whole, len(staging) + 1, group):
            os.rename(whole, os.path.join(root, top))
            continue
        for rel in group:
            staged, final = os.path.join(staging, rel), in_dir(os.path.join(root, rel), made)
            if not _same_file(staged, final):  # (renaming a link onto its twin is a no-op on POSIX, not on Windows)
                os.replace(staged, final)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _holds_exactly(directory: str, cut: int, rels: list[str]) -> bool:
    """Whether `directory` holds these files (relative to its parent, `cut` characters in) and nothing else: no
    leftover of an earlier fetch, not even an empty directory."""
    found: set[str] = set()
    for parent, dirs, files in os.walk(directory):
        if (not dirs and not files) or any(os.path.islink(os.path.join(parent, d)) for d in dirs):
            return False  # an empty directory, a link os.walk would not enter
        found.update(os.path.join(parent, name)[cut:].replace(os.sep, "/") for name in files)
    return found == set(rels)


def in_dir(path: str, made: set[str]) -> str:
    """path, its directory made (once per directory in `made`)."""
    parent = os.path.dirname(path)
    if parent not in made:
        os.makedirs(parent, exist_ok=True)
        made.add(parent)
    return path


def regular_in(path: str, dirs: dict[str, bool]) -> os.stat_result | None:
    """The regular file at path, or None (stat_in: a directory found missing once is not asked again)."""
    st = stat_in(path, dirs)
    return st if st is not None and S_ISREG(st.st_mode) else None
