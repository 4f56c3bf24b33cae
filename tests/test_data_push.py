"""`enlace-remote data push` / `data ls`: the server's data/ brought to exactly the files a run reads here —
its server half (enlace/server/datarecv.py) on real files, the driver's plan, and the whole push over a real sshd
(nested names with spaces and UTF-8, a file over 100 MiB, a second push that sends nothing, a changed file
sent alone, a push killed mid-file that continues without re-sending and without a partial file in data/)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from support.configs import write_run, write_tiny_corpus
from support.remote import PipeReader, popen_remote, remote, server_dir, wait_until
from support.repocopy import commit_all
from support.writes import file_write_sizes

from enlace.contract import FRAME
from enlace.data.paths import DataError, in_scope, push_scope, under_data
from enlace.server.datarecv import BadRequest, receive
from enlace.state import runs


def _converse(data_dir: Path, listing: dict, plan: dict | None = None, bodies: dict | None = None):
    """receive() with one listing, one plan and the files' frames; returns its two JSON answers."""
    wire = json.dumps(listing).encode() + b"\n"
    if plan is not None:
        wire += json.dumps(plan).encode() + b"\n"
        for rel, offset, _, _ in plan.get("send", []):
            body, digest = bodies[rel]
            wire += FRAME.pack(offset, len(body) - offset) + body[offset:] + digest
    out = io.BytesIO()
    receive(data_dir, io.BytesIO(wire), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_the_server_half_installs_only_verified_files_and_deletes_only_in_scope(tmp_path):
    data = tmp_path / "remote" / "data"
    (data / "corpus").mkdir(parents=True)
    (data / "corpus" / "old.txt").write_bytes(b"stale")
    (data / "other.bin").write_bytes(b"not this run's")
    good, bad = b"hello world", b"tampered"
    listing = {
        "files": [["corpus/a b/ü.txt", len(good), 1_000_000_000], ["corpus/x.txt", len(bad), 5]],
        "scope": ["corpus/**/*"],
    }
    plan = {
        "send": [["corpus/a b/ü.txt", 0, len(good), 1_000_000_000], ["corpus/x.txt", 0, len(bad), 5]],
        "delete": ["corpus/old.txt"],
    }
    bodies = {
        "corpus/a b/ü.txt": (good, hashlib.sha256(good).digest()),
        "corpus/x.txt": (bad, hashlib.sha256(b"what the driver sent").digest()),  # arrived other than sent
    }
    first, report = _converse(data, listing, plan, bodies)
    assert first["have"] == {"corpus/a b/ü.txt": None, "corpus/x.txt": None}
    assert first["extra"] == [["corpus/old.txt", 5]]  # other.bin: outside the run's paths, never offered
    assert report["written"] == ["corpus/a b/ü.txt"] and report["bad"] == ["corpus/x.txt"]
    assert (data / "corpus" / "a b" / "ü.txt").read_bytes() == good
    assert (data / "corpus" / "a b" / "ü.txt").stat().st_mtime_ns == 1_000_000_000
    assert not (data / "corpus" / "x.txt").exists() and not any((tmp_path / "remote" / ".partial-push").rglob("x.txt"))
    assert not (data / "corpus" / "old.txt").exists() and (data / "other.bin").exists()
    again = _converse(data, listing)  # the driver only looks (data ls)
    assert again[0]["have"]["corpus/a b/ü.txt"] == "same"


@pytest.mark.parametrize("rel", ["../escape.txt", "/etc/passwd", "a/../../b", ".partial-push/x", "a/./b"])
def test_the_server_half_refuses_paths_that_could_escape(tmp_path, rel):
    with pytest.raises(BadRequest, match="refusing path"):
        _converse(tmp_path / "data", {"files": [[rel, 1, 1]], "scope": []})


def test_a_link_out_of_the_data_directory_is_refused(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "data" / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BadRequest, match="leads outside"):
        _converse(tmp_path / "data", {"files": [["link/f.txt", 1, 1]], "scope": []})


def test_a_link_in_data_with_the_same_bytes_is_touched_itself_not_what_it_points_at(tmp_path):
    """A user's data/corpus.bin may be a link to a shared copy on the server (another disk, a colleague's file):
    the same bytes with another mtime set the link's own time; the shared file is left as it was."""
    (tmp_path / "data").mkdir()
    shared = tmp_path / "shared.bin"
    shared.write_bytes(b"same bytes")
    os.utime(shared, ns=(5_000_000_000, 5_000_000_000))
    (tmp_path / "data" / "corpus.bin").symlink_to(shared)
    listing = {"files": [["corpus.bin", 10, 9_000_000_000]], "scope": ["*"]}
    first, report = _converse(tmp_path / "data", listing, {"touch": [["corpus.bin", 9_000_000_000]]})
    assert first["have"]["corpus.bin"] == ["sha256", hashlib.sha256(b"same bytes").hexdigest()]
    assert report["touched"] == 1 and shared.stat().st_mtime_ns == 5_000_000_000
    assert (tmp_path / "data" / "corpus.bin").lstat().st_mtime_ns == 9_000_000_000
    again = _converse(tmp_path / "data", listing)  # settled: not hashed and re-dated on every push
    assert again[0]["have"]["corpus.bin"] == "same"
    shared.write_bytes(b"SAME BYTES")  # the shared file changed since (its size alone would not say so)
    later = (tmp_path / "data" / "corpus.bin").lstat().st_ctime_ns + 1_000_000_000  # (not within the clock's tick)
    os.utime(shared, ns=(later, later))
    changed = _converse(tmp_path / "data", listing)
    assert changed[0]["have"]["corpus.bin"] == ["sha256", hashlib.sha256(b"SAME BYTES").hexdigest()]


def test_a_delete_outside_the_runs_paths_is_refused(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.bin").write_bytes(b"x")
    with pytest.raises(BadRequest, match="not deleted"):
        _converse(tmp_path / "data", {"files": [], "scope": ["corpus/*"]}, {"delete": ["keep.bin"]})
    assert (tmp_path / "data" / "keep.bin").exists()


def test_a_partial_file_continues_from_what_the_server_holds(tmp_path):
    data, body = tmp_path / "data", os.urandom(5000)
    (tmp_path / ".partial-push").mkdir()
    (tmp_path / ".partial-push" / "f.bin").write_bytes(body[:3000])
    listing = {"files": [["f.bin", len(body), 7]], "scope": ["*"]}
    plan = {"send": [["f.bin", 3000, len(body), 7]]}
    first, report = _converse(data, listing, plan, {"f.bin": (body, hashlib.sha256(body).digest())})
    assert first["have"]["f.bin"] == ["partial", 3000, hashlib.sha256(body[:3000]).hexdigest()]
    assert report["written"] == ["f.bin"] and (data / "f.bin").read_bytes() == body


def test_data_paths_outside_data_are_refused_and_the_stdlib_is_not_pushed():
    with pytest.raises(DataError, match="outside the project's data/"):
        under_data("/srv/corpus/*.txt", "data.paths")
    with pytest.raises(DataError, match="outside the project's data/"):
        under_data("data/../enlace/*.py", "data.paths")

    class Data:
        kind, paths, shard_dir = "bytes", ["{stdlib}/*.py", "data/corpus/**/*.txt"], ""

    globs, notes = push_scope(Data)
    assert globs == ["corpus/**/*.txt"] and "server's own Python standard library" in notes[0]


def _corpus(repo: Path) -> dict[str, bytes]:
    """A few hundred files under data/big/: nested, spaces and UTF-8 in names, one over 100 MiB."""
    files = {}
    for i in range(300):
        rel = f"big/d{i % 7}/sub {i % 3}/fíle {i} ñ.txt"
        files[rel] = f"file {i}\n".encode() * (i + 1)
    files["big/huge.bin"] = os.urandom(101 * 2**20)
    for rel, body in files.items():
        (repo / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / "data" / rel).write_bytes(body)
    (repo / "configs" / "data" / "big.yaml").write_text(
        'kind: bytes\npaths:\n  - "data/big/**/*"\nval_fraction: 0.01\n'
    )
    write_run(repo, "big", data="big", training={"max_steps": 2})
    commit_all(repo, "a run on data/big")
    return files


def _wait_gone(word: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while any(word in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])):
        assert time.time() < deadline, f"a {word} process is still running"
        time.sleep(0.05)


def _server_files(data_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(data_dir).as_posix(): p.read_bytes() for p in data_dir.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_push_is_exact_incremental_and_resumes_after_a_kill(sshd, user_repo):
    files = _corpus(user_repo)
    data_dir = server_dir(sshd, "testhost") / "data"
    (user_repo / "notes.txt").write_text("an uncommitted file\n")  # the sync before a first push refuses it...
    out = remote(user_repo, sshd.env, "data", "ls", "big", check=False)
    assert out.returncode == 3 and "pass --allow-dirty to ship HEAD without them" in out.stderr, out.stderr
    out = remote(user_repo, sshd.env, "data", "push", "big", "--allow-dirty")  # ...and takes the hint it gives
    (user_repo / "notes.txt").unlink()
    assert "sync:" in out.stderr and "sent 301 file(s)" in out.stderr, out.stderr  # a server with no tree: synced
    assert _server_files(data_dir / "big") == {k.removeprefix("big/"): v for k, v in files.items()}

    out = remote(user_repo, sshd.env, "data", "push", "big")
    assert "up to date" in out.stderr and "nothing sent" in out.stderr, out.stderr

    changed = "big/d1/sub 1/fíle 1 ñ.txt"
    (user_repo / "data" / changed).write_bytes(b"changed\n")
    out = remote(user_repo, sshd.env, "data", "push", "big")
    assert "sent 1 file(s), 8 B" in out.stderr, out.stderr
    assert (data_dir / changed).read_bytes() == b"changed\n"

    ls = remote(user_repo, sshd.env, "data", "ls", "big").stdout
    assert "here: 301 files" in ls and "testhost: 301 of 301 files match, up to date" in ls, ls
    (data_dir / "big" / "only-there.txt").write_bytes(b"a file this machine lacks\n")
    ls = remote(user_repo, sshd.env, "data", "ls", "big").stdout  # named, as docs/data.md says (it was a count)
    assert "1 more there that this machine lacks" in ls and "  there, not here: big/only-there.txt" in ls, ls
    (data_dir / "big" / "only-there.txt").unlink()

    # A push killed mid-file: the old huge.bin stays whole in data/, the new bytes wait outside it
    new_huge = os.urandom(101 * 2**20)
    (user_repo / "data" / "big" / "huge.bin").write_bytes(new_huge)
    partial = server_dir(sshd, "testhost") / ".partial-push" / "big" / "huge.bin"
    proc = popen_remote(user_repo, sshd.env, "data", "push", "big")
    err = PipeReader(proc.stderr)
    deadline = time.time() + 120
    while not (partial.exists() and partial.stat().st_size > 2**20):
        assert proc.poll() is None, f"the push ended before it could be stopped: {err.text()}"
        assert time.time() < deadline, err.text()
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGSTOP)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (data_dir / "big" / "huge.bin").read_bytes() == files["big/huge.bin"]  # never half-written
    assert not [p for p in data_dir.rglob("*") if "partial" in p.name or p.name.startswith(".")]
    _wait_gone("data-receive")  # the server side saw its client go (end of input) and ended
    held = partial.stat().st_size
    assert 0 < held < len(new_huge)

    out = remote(user_repo, sshd.env, "data", "push", "big")
    assert "1 resumed where an earlier push stopped" in out.stderr, out.stderr
    sent = float(out.stderr.split("sent 1 file(s), ")[1].split(" MiB")[0])
    assert sent < 101, out.stderr  # what had arrived was not sent again
    assert (data_dir / "big" / "huge.bin").read_bytes() == new_huge
    assert not partial.exists()


def test_a_run_reading_outside_data_is_refused_in_one_line(user_repo, sshd):
    (user_repo / "configs" / "data" / "abs.yaml").write_text('kind: bytes\npaths:\n  - "/srv/corpus/*.txt"\n')
    write_run(user_repo, "abs", data="abs")
    commit_all(user_repo, "a run reading an absolute path")
    out = remote(user_repo, sshd.env, "data", "push", "abs", check=False, host="local")
    assert out.returncode == 2 and "outside the project's data/" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.slow
def test_launch_push_data_is_a_stage_before_verify_and_verify_names_data_push(sshd, user_repo):
    """A server without the corpus: verify --for-launch fails and names `data push`; launch --push-data
    sends it between the sync and verify, and the run trains on it."""
    write_tiny_corpus(user_repo / "data" / "tiny")
    remote(user_repo, sshd.env, "sync")
    out = remote(user_repo, sshd.env, "verify", "tiny", "--for-launch", check=False)
    assert out.returncode == 3 and "enlace-remote --host testhost data push tiny" in out.stderr, out.stderr
    out = remote(user_repo, sshd.env, "launch", "tiny", "--push-data", "--no-preflight", "--until", "2")
    err = out.stderr
    assert err.index("sync:") < err.index("data push tiny → testhost: sent") < err.index("verify: tiny ready"), err
    server = server_dir(sshd, "testhost") / "data" / "tiny"
    assert _server_files(server) == _server_files(user_repo / "data" / "tiny")
    # several hosts at once, in parallel: each gets what it lacks (testhost: nothing; local: everything)
    out = remote(user_repo, sshd.env, "data", "push", "tiny", "--hosts", "testhost,local")
    assert "data push tiny → testhost: up to date" in out.stderr and "data push tiny → local: sent" in out.stderr
    assert _server_files(server_dir(sshd, "local") / "data" / "tiny") == _server_files(user_repo / "data" / "tiny")
    # the run has a checkpoint now: a --push-data that changes what it trained on is refused before a byte is sent
    # (it pushed, then the resume refused the changed data, and the server's copy it trained on was gone)
    run_dir = server_dir(sshd, "testhost") / "runs" / "tiny"
    wait_until(lambda: not runs.observe(run_dir)["alive"], 120, "tiny to stop at step 2")
    first = sorted((user_repo / "data" / "tiny").glob("*.txt"))[0]
    first.write_bytes(first.read_bytes() + b"\n# changed here\n")
    out = remote(user_repo, sshd.env, "launch", "tiny", "--push-data", "--no-preflight", check=False)
    assert out.returncode == 2 and "launch --push-data would change 1 file(s) tiny reads" in out.stderr, out.stderr
    assert (server / first.name).read_bytes() != first.read_bytes()  # nothing was sent


def test_both_halves_name_a_file_the_same_whatever_the_patterns_spelling(tmp_path, project):
    """The driver names its files relative to data/ from its own globs, the server names what it holds from the
    run's scope: a pattern written with `./` or `//` must give the same names on both sides (a push compared
    `./corpus/a.txt` with `corpus/a.txt`: every file sent again, and --delete would remove them)."""
    from orchestrator.transfer.datapush import local_data

    for rel in ("corpus/a.txt", "corpus/deep/b.txt"):
        (project / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / "data" / rel).write_text("x\n")
    names = []
    for pattern in ("data/corpus/**/*.txt", "data/./corpus//**/*.txt"):
        (project / "configs" / "data" / "spelled.yaml").write_text(f"kind: bytes\npaths: ['{pattern}']\n")
        write_run(project, "spelled", data="spelled")
        local = local_data(project, "spelled")
        names.append(sorted(local.files))
        assert in_scope(project / "data", local.globs) == sorted(local.files)  # the server's names for them
    assert names[0] == names[1] == ["corpus/a.txt", "corpus/deep/b.txt"]


def test_received_bytes_reach_the_disk_in_pieces_of_at_most_256_kib(tmp_path, monkeypatch):
    """Linux 6.x sizes page-cache folios by the write: on ext4 here, 1 MiB and 4 MiB writes of a 1 GiB file
    stalled in write() (a 1 GiB push fell below rsync's speed; the figures are in docs/benchmarks.md).
    Both receiving ends, data push's server and fetch's driver, write a 3 MiB file in pieces."""
    from enlace.hashing import WRITE_PIECE
    from orchestrator.transfer.wire import Progress, Reader, receive

    sizes = file_write_sizes(monkeypatch)
    body = os.urandom(3 << 20)
    rel, digest = "big.bin", hashlib.sha256(body).digest()
    plan = {"send": [[rel, 0, len(body), 5]]}
    _, report = _converse(
        tmp_path / "data", {"files": [[rel, len(body), 5]], "scope": ["*"]}, plan, {rel: (body, digest)}
    )
    assert report["written"] == [rel] and (tmp_path / "data" / rel).read_bytes() == body
    pushed, sizes[:] = list(sizes), []
    reader = Reader(io.BytesIO(FRAME.pack(0, len(body)) + body))
    receive(reader, tmp_path / "fetched", 0, hashlib.sha256(), Progress("fetch", len(body), tty=False))
    assert (tmp_path / "fetched").read_bytes() == body
    assert sum(pushed) == sum(sizes) == len(body) and max(pushed + sizes) == WRITE_PIECE, (pushed, sizes)


@pytest.mark.parametrize("case", ["new", "present", "rename-refused"])
def test_a_new_top_directory_lands_whole_in_one_rename(tmp_path, monkeypatch, case):
    """A first push of thousands of files into a directory data/ lacks made one rename per file (a fifth of the
    server's time on tmpfs); such a directory now lands in one rename once every file is verified. Where data/
    holds it already, or the directory's rename is refused (data/ on another file system: EXDEV), file by file;
    a corrupt file lands in neither."""
    import errno

    from enlace.server import datalanding

    data = tmp_path / "remote" / "data"
    if case == "present":
        (data / "corpus").mkdir(parents=True)
    bodies = {f"corpus/d{i % 2}/f{i}.bin": os.urandom(100 + i) for i in range(6)}
    listing = {"files": [[rel, len(b), 5] for rel, b in bodies.items()], "scope": ["corpus/**/*"]}
    plan = {"send": [[rel, 0, len(b), 5] for rel, b in bodies.items()]}
    digests = {rel: (b, hashlib.sha256(b).digest()) for rel, b in bodies.items()}
    digests["corpus/d1/f5.bin"] = (bodies["corpus/d1/f5.bin"], hashlib.sha256(b"another").digest())
    renames, replaces = [], []
    real_rename, real_replace = os.rename, os.replace

    def rename(a, b):
        renames.append(b)
        if case == "rename-refused":
            raise OSError(errno.EXDEV, "cross-device link")
        return real_rename(a, b)

    monkeypatch.setattr(datalanding.os, "rename", rename)
    monkeypatch.setattr(datalanding.os, "replace", lambda a, b: replaces.append(b) or real_replace(a, b))
    _, report = _converse(data, listing, plan, digests)
    assert report["bad"] == ["corpus/d1/f5.bin"] and len(report["written"]) == 5
    for rel in report["written"]:
        assert (data / rel).read_bytes() == bodies[rel] and (data / rel).stat().st_mtime_ns == 5
    assert not (data / "corpus" / "d1" / "f5.bin").exists()
    assert not list((data.parent / ".partial-push").rglob("*.bin"))  # nothing left in staging
    assert (len(renames), len(replaces)) == {"new": (1, 0), "present": (0, 5), "rename-refused": (1, 5)}[case]


def test_the_summary_counts_each_file_once(tmp_path):
    """A push said `sent 1, 1 only re-dated, 6 already there (7 files)`: the re-dated file was also counted there."""
    import hashlib
    from concurrent.futures import Future

    from orchestrator.transfer.datapush import LocalData, decide, summary

    files = {}
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(name.encode() * 10)
        files[name] = (str(tmp_path / name), 10, 1)
    listing = Future()
    listing.set_result(files)
    local = LocalData("r", ["*"], [], listing)
    have = {"a": "same", "b": ["sha256", hashlib.sha256(b"b" * 10).hexdigest()], "c": None}  # c: not there
    said = summary("gpu1", local, decide(local, have, [], False), None, False, 1.0)
    assert "sent 1 file(s), 10 B, 1 only re-dated (same bytes), 1 already there (3 files, 30 B)" in said, said


def test_push_data_guards_a_trainers_checkpoint_and_not_a_command_of_your_own(tmp_path):
    """`launch dat --push-data` of a script of your own with an enlace.job checkpoint was refused, naming
    --allow-data-change and --resume none, both of which a command's launch refuses: a dead end. A command claims
    no data (its resume checks none); enlace's trainer's run is still guarded. (The session stands in for the
    host's `runs` answer.)"""
    from types import SimpleNamespace

    from orchestrator.errors import UsageError
    from orchestrator.launch.ship import trained_data_guard

    (tmp_path / "configs" / "runs").mkdir(parents=True)
    (tmp_path / "configs" / "runs" / "dat.yaml").write_text("command: [python, train.py]\ndata: [data/*.txt]\n")
    row = {"run_name": "dat", "latest_checkpoint": "step-000010"}
    plan = SimpleNamespace(send=[("scale.txt", 0, 3, 1)])
    for host_row, guarded in (({**row, "command": ["python", "train.py"]}, False), (row, True)):
        session = SimpleNamespace(enlace_json=lambda *args, r=host_row: [r])
        guard = trained_data_guard(session, tmp_path, "dat", ())
        assert (guard is not None) == guarded
        if guarded:
            with pytest.raises(UsageError, match="--allow-data-change resumes on the new data"):
                guard(plan)


def test_a_command_runs_data_that_matches_nothing_names_its_run_files_key(tmp_path):
    """`data push dnone` said "data.paths: 'data/nothing/*.bin' matches no file": a trainer config's key, which
    a run file of your own command does not have (its key is `data:`)."""
    from orchestrator.transfer.datapush import local_data

    (tmp_path / "configs" / "runs").mkdir(parents=True)
    (tmp_path / "configs" / "runs" / "dnone.yaml").write_text("command: [python, t.py]\ndata: [data/nothing/*.bin]\n")
    with pytest.raises(DataError, match=r"^configs/runs/dnone\.yaml: data: 'data/nothing/\*\.bin' matches no file"):
        _ = local_data(tmp_path, "dnone").files
