"""data push under faults (faults round 4, items 4 and 7): a full disk is one line and leaves nothing in
data/; a link out of the corpus is refused; a push into data a live run reads is refused unless --force, and
a forced one is said in status and train.log; two pushes at once send the data once. Real sshd, real files."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from support.configs import write_run, write_tiny_corpus
from support.remote import PipeReader, popen_remote, remote, server_dir, wait_until
from support.repocopy import commit_all

from enlace.state import runs

pytestmark = pytest.mark.slow


def _run_on(repo, name: str, files: dict[str, bytes]) -> None:
    """A run reading data/NAME/*.bin, and those files here."""
    for rel, body in files.items():
        (repo / "data" / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / "data" / name / rel).write_bytes(body)
    (repo / "configs" / "data" / f"{name}.yaml").write_text(f'kind: bytes\npaths: ["data/{name}/*.bin"]\n')
    write_run(repo, name, data=name, training={"max_steps": 2})
    commit_all(repo, f"a run on data/{name}")


def test_a_full_disk_is_one_line_and_leaves_nothing_in_data(sshd, user_repo, tmp_path):
    """Seen: a 50 MB tmpfs under data/, 91 MiB to send: exit 1, empty stdout and stderr, and a 0-byte
    `.f022.txt.enlace-push` left in data/."""
    _run_on(user_repo, "full", {f"f{i:02d}.bin": os.urandom(400_000) for i in range(6)})
    remote(user_repo, sshd.env, "setup")
    mnt = server_dir(sshd, "testhost") / "data" / "full"
    mnt.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1000k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.fail("cannot mount a tmpfs (the suite runs as root: scripts/test.sh says so)")
    try:
        out = remote(user_repo, sshd.env, "data", "push", "full", check=False)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 9, out.stdout + out.stderr
        assert "no space left on" in lines[-1] and "bytes to write" in lines[-1] and "free there" in lines[-1], lines
        assert "Traceback" not in out.stderr
        assert not [p for p in mnt.rglob("*") if p.name.startswith(".") or "enlace-push" in str(p)], list(
            mnt.rglob("*")
        )
        assert all(p.stat().st_size == 400_000 for p in mnt.glob("*.bin"))  # only whole files
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    out = remote(user_repo, sshd.env, "data", "push", "full")  # room again: the push completes
    assert "sent" in out.stderr


def test_a_link_out_of_the_corpus_is_refused_unless_followed(sshd, user_repo, tmp_path):
    """Seen: a link to /etc/passwd in the local corpus was uploaded into the server's data/."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"not for the server")
    _run_on(user_repo, "linked", {"a.bin": b"corpus"})
    (user_repo / "data" / "linked" / "b.bin").symlink_to(secret)
    out = remote(user_repo, sshd.env, "data", "push", "linked", check=False)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert (
        "data/linked/b.bin is a link to" in out.stderr and str(secret) in out.stderr and "--follow-links" in out.stderr
    )
    assert not (server_dir(sshd, "testhost") / "data" / "linked").exists()
    remote(user_repo, sshd.env, "data", "push", "linked", "--follow-links")
    assert (server_dir(sshd, "testhost") / "data" / "linked" / "b.bin").read_bytes() == b"not for the server"


def test_a_push_into_data_a_live_run_reads_is_refused_unless_forced(sshd, user_repo):
    """Seen: accepted without a word; the supervisor's next restart failed 'the data differs' and the run
    ended `failed` — healing switched off in silence."""
    rd = server_dir(sshd, "testhost")
    write_tiny_corpus(user_repo / "data" / "tiny")
    remote(user_repo, sshd.env, "data", "push", "long")
    remote(user_repo, sshd.env, "launch", "long", "--no-preflight")
    wait_until(lambda: runs.read(rd / "runs" / "long").get("step", 0) > 0, 120, "long to train")
    first = sorted((user_repo / "data" / "tiny").glob("*.txt"))[0]
    first.write_bytes(first.read_bytes() + b"\n# changed here\n")
    out = remote(user_repo, sshd.env, "data", "push", "long", check=False)
    assert out.returncode == 2 and "which long reads while alive" in out.stderr and "--force" in out.stderr, out.stderr
    assert (rd / "data" / "tiny" / first.name).read_bytes() != first.read_bytes()  # nothing was sent
    dry = remote(user_repo, sshd.env, "data", "push", "long", "--dry-run", check=False)  # it said "would send", 0
    assert dry.returncode == 2 and "which long reads while alive" in dry.stderr, dry.stderr
    remote(user_repo, sshd.env, "data", "push", "long", "--force")
    assert (rd / "data" / "tiny" / first.name).read_bytes() == first.read_bytes()
    row = json.loads(remote(user_repo, sshd.env, "status", "long", "--json").stdout)[0]
    assert "--allow-data-change" in row["data_warning"], row
    assert "--allow-data-change" in remote(user_repo, sshd.env, "status").stdout
    assert "data push --force" in (rd / "runs" / "long" / "train.log").read_text()
    remote(user_repo, sshd.env, "stop", "long")
    # its resume is refused before anything starts (it was launched, queued and failed as it started), against
    # what its newest checkpoint's MANIFEST says it was trained on
    out = remote(user_repo, sshd.env, "launch", "long", "--no-preflight", check=False)
    assert out.returncode == 2 and "long on testhost: the data differs from what long's checkpoint step-" in out.stderr
    assert "launch --allow-data-change (not exact), or start afresh with --resume none" in out.stderr, out.stderr
    assert runs.read(rd / "runs" / "long")["status"] == "stopped"  # nothing started
    changed = first.read_bytes()
    first.write_bytes(changed.removesuffix(b"\n# changed here\n"))  # the same data back: it resumes
    remote(user_repo, sshd.env, "data", "push", "long")
    out = remote(user_repo, sshd.env, "launch", "long", "--no-preflight")
    assert "resumed from checkpoints/step-" in out.stderr and "data differs" not in out.stderr, out.stderr
    remote(user_repo, sshd.env, "stop", "long")
    first.write_bytes(changed)
    remote(user_repo, sshd.env, "data", "push", "long")
    out = remote(user_repo, sshd.env, "launch", "long", "--no-preflight", "--allow-data-change")
    assert "resumed from checkpoints/step-" in out.stderr and "data differs" not in out.stderr, out.stderr
    remote(user_repo, sshd.env, "stop", "long")


def test_two_pushes_at_once_send_the_data_once(sshd, user_repo):
    """Seen: two `data push` at once both sent all 1.3 GiB. The first push's server side is paused while the
    second starts (a pause cannot change what it writes), so the two overlap on any machine."""
    import psutil

    _run_on(user_repo, "twice", {f"f{i}.bin": os.urandom(20 * 2**20) for i in range(3)})
    remote(user_repo, sshd.env, "setup")
    partial = server_dir(sshd, "testhost") / ".partial-push" / "twice"
    first = popen_remote(user_repo, sshd.env, "data", "push", "twice")
    first_err = PipeReader(first.stderr)
    wait_until(lambda: partial.exists() and any(partial.iterdir()), 120, "the first push sending")
    receiver = next(p for p in psutil.process_iter(["cmdline"]) if "data-receive" in " ".join(p.info["cmdline"] or []))
    receiver.suspend()
    try:
        second = popen_remote(user_repo, sshd.env, "data", "push", "twice")
        second_err = PipeReader(second.stderr)
        wait_until(lambda: "waiting for it" in second_err.text(), 120, "the second push to wait")
    finally:
        receiver.resume()
    assert first.wait(timeout=300) == 0 and second.wait(timeout=300) == 0, first_err.text() + second_err.text()
    # read to the pipes' end: the readers' threads may not have taken the last lines yet (seen under load)
    first_text, second_text = first_err.join().decode(), second_err.join().decode()
    assert "sent 3 file(s)" in first_text, first_text
    assert "up to date" in second_text and "nothing sent" in second_text, second_text


def test_a_new_file_a_live_runs_globs_would_read_counts_as_in_use(tmp_path):
    """A shard or text file added where a live run's globs look changes its data identity on the next restart
    just as a changed file does; a file nothing reads is free to push. data/ as a link is seen through."""
    from enlace.contract import Status
    from enlace.server.datainuse import readers

    root = tmp_path / "remote"
    (tmp_path / "elsewhere" / "corpus").mkdir(parents=True)
    (root / "runs" / "r").mkdir(parents=True)
    (root / "data").symlink_to(tmp_path / "elsewhere")  # the server's data/ is a link to another disk
    (root / "data" / "corpus" / "old.txt").write_text("read now")
    (root / "runs" / "r" / "config.yaml").write_text("data: {kind: bytes, paths: ['data/corpus/**/*.txt']}\n")
    me = os.getpid()
    runs.update(root / "runs" / "r", status=Status.RUNNING, pid=me, pid_start=runs.proc_start(me))
    got = readers(
        root / "data", ["corpus/old.txt", "corpus/new.txt", "corpus/sub/new.txt", "other/x.txt"], root / "runs", root
    )
    assert got == {"corpus/old.txt": ["r"], "corpus/new.txt": ["r"], "corpus/sub/new.txt": ["r"]}, got
    # a trainer starting, its config not yet written: any file may be what it reads; queued, nothing yet (it has
    # nothing to restart); a run of a command of the user's own claims nothing (its restarts check no data)
    (root / "runs" / "r" / "config.yaml").unlink()
    for status, claimed in ((Status.STARTING, ["r"]), (Status.QUEUED, None)):
        runs.update(root / "runs" / "r", status=status)
        got = readers(root / "data", ["corpus/old.txt", "else/y.txt"], root / "runs", root)
        assert got == ({"corpus/old.txt": claimed, "else/y.txt": claimed} if claimed else {}), (status, got)
    runs.update(
        root / "runs" / "r", status=Status.RUNNING, command={"command": ["python", "t.py"], "data": ["data/**"]}
    )
    assert readers(root / "data", ["corpus/old.txt"], root / "runs", root) == {}
