"""Which files a run reads, from its data config alone: the globs of `kind: bytes` expanded, or a shard
directory's meta.json and the shards it lists. Standard library only: the trainer resolves its data
with it, and the driver resolves the same config the same way for `enlace-remote data push` and `data ls`.

Data a run reads lives under the project's data/ (on the server: <remote_dir>/data/, which every tree
links as data/); "{stdlib}" names the Python standard library of the machine that runs.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import stat
import sysconfig
from pathlib import Path

from enlace.datadir import DATA_DIR, STDLIB, data_relative, outside_words
from enlace.errors import EnlaceError

SHARD_DTYPES = {"uint8": 1, "uint16": 2}  # a shard's token type: its bytes per token


class DataError(EnlaceError):
    exit_code = 2


def resolve_paths(patterns: list[str], root: Path, key: str = "data.paths", run: str = "RUN") -> list[Path]:
    """Expand globs (relative to `root`; "{stdlib}" = Python's stdlib dir) into existing files: the trainer's
    files, in the byte stream's order. `key` and `run` name the patterns' place and their run file in the error
    a pattern that matches nothing gets (a run file of your own command lists them under `data:`)."""
    return [Path(m) for m in match_files(patterns, root, key=key, run=run)]


def match_files(
    patterns: list[str],
    root: Path,
    stats: dict[str, FileStat] | None = None,
    key: str = "data.paths",
    run: str = "RUN",
) -> list[str]:
    """resolve_paths' files as glob names them (strings: a data push lists tens of thousands). Each pattern's
    matches in pathlib's order, by parts (case-folded where the OS folds case): the stream's file order, which a
    checkpoint's data state counts bytes in; a file a pattern before matched is not listed again. `stats` keeps
    each file's file_stat (data push's listing then asks the system nothing more)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    files: list[str] = []
    seen: set[tuple] = set()
    for n, pattern in enumerate(patterns):
        expanded = pattern.replace(STDLIB, stdlib)
        if not Path(expanded).is_absolute():
            expanded = str(root / expanded)
        # by parts: the separator sorts below every character ("a/b/c" before "a/b.py", as pathlib has it)
        found = [(m, got) for m in glob.glob(expanded, recursive=True) if (got := file_stat(m))]
        if stats is not None:
            stats.update(found)
        # as glob gives them, a file twice included (`**/**` does): the stream's order has always had it so
        matches = sorted((m for m, _ in found), key=lambda m: os.path.normcase(m).replace(os.sep, "\0"))
        if not matches:
            # realpath: on the server data/ is a link to <remote_dir>/data, which is where the files go
            push = f" (from your machine: enlace-remote data push {run})" if os.environ.get("ENLACE_ROOT") else ""
            raise DataError(  # ENLACE_ROOT: on a server, where a push brings it (on your machine: it is the push)
                f"{key}: {pattern!r} matches no file (looked for {os.path.realpath(expanded)}) — "
                f"put the corpus there{push}, or fix the pattern"
            )
        if n == 0 and len(patterns) == 1:
            return matches
        keyed = [(_parts(m), m) for m in matches]
        files.extend(m for parts, m in keyed if parts not in seen)
        seen.update(parts for parts, _ in keyed)
    return files


FileStat = tuple[os.stat_result, bool]  # a file's stat (what a link points to), and whether its path is a link


def file_stat(path: str) -> FileStat | None:
    """A file as os.path.isfile has it (a link to one too): its stat and whether path is a link; None for anything
    else. One system call for a plain file."""
    try:
        st = os.lstat(path)
        link = stat.S_ISLNK(st.st_mode)
        if link:
            st = os.stat(path)
    except OSError:  # gone, or a link to nothing
        return None
    return (st, link) if stat.S_ISREG(st.st_mode) else None


def _parts(path: str) -> tuple:
    """A path's parts as pathlib compares them: no empty or "." part, ".." kept (a link's `..` is not its
    parent's), case-folded where the OS folds case; absolute or not first. Which file it is, across patterns."""
    parts = os.path.normcase(path).split(os.sep)
    return (os.path.isabs(path), *(p for p in parts if p not in ("", ".")))


def real_dir(directory: str, resolved: dict[str, str]) -> str:
    """os.path.realpath(directory), each directory resolved once (`resolved`): tens of thousands of files a push
    or a fetch lists share a few directories, and resolving each file's path again was most of their time."""
    return resolved.get(directory) or resolved.setdefault(directory, os.path.realpath(directory))


def stat_in(path: str, present: dict[str, bool]) -> os.stat_result | None:
    """os.stat(path), or None when nothing is there; a directory found missing once (`present`) is not asked again
    for each of its files: the first push or fetch of tens of thousands of files finds none of them."""
    parent = os.path.dirname(path)
    if not present.get(parent, True):
        return None
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        if parent not in present:
            present[parent] = os.path.isdir(parent)
        return None


def real_path(path: str, resolved: dict[str, str]) -> str:
    """os.path.realpath(path), its directory through real_dir, the file itself resolved only when it is a link."""
    parent, name = os.path.split(path)
    real = os.path.join(real_dir(parent, resolved), name)
    return os.path.realpath(real) if os.path.islink(real) else real


def read_meta(shard_dir: Path) -> dict:
    meta_path = shard_dir / "meta.json"
    if not meta_path.is_file():
        partial = shard_dir.with_name(shard_dir.name + ".partial")  # an interrupted generate's text
        held = f" ({partial.name}/ holds an interrupted generate: run it again to finish)" if partial.is_dir() else ""
        raise DataError(
            f"data.shard_dir: {shard_dir} has no meta.json{held} — write it with `enlace prepare DATA --out DIR` "
            "(a byte corpus) or `enlace-remote generate TEACHER --bytes N --out DIR` (a teacher's text)"
        )
    meta = json.loads(meta_path.read_text())
    if meta.get("version") != 1 or meta.get("dtype") not in SHARD_DTYPES:
        raise DataError(f"{meta_path}: unsupported shard format {meta.get('version')}/{meta.get('dtype')}")
    return meta


def require_shard_window(shard_dir: Path, split: str, lengths: list[int], need: int) -> None:
    """One of a split's shards (`lengths`: their tokens) holds a batch's `need` tokens, or a DataError."""
    if not any(n >= need for n in lengths):
        raise DataError(
            f"{shard_dir}: no {split} shard holds {need} tokens (batch_size * seq_len * world + 1); prepare "
            "larger shards (or generate more --bytes: the val split is 5 % of them), or a smaller batch"
        )


def shard_tokens(shard_dir: Path, split: str) -> list[int]:
    """Each of a split's shards' token count, from its size (meta.json's dtype): no shard is read."""
    meta = read_meta(shard_dir)
    return [(shard_dir / name).stat().st_size // SHARD_DTYPES[meta["dtype"]] for name in meta[split]]


def shard_files(shard_dir: Path) -> list[Path]:
    """meta.json and every shard it lists; DataError naming the missing ones."""
    meta = read_meta(shard_dir)
    paths = [shard_dir / "meta.json"] + [shard_dir / n for n in meta["train"] + meta["val"]]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DataError(f"shard files missing: {', '.join(missing)}")
    return paths


def split_bounds(length: int, val_fraction: float, split: str, seq_len: int, rank: int = 0, world: int = 1):
    """The byte range [lo, hi) of a byte corpus of `length` bytes that `split` ("train": this rank's share,
    "val") reads; DataError when it holds no window of seq_len + 1 bytes. Torch-free: verify checks it before a
    launch, as the stream (bytestream.py) does when training starts."""
    n_train = int(length * (1.0 - val_fraction))
    if split == "train":
        per_rank = n_train // world
        lo, hi = rank * per_rank, (rank + 1) * per_rank
    elif split == "val":
        lo, hi = n_train, length
    else:
        raise ValueError(f"split must be train or val, not {split!r}")
    if hi - lo < seq_len + 1:
        raise DataError(
            f"the {split} split has {hi - lo} bytes, fewer than seq_len + 1 = {seq_len + 1}: add data, lower "
            "model.seq_len or change data.val_fraction"
        )
    return lo, hi


def run_files(data_cfg, root: Path, run: str = "RUN") -> list[Path]:
    """Every file a run with this DataConfig reads (`run`: its run file, named in the error); DataError when
    one is missing."""
    if data_cfg.kind == "bytes":
        return resolve_paths(data_cfg.paths, root, run=run)
    return shard_files(root / data_cfg.shard_dir)


def under_data(pattern: str, key: str) -> str:
    """`pattern` (a config path) relative to data/; DataError when it points elsewhere."""
    rel = data_relative(pattern)
    if rel is None:
        raise DataError(outside_words(pattern, key))
    return rel


def push_scope(data_cfg) -> tuple[list[str], list[str]]:
    """What `data push` brings to the server for this DataConfig: globs relative to data/, and notes on
    what it leaves alone ("{stdlib}" is the server's own Python's)."""
    if data_cfg.kind == "shards":
        return [under_data(data_cfg.shard_dir.rstrip("/"), "data.shard_dir") + "/*"], []
    globs, notes = [], []
    for pattern in data_cfg.paths:
        if STDLIB in pattern:
            notes.append(f"{pattern!r} is the server's own Python standard library: nothing to push")
        else:
            globs.append(under_data(pattern, "data.paths"))
    return globs, notes


def push_files(data_cfg, root: Path, stats: dict[str, FileStat] | None = None) -> list[str]:
    """The local files `data push` sends (as glob names them): those the run reads, but for the server's own
    stdlib. `stats`: as match_files keeps them."""
    if data_cfg.kind == "shards":
        return [str(p) for p in shard_files(root / data_cfg.shard_dir)]
    return match_files([p for p in data_cfg.paths if STDLIB not in p], root, stats)


def in_scope(data_dir: Path, globs: list[str]) -> list[str]:
    """The files under data_dir that `globs` (relative to it) match, as relative POSIX paths."""
    found: set[str] = set()
    top = os.path.normpath(data_dir) + os.sep
    for pattern in globs:  # in strings: a no-op push of thousands of files spent most of its answer here
        for match in glob.glob(os.path.join(data_dir, pattern), recursive=True):
            if os.path.isfile(match):
                rel = os.path.normpath(match)
                rel = rel[len(top) :] if rel.startswith(top) else os.path.relpath(rel, data_dir)
                found.add(rel.replace(os.sep, "/"))
    return sorted(found)


DATA_DIR_ENV = "ENLACE_DATA_DIR"  # remote.sh: the remote_dir's shared data/, which every tree reads


def shared_data_dir(root: Path) -> Path:
    """Where the server keeps the data every tree reads (data push writes there): the remote_dir's data/ as
    remote.sh names it, else the project's own data/ (the trainer's tree links it; the local host, a test)."""
    return Path(os.environ.get(DATA_DIR_ENV) or root / DATA_DIR)


def link_shared_data(root: Path) -> int:
    """Make the shared data appear where a command looks for it. A tree whose data/ is the link to the shared
    directory needs nothing; a repository that tracks files under data/ itself (nanoGPT tracks
    data/shakespeare_char/prepare.py and ignores the .bin files beside it) gets a link for each shared file its
    data/ lacks, in place. Returns the links made."""
    tree_data, shared = root / DATA_DIR, shared_data_dir(root)
    if tree_data.is_symlink() or not tree_data.is_dir() or not shared.is_dir():
        return 0
    if tree_data.resolve() == shared.resolve():
        return 0
    made, inside = 0, tree_data.resolve()
    for dirpath, dirs, files in os.walk(shared):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # a push's hidden staging beside the data
        for name in files:
            src = Path(dirpath) / name
            dst = tree_data / src.relative_to(shared)
            if name.startswith(".") or os.path.lexists(dst):
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not dst.parent.resolve().is_relative_to(inside):  # a tracked link to elsewhere: never written through
                continue
            with contextlib.suppress(FileExistsError):  # another start (or a verify) made it meanwhile
                dst.symlink_to(src)
                made += 1
    return made
