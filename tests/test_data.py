"""ByteStream and ShardStream: exact state round trips, splits, rank sharding, prepare."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from support import REPO
from support.configs import write_run
from support.writes import file_write_sizes

from enlace.data.bytestream import ByteStream
from enlace.data.paths import DataError, resolve_paths
from enlace.data.shards import ShardStream, prepare_shards


@pytest.fixture
def files(project):
    return resolve_paths(["data/tiny/*.txt"], project)


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_bytestream_batches_are_shifted_windows_of_the_corpus(files):
    s = ByteStream(files, seq_len=16, batch_size=3, seed=1)
    x, y = s.next_batch()
    assert x.shape == y.shape == (3, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    corpus = b"".join(f.read_bytes() for f in files)
    assert bytes(x[0].tolist()) in corpus


def test_bytestream_state_round_trip_at_arbitrary_position(files):
    a = ByteStream(files, 16, 4, seed=3)
    for _ in range(7):
        a.next_batch()
    b = ByteStream(files, 16, 4, seed=3)
    b.load_state_dict(a.state_dict())
    for _ in range(5):
        assert _same(a.next_batch(), b.next_batch())
    fresh = ByteStream(files, 16, 4, seed=3)  # without the state, batches differ: the test can fail
    assert not _same(a.next_batch(), fresh.next_batch())


def test_bytestream_state_is_small_and_versioned(files):
    state = ByteStream(files, 16, 4).state_dict()
    assert state["version"] == 1 and len(json.dumps(state)) < 200


def test_bytestream_splits_and_ranks_are_disjoint(files):
    train = ByteStream(files, 16, 2, "train", 0.1)
    val = ByteStream(files, 16, 2, "val", 0.1)
    assert train.hi <= val.lo
    r0 = ByteStream(files, 16, 2, "train", 0.1, rank=0, world=2)
    r1 = ByteStream(files, 16, 2, "train", 0.1, rank=1, world=2)
    assert r0.hi <= r1.lo and r1.hi <= val.lo


def test_bytestream_refuses_state_of_other_kind(files):
    with pytest.raises(DataError, match="another data config"):
        ByteStream(files, 16, 2).load_state_dict({"kind": "shards", "version": 1})


def test_missing_corpus_is_a_clear_error(project):
    with pytest.raises(DataError, match="matches no file"):
        resolve_paths(["data/nothing/*.txt"], project)


@pytest.mark.parametrize("dtype", ["uint8", "uint16"])
def test_prepare_round_trips_the_corpus(files, tmp_path, dtype):
    meta = prepare_shards(files, tmp_path / "shards", shard_tokens=4096, dtype=dtype, val_fraction=0.1)
    corpus = np.frombuffer(b"".join(f.read_bytes() for f in files), dtype=np.uint8)
    parts = [np.fromfile(tmp_path / "shards" / n, dtype=dtype) for n in meta["train"] + meta["val"]]
    assert np.array_equal(np.concatenate(parts).astype(np.uint8), corpus)
    assert len(meta["train"]) > 3 and meta["tokens"]["train"] + meta["tokens"]["val"] == len(corpus)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dir left
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "shards").stat().st_mode & 0o777 == 0o777 & ~umask  # as mkdir makes it (mkdtemp's: 0700)


def test_prepare_writes_its_shards_in_pieces_of_at_most_256_kib(tmp_path, monkeypatch):
    """ndarray.tofile gave a whole shard (16 MiB and more) to one write(), which stalled on ext4 here (Linux 6.x
    sizes page-cache folios by the write; bench/large_writes.py, docs/benchmarks.md)."""
    from enlace.hashing import WRITE_PIECE

    corpus = tmp_path / "corpus.bin"
    corpus.write_bytes(os.urandom(3 << 20))
    sizes = file_write_sizes(monkeypatch)
    meta = prepare_shards([corpus], tmp_path / "shards", shard_tokens=1 << 20, dtype="uint16", val_fraction=0.1)
    monkeypatch.undo()
    parts = [np.fromfile(tmp_path / "shards" / n, dtype="uint16") for n in meta["train"] + meta["val"]]
    assert np.concatenate(parts).astype(np.uint8).tobytes() == corpus.read_bytes()
    shards = sum((tmp_path / "shards" / n).stat().st_size for n in meta["train"] + meta["val"])
    assert sizes and sum(sizes) == shards and max(sizes) == WRITE_PIECE, sizes


def test_prepare_refuses_existing_output(files, tmp_path):
    (tmp_path / "shards").mkdir()
    with pytest.raises(DataError, match="already exists"):
        prepare_shards(files, tmp_path / "shards")


def test_shardstream_state_round_trip_across_shards_and_epochs(files, tmp_path):
    prepare_shards(files, tmp_path / "s", shard_tokens=2048, dtype="uint16")
    a = ShardStream(tmp_path / "s", 16, 4, seed=5)
    for _ in range(1500):  # several epochs over the shards
        a.next_batch()
    assert a.epoch >= 1
    b = ShardStream(tmp_path / "s", 16, 4, seed=5)
    b.load_state_dict(a.state_dict())
    for _ in range(40):
        assert _same(a.next_batch(), b.next_batch())
    fresh = ShardStream(tmp_path / "s", 16, 4, seed=5)
    assert not _same(a.next_batch(), fresh.next_batch())


def test_shardstream_ranks_read_disjoint_inputs(tmp_path):
    noise = tmp_path / "noise.bin"  # random bytes: any repeated 16-byte row would be a real overlap
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 60_000, dtype=np.uint8).tobytes())
    prepare_shards([noise], tmp_path / "s", shard_tokens=4096)
    ranks = [ShardStream(tmp_path / "s", 16, 2, seed=1, rank=r, world=2) for r in (0, 1)]
    rows = [set(), set()]
    for _ in range(50):
        for r, s in enumerate(ranks):
            x, _ = s.next_batch()
            rows[r].update(bytes(row.tolist()) for row in x)
    assert len(rows[0]) == len(rows[1]) == 100
    assert not rows[0] & rows[1]


def test_prepare_cli(project, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "enlace",
            "prepare",
            "tiny",
            "--out",
            str(tmp_path / "sh"),
            "--shard-tokens",
            "4096",
            "--root",
            str(project),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert "train" in out.stdout and (tmp_path / "sh" / "meta.json").is_file()


def test_resolve_paths_keeps_pathlibs_order_which_is_the_streams(tmp_path):
    """The byte stream's file order is resolve_paths' order, and a checkpoint's data state counts bytes in it:
    the order must stay pathlib's (by parts), which is not the strings' ("a/b/c.py" before "a/b.py": "/" sorts
    after ".")."""
    from enlace.data.paths import resolve_paths

    names = ["a/b.py", "a-c.py", "a.b/x.py", "a/b/c.py", "A/z.py", "a0.py", "a/a b.py", "ab/y.py", "a_/q.py"]
    for name in names:
        (tmp_path / "data" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / name).write_text("x = 1\n")
    got = resolve_paths(["data/**/*.py", "data/a/*.py"], tmp_path)  # the second adds nothing again
    assert got == sorted(tmp_path / "data" / n for n in names)
    assert resolve_paths(["data/**/*.py"], tmp_path) == got  # one pattern alone: the same order
    assert [p.relative_to(tmp_path / "data").as_posix() for p in got][:3] == ["A/z.py", "a/a b.py", "a/b/c.py"]
    # a link's `..` is the parent of where it leads, not of the link: the path stays as the pattern wrote it
    (tmp_path / "far" / "dir").mkdir(parents=True)
    (tmp_path / "far" / "x.py").write_text("far = 1\n")
    (tmp_path / "data" / "link").symlink_to(tmp_path / "far" / "dir")
    (got,) = resolve_paths(["data/link/../x.py"], tmp_path)
    assert got.read_text() == "far = 1\n"


def test_stat_in_asks_a_missing_directory_once_and_sees_it_once_made(tmp_path, monkeypatch):
    """The first push or fetch of thousands of files finds none of them: one stat per missing directory, not per
    file. A directory that exists but lacks the file is asked each time."""
    import os

    from enlace.data import paths

    calls = []
    real_stat = os.stat
    monkeypatch.setattr(paths.os, "stat", lambda p, *a, **k: calls.append(p) or real_stat(p, *a, **k))
    present: dict[str, bool] = {}
    missing = [str(tmp_path / "new" / f"f{i}") for i in range(50)]
    assert all(paths.stat_in(p, present) is None for p in missing)
    assert len(calls) == 2  # the first file, then its directory (isdir): the other 49 asked nothing
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "a").write_bytes(b"abc")
    calls.clear()
    assert paths.stat_in(str(tmp_path / "here" / "b"), present) is None
    assert paths.stat_in(str(tmp_path / "here" / "c"), present) is None
    assert len(calls) == 3  # b, its directory (there), c: a present directory is asked once too
    assert paths.stat_in(str(tmp_path / "here" / "a"), present).st_size == 3  # the directory was not written off


def test_match_files_lists_a_file_as_often_as_glob_does(tmp_path):
    """A pattern with two `**` makes glob give a file more than once; the stream has always read it so, and a
    checkpoint's data state counts bytes in that list: match_files keeps it (data push keeps each file's stat)."""
    from enlace.data.paths import match_files

    (tmp_path / "d" / "a" / "b").mkdir(parents=True)
    (tmp_path / "d" / "a" / "b" / "x.txt").write_text("x")
    (tmp_path / "d" / "y.txt").write_text("y")
    stats: dict = {}
    got = match_files(["d/**/**/*.txt"], tmp_path, stats)
    deep, top = str(tmp_path / "d" / "a" / "b" / "x.txt"), str(tmp_path / "d" / "y.txt")
    assert got == [deep] * 3 + [top] and set(stats) == {deep, top} and stats[top][0].st_size == 1


def test_a_corpus_too_small_for_its_splits_is_said_before_a_launch(project):
    """An empty corpus file passed check-config, verify and preflight, then failed at the first step (and a
    relaunch could not help): verify's data check (`enlace data-files`) says it, in the stream's own words."""
    import json

    from support.cli import enlace

    (project / "data" / "empty").mkdir()
    (project / "data" / "empty" / "e.txt").write_bytes(b"")
    write_run(project, "small")  # the tiny corpus
    empty = ["--set", 'data.paths=["data/empty/*.txt"]']
    out = enlace(project, "data-files", "small", *empty, "--json", check=False)
    assert (
        out.returncode == 3 and "the train split has 0 bytes, fewer than seq_len + 1" in json.loads(out.stdout)["error"]
    )
    assert json.loads(enlace(project, "data-files", "small", "--json").stdout)["ok"]  # the tiny corpus: both fit
    # seen: generate's small val shard passed verify and preflight, then training refused it
    corpus = project / "data" / "c.txt"
    corpus.write_bytes(bytes(range(256)) * 12)  # 3,072 bytes: val_fraction 0.01 leaves a 30-token val shard
    prepare_shards([corpus], project / "data" / "sh", shard_tokens=4096, dtype="uint8", val_fraction=0.01)
    (project / "configs" / "data" / "sh.yaml").write_text("kind: shards\nshard_dir: data/sh\n")
    write_run(project, "sharded", data="sh")
    out = enlace(project, "data-files", "sharded", "--json", check=False)
    assert out.returncode == 3 and "no val shard holds" in json.loads(out.stdout)["error"], out.stdout
    assert "or generate more --bytes" in json.loads(out.stdout)["error"]  # generate's shards: more text
    # shards not written yet, an interrupted generate's text beside them: both ways to write them are named
    (project / "data" / "gen.partial").mkdir()
    (project / "configs" / "data" / "gen.yaml").write_text("kind: shards\nshard_dir: data/gen\n")
    write_run(project, "fromgen", data="gen")
    error = json.loads(enlace(project, "data-files", "fromgen", "--json", check=False).stdout)["error"]
    assert "has no meta.json (gen.partial/ holds an interrupted generate: run it again to finish)" in error, error
    assert "`enlace-remote generate TEACHER --bytes N --out DIR` (a teacher's text)" in error, error


def test_data_that_matches_nothing_names_its_key_and_the_push_that_brings_it(project):
    """On a server (ENLACE_ROOT set) the error names the run file's own key and the data push for this run file:
    a run file of your own command was told `data.paths` (it has `data:`) and `data push RUN`."""
    import json

    from support.cli import enlace

    server = {"ENLACE_ROOT": str(project)}
    (project / "configs" / "runs" / "mine.yaml").write_text("command: [python, train.py]\ndata: [data/mine/*.bin]\n")
    out = json.loads(enlace(project, "data-files", "mine", "--json", check=False, env=server).stdout)
    assert out["error"].startswith("data: 'data/mine/*.bin' matches no file"), out
    assert "enlace-remote data push mine)" in out["error"], out
    write_run(project, "small")
    none = ["--set", 'data.paths=["data/absent/*.txt"]']
    out = json.loads(enlace(project, "data-files", "small", *none, "--json", check=False, env=server).stdout)
    assert out["error"].startswith("data.paths: 'data/absent/*.txt' matches no file"), out
    assert "enlace-remote data push small)" in out["error"], out
