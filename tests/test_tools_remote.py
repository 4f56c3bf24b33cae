"""enlace-remote's tools over a real sshd: status --all across hosts (one down), gc, shell, sample, plot."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.remote import env_with_a_dead_host, head, remote, server_dir, tiny_corpus
from support.repocopy import commit_all


@pytest.mark.slow
def test_status_all_shows_every_host_and_a_down_one_as_a_row(sshd, user_repo, tmp_path):
    env = env_with_a_dead_host(sshd, tmp_path)
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, env, "launch", "tiny", "--no-preflight", "--until", "3")
    out = remote(user_repo, env, "status", "--all")
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["HOST", "RUN", "STATUS"], lines
    assert any(line.startswith("testhost") and " tiny " in line for line in lines), out.stdout
    assert any(line.startswith("gone") and "unreachable" in line for line in lines), out.stdout
    assert any(line.startswith("local") and "nothing synced" in line for line in lines), out.stdout
    rows = json.loads(remote(user_repo, env, "status", "--all", "--json").stdout)
    assert {r["host"] for r in rows} == {"local", "testhost", "gone"}


@pytest.mark.slow
def test_gc_keeps_the_live_runs_tree_and_the_newest(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "testhost"))
    trees = server_dir(sshd, "testhost") / "trees"
    remote(user_repo, sshd.env, "launch", "long", "--no-preflight")  # live, on commit A
    commits = [head(user_repo)]
    for i in range(2):  # commits B and C, synced
        (user_repo / f"note-{i}.txt").write_text(str(i))
        commit_all(user_repo, f"note {i}")
        remote(user_repo, sshd.env, "sync")
        commits.append(head(user_repo))
    assert sorted(p.name for p in trees.iterdir()) == sorted(commits)
    dry = remote(user_repo, sshd.env, "gc", "--dry-run")
    assert f"would remove {trees / commits[1]}" in dry.stdout and sorted(p.name for p in trees.iterdir()) == sorted(
        commits
    )
    aside = server_dir(sshd, "testhost") / "runs" / "long" / "checkpoints-set-aside" / "20261207-090000-42"
    (aside / "step-000002").mkdir(parents=True)  # a line an explicit --resume left (as start_line names them)
    (aside / "step-000002" / "model.pt").write_bytes(b"\0" * 3 * 2**20)
    out = remote(user_repo, sshd.env, "gc")
    assert sorted(p.name for p in trees.iterdir()) == sorted([commits[0], commits[2]]), out.stdout + out.stderr
    assert "run long (running)" in out.stderr and "freed" in out.stderr
    assert (server_dir(sshd, "testhost") / "runs" / "long" / "run.json").exists()  # runs/ untouched
    # the set-aside line stays, and is shown with its size (it filled disks unseen: gc said nothing of it)
    assert "kept 1 line(s) an explicit --resume set aside (deleting them all frees 3.0 MiB; gc never" in out.stderr
    assert f"  {aside} (frees 3.0 MiB alone)" in out.stderr
    assert (aside / "step-000002" / "model.pt").stat().st_size == 3 * 2**20
    remote(user_repo, sshd.env, "stop", "long")


@pytest.mark.slow
def test_sample_plot_and_shell_against_the_server(sshd, user_repo):
    tiny_corpus(server_dir(sshd, "testhost"))
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight")
    remote(user_repo, sshd.env, "logs", "-f")
    a = remote(user_repo, sshd.env, "sample", "tiny", "--bytes", "40", "--seed", "5", "--prompt", "import ")
    b = remote(user_repo, sshd.env, "sample", "--bytes", "40", "--seed", "5", "--prompt", "import ")  # last launched
    assert a.stdout == b.stdout and a.stdout.startswith("import ") and "bytes/s on testhost" in a.stderr
    png = remote(user_repo, sshd.env, "plot", "tiny").stdout.strip()
    local = user_repo / "runs" / "tiny"
    assert png == str(local / "curves.png") and (local / "curves.png").stat().st_size > 10_000
    assert not (local / ".partial-fetch").exists()  # no empty staging dir left behind
    assert sorted(p.name for p in local.iterdir() if not p.name.startswith(".")) == [
        "curves.png",
        "metrics.jsonl",
        "run.json",
    ]  # only what plot needs came over
    server_run = server_dir(sshd, "testhost") / "runs" / "tiny"
    assert (local / "metrics.jsonl").read_bytes() == (server_run / "metrics.jsonl").read_bytes()
    out = remote(user_repo, sshd.env, "export", "tiny", "--format", "safetensors")  # on the server, then home
    home = user_repo / "exports" / "tiny-safetensors"
    kept = next((server_run / "exports").glob("safetensors-step-*"))  # in the run's directory: gc keeps it
    assert sorted(p.name for p in home.iterdir()) == sorted(p.name for p in kept.iterdir()), out.stderr
    assert (home / "model.safetensors").read_bytes() == (kept / "model.safetensors").read_bytes()
    assert "verified" in out.stdout and not list(home.parent.glob(".*partial*"))
    again = remote(user_repo, sshd.env, "export", "tiny", "--format", "safetensors", check=False)
    assert again.returncode == 2 and "exists" in again.stderr  # never over what is here
    for host in ("testhost", "local"):
        if host == "local":
            tiny_corpus(server_dir(sshd, "local"))
            remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", "--until", "2", host=host)
        out = remote(user_repo, sshd.env, "shell", "tiny", "--", "pwd", host=host)
        assert f"/trees/{head(user_repo)}" in out.stdout.strip(), out.stdout + out.stderr  # the run's synced tree
        # no RUN: the last launched; after `--` the words are one command line, as ssh joins them
        out = remote(user_repo, sshd.env, "shell", "--", "echo $ENLACE_RUN_DIR;", "enlace runs", host=host)
        first, *rest = out.stdout.splitlines()
        assert first.endswith("/runs/tiny") and any(line.startswith("tiny ") for line in rest), out.stdout


def test_gc_counts_what_deleting_a_set_aside_line_frees(tmp_path):
    """A fault hunt's cases: a symlink there was walked through (`-> /` counted 36 GB, and took 39 s), a plain
    file counted 0, a hard-linked checkpoint (linked in from elsewhere) counted though deleting it frees nothing."""
    from enlace.server.cleanup import plan

    aside = tmp_path / "runs" / "r" / "checkpoints-set-aside"
    (aside / "line" / "step-000002").mkdir(parents=True)
    (aside / "line" / "step-000002" / "model.pt").write_bytes(b"1" * 1000)
    (aside / "line" / "step-000002" / "trainer.pt").write_bytes(b"2" * 300)
    os.link(aside / "line" / "step-000002" / "trainer.pt", tmp_path / "elsewhere.pt")
    (aside / "old-line.tar").write_bytes(b"3" * 500)
    (aside / "oops").symlink_to("/")
    (tmp_path / "trees").mkdir()
    rep = plan(tmp_path, keep=0)
    listed = {Path(e["path"]).name: e["bytes"] for e in rep["set_aside"]}
    assert listed == {"line": 1000, "old-line.tar": 500, "oops": 0}, listed
    assert rep["set_aside_bytes"] == 1500  # trainer.pt's other link is outside: deleting them all frees it not
    # a checkpoint hard-linked into two lines (one went back to the other's step): neither alone frees it, both do
    (aside / "later" / "step-000002").mkdir(parents=True)
    os.link(aside / "line" / "step-000002" / "model.pt", aside / "later" / "step-000002" / "model.pt")
    rep = plan(tmp_path, keep=0)
    listed = {Path(e["path"]).name: e["bytes"] for e in rep["set_aside"]}
    assert listed == {"later": 0, "line": 0, "old-line.tar": 500, "oops": 0}, listed
    assert rep["set_aside_bytes"] == 1500, rep["set_aside_bytes"]  # model.pt's two links counted once
    # a hand's "best" copy linked within one line: deleting that line alone frees it (it read 0 alone)
    (aside / "own" / "best").mkdir(parents=True)
    (aside / "own" / "step.pt").write_bytes(b"4" * 200)
    os.link(aside / "own" / "step.pt", aside / "own" / "best" / "step.pt")
    (tmp_path / "runs" / "alias").symlink_to(tmp_path / "runs" / "r")  # a run dir linked by hand: walked once
    rep = plan(tmp_path, keep=0)
    listed = {Path(e["path"]).name: e["bytes"] for e in rep["set_aside"]}
    assert listed == {"later": 0, "line": 0, "old-line.tar": 500, "oops": 0, "own": 200}, listed
    assert rep["set_aside_bytes"] == 1700, rep["set_aside_bytes"]


def test_gc_plans_around_a_checkout_in_progress(tmp_path):
    """A checkout being made (trees/.tmp-SHA-PID, ready an instant before its rename) is never gc's to remove."""
    from enlace.server.cleanup import plan

    for name in ("a" * 40, f".tmp-{'b' * 40}-123"):
        (tmp_path / "trees" / name).mkdir(parents=True)
        (tmp_path / "trees" / name / ".enlace-ready").touch()
    (tmp_path / "runs").mkdir()
    assert [e["path"] for e in plan(tmp_path, keep=0)["remove"]] == [str(tmp_path / "trees" / ("a" * 40))]


@pytest.mark.slow
def test_generate_on_the_server_shows_progress_stops_with_the_client_and_continues(sshd, user_repo):
    """`enlace-remote generate`: progress and ETA here; killing the client stops the server's generate (its
    text so far kept in OUT.partial); the same command again continues from there and writes the shards."""
    import signal

    import psutil
    from support.remote import PipeReader, popen_remote, wait_until

    rd = server_dir(sshd, "testhost")
    tiny_corpus(rd)
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight")
    remote(user_repo, sshd.env, "logs", "tiny", "-f")
    args = ("generate", "tiny", "--bytes", "16000", "--streams", "2", "--out", "data/gen")
    client = popen_remote(user_repo, sshd.env, *args)
    err = PipeReader(client.stderr)
    wait_until(lambda: err.text().count("generate: ") >= 2, what="two progress lines")
    assert "bytes/s, ETA" in err.text()
    client.send_signal(signal.SIGKILL)
    client.wait(timeout=60)

    def generating() -> bool:
        argvs = (" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
        return any("-m enlace" in a and " generate tiny " in a for a in argvs)  # the server's verb, never pytest

    wait_until(lambda: not generating(), timeout=60, what="the server's generate to end with its client")
    kept = sum(f.stat().st_size for f in (rd / "data" / "gen.partial").glob("stream-*.bin"))
    assert kept > 0 and not (rd / "data" / "gen").exists()
    out = remote(user_repo, sshd.env, *args)
    assert "continuing an interrupted generate" in out.stderr and "train + " in out.stdout
    assert (rd / "data" / "gen").is_dir() and not (rd / "data" / "gen.partial").exists()


def test_gc_removes_a_remote_dirs_venv_link_never_the_shared_venv(tmp_path):
    """venvs/<key> is a link into the account's shared cache (other remote_dirs use it too): gc drops the link."""
    from enlace.server.cleanup import collect

    shared = tmp_path / "cache" / "enlace" / "venvs" / "0123456789abcdef-cpu"
    (shared / "bin").mkdir(parents=True)
    (shared / "bin" / "python").write_text("")
    rd = tmp_path / "rd"
    (rd / "venvs").mkdir(parents=True)
    (rd / "runs").mkdir()
    (rd / "trees").mkdir()
    (rd / "venvs" / "0123456789abcdef").symlink_to(shared)
    report = collect(rd, keep=1, dry_run=False)
    assert report["remove"] == [{"path": str(rd / "venvs" / "0123456789abcdef"), "bytes": 0}]
    assert not (rd / "venvs" / "0123456789abcdef").exists() and (shared / "bin" / "python").is_file()
