"""The queue through enlace-remote over the real sshd: real launches from two clones, real supervisors and
trainers (and scripts of the user's own, where what runs is nothing to the queue), real locks. Only the GPUs
are faked (a GPU cannot exist here): the test server's PATH starts with a fake nvidia-smi that reports them
from a file this test writes (tests/support/fakegpu.py); the runs say `runtime.device: auto` (a script's run
file `device: auto`), so they queue for a GPU there and run on the CPU."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from support.configs import write_toy
from support.fakegpu import FakeGpus
from support.procs import Throttle, kill_processes_under, trainers_under
from support.remote import PipeReader, head, popen_remote, remote, tiny_corpus, wait_until
from support.repocopy import commit_all
from support.sshd import make_server

from enlace.state import runs

pytestmark = pytest.mark.slow
LONG = ("long", "--no-preflight", "--restarts", "0")
WAIT_FOR_FILE = "import os, sys, time; [time.sleep(0.05) for _ in iter(lambda: os.path.exists(sys.argv[1]), True)]"


@pytest.fixture
def gpu_host(tmp_path: Path):
    gpus = FakeGpus(tmp_path, 2)
    srv = make_server(tmp_path, session_env={"PATH": gpus.path})
    tiny_corpus(tmp_path / "remote-testhost")
    with Throttle(lambda: trainers_under(tmp_path, past_cpu_s=3)):  # once training, a run need only be running
        yield srv, gpus
    srv.stop()
    kill_processes_under(tmp_path)


def rows(repo: Path, env: dict) -> dict[str, dict]:
    return {r["run_name"]: r for r in json.loads(remote(repo, env, "status", "--json").stdout)}


def visible_devices(row: dict) -> str | None:
    """CUDA_VISIBLE_DEVICES as the run's trainer process sees it."""
    return psutil.Process(row["pid"]).environ().get("CUDA_VISIBLE_DEVICES")


def test_four_runs_on_two_gpus_queue_and_take_freed_gpus(gpu_host, user_repo, tmp_path):
    """Four runs of a script of the user's own held until stopped (tests/support/configs.py), each asking for a
    GPU: what a run runs is nothing to the queue, and a trainer's start would only cost the machine a second."""
    srv, gpus = gpu_host
    env = srv.env
    write_toy(user_repo, device="auto")
    clone = tmp_path / "clone-b"
    subprocess.run(["git", "clone", "-q", str(user_repo), str(clone)], check=True)
    remote(user_repo, env, "sync")  # the server has the commit before the four launches race
    refused = remote(user_repo, env, "launch", *LONG, "--gpus", "4", "--set", "runtime.device=auto", check=False)
    assert refused.returncode == 3, refused.stderr
    assert "the run needs 4 GPUs and this server has 2 GPUs — ask for fewer (--gpus)" in refused.stderr
    assert "Traceback" not in refused.stderr
    names = ["q1", "q2", "q3", "q4"]
    launches = [
        popen_remote(repo, env, "launch", "toy", "--set", f"run_name={n}", "--set", "args.hold=1")
        for n, repo in zip(names, (user_repo, clone, user_repo, clone))
    ]
    said = [PipeReader(p.stderr) for p in launches]
    for p in launches:
        assert p.wait(timeout=300) == 0
    state = rows(user_repo, env)
    running = sorted((n for n in names if state[n]["status"] == "running"), key=lambda n: state[n]["gpus"])
    queued = [n for n in names if state[n]["status"] == "queued"]
    assert len(running) == 2 and len(queued) == 2, {n: state[n]["status"] for n in names}
    assert [state[n]["gpus"] for n in running] == [[0], [1]]
    assert [visible_devices(state[n]) for n in running] == ["0", "1"]  # each run's process sees only its own GPU
    busy = remote(user_repo, env, "preflight", "long", "--set", "runtime.device=auto", check=False)
    assert busy.returncode == 1 and "1 GPU not free now (GPU 0: run " in busy.stderr, busy.stderr
    assert "try again once it is free" in busy.stderr and "Traceback" not in busy.stderr
    # a waiter says its place at its next look (every 2 s): one may still say what it saw before the seats went
    settled = lambda: sorted(rows(user_repo, env)[n]["phase"][:10] for n in queued) == ["position 1", "position 2"]
    wait_until(settled, 60, "the two waiters to say their places once the seats were taken")
    state = rows(user_repo, env)
    first, second = sorted(queued, key=lambda n: state[n]["phase"])  # position 1 before position 2
    assert state[first]["phase"].startswith("position 1, waiting for 1 GPU (GPU 0: run ")
    assert "position 2" in state[second]["phase"] and f"behind {first}" in state[second]["phase"]
    assert f"{first}: queued on testhost: position " in said[names.index(first)].text()
    follow = popen_remote(user_repo, env, "logs", first, "-f")
    followed = PipeReader(follow.stdout)

    # the run on GPU 0 stops; another user's process takes GPU 0 meanwhile: it stays out until it goes
    gpus.foreign(gpu=0, pid=3999991, mib=30000)
    cache = srv.dir / "home" / ".enlace" / "queue"  # the queue asks nvidia-smi at most every 5 s: ask it now
    for old in cache.glob("*/inventory.json"):
        old.unlink()
    wait_until(lambda: any("3999991" in f.read_text() for f in cache.glob("*/inventory.json")), 60, "a new look")
    remote(user_repo, env, "stop", running[0])
    wait_until(lambda: "pid 3999991, 29.3 GiB" in rows(user_repo, env)[first]["phase"], 60, "status names it")
    assert rows(user_repo, env)[first]["status"] == "queued"
    table = remote(user_repo, env, "status").stdout
    assert (
        f"queued: position 1, waiting for 1 GPU (GPU 0: a process, pid 3999991, 29.3 GiB; GPU 1: run {running[1]})"
        in table
    )
    gpus.clear()
    wait_until(lambda: rows(user_repo, env)[first]["status"] == "running", 120, f"{first} to start on GPU 0")
    now = rows(user_repo, env)
    assert now[first]["gpus"] == [0] and visible_devices(now[first]) == "0"
    assert "running on GPU 0" in remote(user_repo, env, "status").stdout
    wait_until(lambda: "its turn came: starting on GPU 0" in followed.text(), 60, "logs -f to show the start")

    # stop of a queued run removes it, and touches nothing else
    remote(user_repo, env, "stop", second)
    now = rows(user_repo, env)
    assert now[second]["status"] == "stopped" and now[second]["phase"].startswith("stopped while queued")
    assert now[first]["status"] == now[running[1]]["status"] == "running"
    assert not list((srv.dir / "home" / ".enlace" / "queue").glob("*/tickets/*.json"))
    remote(user_repo, env, "stop", first)
    assert follow.wait(timeout=120) == 0  # logs -f followed it from the queue to its stop


def test_a_cpu_host_with_two_slots_queues_the_third_run_and_a_lost_waiter_is_said(sshd, user_repo):
    """cpu_slots: 2 in hosts.yaml: a third CPU run queues. Its waiter killed (a reboot would do the same), status
    says `dropped` with what to do; launch queues it again."""
    hosts = Path(sshd.env["ENLACE_HOSTS_FILE"])
    hosts.write_text(
        hosts.read_text().replace("    default_run: tiny\n", "    default_run: tiny\n    cpu_slots: 2\n", 1)
    )
    assert "queue: 2 CPU runs" in remote(user_repo, sshd.env, "hosts").stdout
    tiny_corpus(sshd.dir.parent / "remote-testhost")
    with Throttle(lambda: trainers_under(sshd.dir.parent, past_cpu_s=3)):  # once training, only running
        _two_slots_and_a_third(sshd, user_repo)


def _two_slots_and_a_third(sshd, user_repo) -> None:
    # c1's preflight holds a CPU slot while it measures (`enlace seated`); c3's finds none free and is skipped
    first = remote(user_repo, sshd.env, "launch", "long", "--restarts", "0", "--set", "run_name=c1", "--no-wait")
    assert "verdict" in first.stdout + first.stderr and "preflight skipped" not in first.stderr
    remote(user_repo, sshd.env, "launch", *LONG, "--set", "run_name=c2", "--no-wait")
    (user_repo / "NOTES.md").write_text("a newer commit for c3\n")
    commit_all(user_repo, "a newer commit: c3 waits to start in its tree")
    third = remote(user_repo, sshd.env, "launch", "long", "--restarts", "0", "--set", "run_name=c3", "--no-wait")
    assert "preflight skipped: on testhost: 1 CPU slot not free now (CPU slot 0: run c" in third.stderr
    # the command it gives measures this run, as launched (it named the run file alone: another run's figures)
    assert "`enlace-remote --host testhost preflight long --set run_name=c3` measures it" in third.stderr, third.stderr
    wait_until(lambda: rows(user_repo, sshd.env)["c3"]["status"] == "queued", 120, "c3 queued")
    state = rows(user_repo, sshd.env)
    assert {state["c1"]["status"], state["c2"]["status"]} <= {"starting", "running"}
    assert state["c3"]["need"] == "cpu:1" and "waiting for 1 CPU slot" in state["c3"]["phase"]
    c3_tree = head(user_repo)
    (user_repo / "NOTES.md").write_text("newer still\n")
    commit_all(user_repo, "the newest commit, synced: c3's tree is neither the newest nor a running run's")
    remote(user_repo, sshd.env, "sync")
    gc = remote(user_repo, sshd.env, "gc", "--keep", "1", "--dry-run").stdout
    assert state["c3"]["commit"] == c3_tree and c3_tree not in gc, gc  # the queued run's tree stays
    run_dir = sshd.dir.parent / "remote-testhost" / "runs" / "c3"
    os.kill(runs.read(run_dir)["launcher_pid"], signal.SIGKILL)  # the waiter, as a reboot takes it
    wait_until(lambda: rows(user_repo, sshd.env)["c3"]["status"] == "dropped", 60, "c3 dropped")
    fetched = remote(user_repo, sshd.env, "fetch", "c3", check=False)  # (it said: wait for a checkpoint)
    assert fetched.returncode == 2 and "c3 has not started (dropped): nothing to fetch yet" in fetched.stderr
    assert "launch c3` queues it again" in fetched.stderr, fetched.stderr
    sampled = remote(user_repo, sshd.env, "sample", "c3", check=False)  # (it said to fetch it)
    assert sampled.returncode == 2 and "c3 has not started (dropped): no checkpoint yet" in sampled.stderr, (
        sampled.stderr
    )
    assert "launch c3` queues it again" in sampled.stderr and "fetch" not in sampled.stderr, sampled.stderr
    table = remote(user_repo, sshd.env, "status").stdout
    assert "was queued; its waiter is gone (a reboot, a kill): enlace-remote --host testhost launch c3" in table
    out = remote(user_repo, sshd.env, "launch", *LONG, "--set", "run_name=c3")
    assert "c3: queued on testhost: position 1, waiting for 1 CPU slot" in out.stderr
    for name in ("c3", "c1", "c2"):  # c3 first: still queued (it would take a slot c1 frees)
        remote(user_repo, sshd.env, "stop", name)
    fetched = remote(user_repo, sshd.env, "fetch", "c3", check=False)  # (it was told to wait for a checkpoint)
    assert fetched.returncode == 2 and "c3 on testhost ended (stopped) with no complete checkpoint" in fetched.stderr


def test_runs_leave_the_queue_in_the_order_their_launches_came_over_ten_launches_from_two_clones(
    sshd, user_repo, tmp_path
):
    """Ten launches at random moments, two clones launching at once, on a host with one CPU slot: each launch
    takes its place when `enlace start` runs (not when its supervisor gets going), and the runs leave the
    queue in exactly that order. The runs are commands of their own that wait for a file the test makes once all
    ten have their place, so nine wait together: a run's command is nothing to the queue, and ten trainers would
    spend ≈20 CPU-s importing torch for it."""
    gate = tmp_path / "gate"
    hold = ("python", "-c", WAIT_FOR_FILE, str(gate))
    clone = tmp_path / "clone-b"
    subprocess.run(["git", "clone", "-q", str(user_repo), str(clone)], check=True)
    remote(user_repo, sshd.env, "sync")
    streams = {user_repo: [f"a{i}" for i in range(5)], clone: [f"b{i}" for i in range(5)]}

    def launches(repo: Path, names: list[str], seed: int) -> None:
        rng = random.Random(seed)
        for name in names:
            time.sleep(rng.uniform(0, 0.4))  # a random moment: the order is what is checked, not a time
            args = ("launch", "--name", name, "--no-wait", "--restarts", "0", "--", *hold)
            proc = popen_remote(repo, sshd.env, *args)
            assert proc.wait(timeout=300) == 0, proc.stderr.read()

    threads = [threading.Thread(target=launches, args=(r, n, i)) for i, (r, n) in enumerate(streams.items())]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = [n for ns in streams.values() for n in ns]
    run_dir = lambda n: sshd.dir.parent / "remote-testhost" / "runs" / n
    statuses = lambda: sorted(runs.read(run_dir(n)).get("status") for n in names)
    wait_until(lambda: statuses() == ["queued"] * 9 + ["running"], 120, "one run on the slot, nine queued")
    gate.touch()
    wait_until(lambda: statuses() == ["finished"] * 10, 300, "all ten ran")
    state = {n: runs.read(run_dir(n)) for n in names}
    by_ticket = sorted(names, key=lambda n: state[n]["ticket"])
    assert sorted(names, key=lambda n: state[n]["seated_at"]) == by_ticket
    assert {n[0] for n in by_ticket[:5]} == {"a", "b"}  # the two clones' launches did interleave
