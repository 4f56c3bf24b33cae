"""The server's queue (enlace/server/queue.py) with real processes taking real locks: each waiter is its own
process, as each queued run's supervisor is. Only the GPUs are not real (a GPU cannot exist on this
machine): a fake nvidia-smi on PATH reports them (tests/support/fakegpu.py). The queue seen through launch,
status and stop over the real sshd is tests/test_queue_remote.py."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO
from support.fakegpu import FakeGpus
from support.remote import wait_until

from enlace.server import needs, queue

WAITER = Path(__file__).parent / "support" / "waiter.py"


class Queue:
    """A queue directory and the waiters started on it."""

    def __init__(self, base: Path, gpus: FakeGpus | None = None, cpu_slots: int = 1):
        self.base, self.dir, self.cpu_slots = base, base / "queue", cpu_slots
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": gpus.path if gpus else os.environ["PATH"]}
        self.procs: dict[str, subprocess.Popen] = {}

    def wait(self, run: str, need: str, clone: str = "clone-a", child: bool = False) -> subprocess.Popen:
        run_dir = self.base / clone / "runs" / run
        argv = [sys.executable, str(WAITER), str(self.dir), str(run_dir), need, str(self.cpu_slots)]
        self.procs[run] = subprocess.Popen([*argv, *(["--child"] if child else [])], env=self.env)
        return self.procs[run]

    def tickets(self) -> int:
        return len(list((self.dir / "tickets").glob("*.json")))

    def seated(self) -> list[str]:
        order = self.base / "order"
        return order.read_text().split("\n")[:-1] if order.exists() else []

    def release(self, run: str) -> None:
        (self.base / f"release-{run}").touch()
        self.procs[run].wait(timeout=60)

    def waits(self, run: str, clone: str = "clone-a") -> str:
        path = self.base / clone / "runs" / run / "waits"
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def make_queue(tmp_path: Path):
    made = []

    def make(**kw) -> Queue:
        made.append(Queue(tmp_path, **kw))
        return made[-1]

    yield make
    for q in made:
        q.close()


def test_first_come_first_served_over_ten_waiters_from_two_clones(make_queue):
    """Ten runs queue at random moments from two clones (two remote_dirs of one account) for one CPU slot:
    they get it in the order they queued, one at a time."""
    q = make_queue()
    rng = random.Random(7)
    names = [f"run{i}" for i in range(10)]
    q.wait(names[0], "cpu:1")
    wait_until(lambda: q.seated() == [f"{names[0]} -"], 60, "the first run seated")
    for i, name in enumerate(names[1:], start=1):
        time.sleep(rng.uniform(0, 0.3))  # a random moment (the order is what the test asserts, not a timing)
        q.wait(name, "cpu:1", clone=("clone-a", "clone-b")[i % 2])
        wait_until(lambda i=i: q.tickets() == i, 60, f"{name}'s ticket")  # queued before the next one comes
    for i, name in enumerate(names[:-1]):
        q.release(name)
        wait_until(lambda i=i: len(q.seated()) == i + 2, 60, "the next run seated")
        assert q.tickets() == len(names) - i - 2  # the seated run's ticket is gone
    assert q.seated() == [f"{n} -" for n in names]
    # one queue per account: a run of the other clone's remote_dir is named with its directory (status there
    # lists it, not here)
    other = f"(of {q.base / 'clone-a'})"
    said = (
        f"position 9, waiting for 1 CPU slot (CPU slot 0: run run0 {other}; behind run1, run2 {other}, run3 and others)"
    )
    assert said in q.waits("run9", "clone-b"), q.waits("run9", "clone-b")


def test_a_two_gpu_run_is_not_starved_by_one_gpu_runs(tmp_path, make_queue):
    """3 GPUs, two 1-GPU runs hold two of them; a 2-GPU run queues, then a stream of 1-GPU runs: none of
    them takes the free GPU ahead of it (strict first come, first served), and it starts as soon as a
    second GPU is free — no 1-GPU run that queued after it started before it."""
    q = make_queue(gpus=FakeGpus(tmp_path, 3))
    for run in ("a", "b"):
        q.wait(run, "gpu:1")
        wait_until(lambda run=run: any(s.startswith(run) for s in q.seated()), 60, f"{run} seated")
    q.wait("big", "gpu:2")
    wait_until(lambda: "waiting for 2 GPUs" in q.waits("big"), 60, "big queued")
    for n, run in enumerate(("s1", "s2", "s3"), start=2):
        q.wait(run, "gpu:1")
        wait_until(lambda n=n: q.tickets() == n, 60, f"{run} queued")
    wait_until(lambda: "behind big" in q.waits("s3"), 60, "s3 waits behind big")
    assert [s.split()[0] for s in q.seated()] == ["a", "b"]  # GPU 2 is free, and nobody took it past big
    q.release("a")
    wait_until(lambda: len(q.seated()) == 3, 60, "big seated")
    assert q.seated()[2].split()[0] == "big"
    held = {q.seated()[1].split()[1], *q.seated()[2].split()[1].split(",")}
    assert held == {"0", "1", "2"}  # big took the two GPUs b does not hold
    q.release("b")
    wait_until(lambda: len(q.seated()) == 4, 60, "s1 seated")
    assert q.seated()[3].split()[0] == "s1"


def test_two_gpu_runs_on_three_gpus_do_not_deadlock(tmp_path, make_queue):
    """Each claim is all or nothing: two 2-GPU runs on 3 GPUs run one after the other."""
    q = make_queue(gpus=FakeGpus(tmp_path, 3))
    q.wait("x", "gpu:2")
    q.wait("y", "gpu:2")
    wait_until(lambda: len(q.seated()) == 1, 60, "one of them seated")
    first = q.seated()[0].split()[0]
    other = "y" if first == "x" else "x"
    wait_until(lambda: "waiting for 2 GPUs" in q.waits(other), 60, "the other queued")
    q.release(first)
    wait_until(lambda: len(q.seated()) == 2, 60, "the other seated")


def test_a_killed_holder_frees_its_gpu_once_its_child_is_gone_too(tmp_path, make_queue):
    """The seat's locks are held by the supervisor and the trainer it hands them to: SIGKILL of the supervisor
    alone leaves the GPU held (its trainer still computes on it); once the trainer is gone as well, the next
    run in line gets it — the kernel released the locks, nobody cleaned up."""
    q = make_queue(gpus=FakeGpus(tmp_path, 1))
    holder = q.wait("holder", "gpu:1", child=True)
    child_pid = tmp_path / "clone-a" / "runs" / "holder" / "child.pid"
    wait_until(child_pid.exists, 60, "the holder's child started")
    q.wait("next", "gpu:1")
    wait_until(lambda: "GPU 0: run holder" in q.waits("next"), 60, "next queued behind holder")
    holder.kill()
    holder.wait()
    time.sleep(2 * queue.POLL_S)  # two turns of the waiter: the only way to see that nothing happens
    assert len(q.seated()) == 1
    os.kill(int(child_pid.read_text()), signal.SIGKILL)
    wait_until(lambda: len(q.seated()) == 2, 60, "next seated after the child died")
    assert q.seated()[1] == "next 0"


def test_a_dead_waiters_ticket_is_dropped(make_queue):
    q = make_queue()
    q.wait("first", "cpu:1")
    wait_until(lambda: len(q.seated()) == 1, 60, "first seated")
    gone = q.wait("gone", "cpu:1")
    wait_until(lambda: q.tickets() == 1, 60, "gone queued")
    q.wait("third", "cpu:1")
    wait_until(lambda: "position 2" in q.waits("third"), 60, "third behind gone")
    gone.kill()
    gone.wait()
    wait_until(lambda: "position 1" in q.waits("third"), 60, "third moved up")
    assert q.tickets() == 1
    q.release("first")
    wait_until(lambda: len(q.seated()) == 2, 60, "third seated")
    assert q.seated()[1] == "third -"


def test_cpu_slots_raised_by_a_later_launch_seat_a_run_already_waiting(make_queue):
    """hosts.yaml's cpu_slots raised from 1 to 2 while a run waited: the waiter kept its own launch's 1, and the
    new slot stayed idle while it (and the launch behind it) waited. The latest launch's number is the queue's;
    a waiter (a restart's wait too) never sets it back."""
    q = make_queue()  # each waiter launched with cpu_slots 1
    q.wait("first", "cpu:1")
    wait_until(lambda: len(q.seated()) == 1, 60, "first seated")
    q.wait("second", "cpu:1")
    wait_until(lambda: "position 1" in q.waits("second"), 60, "second waiting behind first's slot")
    queue.note_slots(needs.Settings(2, 0.1, q.dir))  # `enlace start` of a launch whose host entry says 2
    wait_until(lambda: len(q.seated()) == 2, 60, "second seated on the added slot")
    q.wait("third", "cpu:1")  # launched with 1 again, and waits: it does not take the number back
    wait_until(lambda: "position 1" in q.waits("third"), 60, "third waiting")
    assert (q.dir / "cpu_slots").read_text() == "2\n" and len(q.seated()) == 2
    q.release("first")
    wait_until(lambda: len(q.seated()) == 3, 60, "third seated")


def test_another_users_process_keeps_a_gpu_out_until_it_goes(tmp_path, make_queue):
    """GPU 1 holds another user's 21.3 GiB process (over 10% of its memory): a run takes GPU 0; the next waits,
    naming the process; when it ends, the waiter gets GPU 1. A process under the threshold does not count."""
    gpus = FakeGpus(tmp_path, 2)
    gpus.foreign(gpu=1, pid=3999991, mib=21811)
    gpus.foreign(gpu=0, pid=3999992, mib=600)  # a notebook's context: under 10% of 80 GiB
    q = make_queue(gpus=gpus)
    q.wait("a", "gpu:1")
    wait_until(lambda: len(q.seated()) == 1, 60, "a seated")
    assert q.seated() == ["a 0"]
    q.wait("b", "gpu:1")
    wait_until(lambda: "GPU 1: a process, pid 3999991, 21.3 GiB" in q.waits("b"), 60, "b names the foreign process")
    assert "GPU 0: run a" in q.waits("b")
    gpus.clear()
    wait_until(lambda: len(q.seated()) == 2, 60, "b seated once the process has gone")
    assert q.seated()[1] == "b 1"


def test_a_need_the_server_cannot_meet_is_refused(tmp_path, monkeypatch):
    gpus = FakeGpus(tmp_path, 2)
    monkeypatch.setenv("PATH", gpus.path)
    settings = needs.Settings(2, 0.1, tmp_path / "q")
    assert needs.need_for("auto", None, settings) == needs.Need("gpu", 1)
    assert needs.need_for("cpu", None, settings) == needs.Need("cpu", 1)
    assert needs.need_for("cuda", "all", settings) == needs.Need("gpu", None)
    with pytest.raises(needs.QueueError, match="needs 4 GPUs and this server has 2 GPUs"):
        needs.need_for("cuda", "4", settings)
    assert needs.need_for("cpu", "3", settings) == needs.Need("cpu", 1)  # torchrun on the CPU: still one run
    monkeypatch.setenv("PATH", "/nonexistent")  # a server without nvidia-smi
    empty = needs.Settings(1, 0.1, tmp_path / "q2")
    assert needs.need_for("auto", None, empty) == needs.Need("cpu", 1)
    with pytest.raises(needs.QueueError, match=r"needs a GPU .* reports none") as refused:
        needs.need_for("cuda", None, empty)
    # the fix given runs at a CPU's pace: fp32 too (device=cpu alone kept the GPU config's fp16, ≈20x slower)
    assert "--set runtime.device=cpu --set runtime.precision=fp32" in str(refused.value), refused.value
    for device in ("auto", "cpu"):  # torchrun's "gpu" count on a CPU run crashed it at every restart
        with pytest.raises(
            needs.QueueError, match=r"--gpus all starts one process per GPU, and this run is on the CPU"
        ):
            needs.need_for(device, "all", empty)


def test_a_broken_nvidia_smi_refuses_gpu_runs_clearly_and_never_cpu_runs(tmp_path, monkeypatch):
    broken = tmp_path / "broken-bin"
    broken.mkdir()
    (broken / "nvidia-smi").write_text(
        "#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch' >&2\nexit 18\n"
    )
    (broken / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{broken}:{os.environ['PATH']}")
    settings = needs.Settings(1, 0.1, tmp_path / "q")
    assert needs.need_for("cpu", None, settings) == needs.Need("cpu", 1)
    with pytest.raises(
        needs.QueueError, match=r"cannot tell which GPUs are free: nvidia-smi failed .exit 18.: Failed to"
    ):
        needs.need_for("auto", None, settings)


def test_a_ticket_is_never_numbered_behind_one_that_exists(tmp_path):
    """The counter file emptied (a full disk, a kill mid-write): the next ticket still comes after the newest."""
    qdir = tmp_path / "q"
    (qdir / "tickets").mkdir(parents=True)
    (qdir / "tickets" / f"{41:012d}.json").write_text("{}")
    (qdir / "seq").write_text("")
    ticket = queue._enqueue(qdir, tmp_path / "runs" / "r", needs.Need("cpu", 1))
    try:
        assert ticket.path.name == f"{42:012d}.json" and (qdir / "seq").read_text() == "42\n"
    finally:
        ticket.close()


def test_need_text_round_trips_and_rejects_nonsense():
    for text in ("gpu:1", "gpu:all", "cpu:2"):
        assert str(needs.Need.parse(text)) == text
    for bad in ("gpu:0", "tpu:1", "gpu:-1", "cpu"):
        with pytest.raises(ValueError):
            needs.Need.parse(bad)
    assert needs.Need("gpu", None).describe() == "every GPU"
    assert needs.Need("cpu", 2).describe() == "2 CPU slots"


def test_seat_env_names_its_gpus_in_pci_order():
    assert queue.Seat([], [2, 3]).env() == {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert queue.Seat([], []).env() == {}


def test_the_queue_names_a_run_as_the_asking_run_finds_it(tmp_path):
    """The asker's own slot (a run re-attached holds it: preflight was "skipped" for the run's own name), a
    run of the same remote_dir reached through a tree's runs/ link, and another remote_dir's run."""
    mine, other = tmp_path / "rd" / "runs", tmp_path / "rd2" / "runs"
    mine.mkdir(parents=True)
    tree = tmp_path / "rd" / "trees" / "abc"
    tree.mkdir(parents=True)
    (tree / "runs").symlink_to(mine)  # as remote.sh links every tree's runs/
    here = str(tree / "runs" / "a")
    assert queue._who({"run": "a", "run_dir": str(mine / "a")}, here) == "a (this run)"
    assert queue._who({"run": "b", "run_dir": str(mine / "b")}, here) == "b"
    assert queue._who({"run": "c", "run_dir": str(other / "c")}, here) == f"c (of {tmp_path / 'rd2'})"
    assert queue._who({"run": "p (its preflight)", "run_dir": ""}, here) == "p (its preflight)"


def test_a_stop_of_a_run_queued_again_says_it_never_started_and_keeps_its_checkpoint():
    """A finished run launched again waits in the queue; stopped there, its step is this launch's 0: the words are
    its phase, with the checkpoint its earlier launch left (they said "stopped at step 0")."""
    from orchestrator.commands.common import not_running_words, stop_words

    rep = {"status": "stopped", "killed": False, "step": 0, "latest_checkpoint": "step-000080"}
    rep["phase"] = "stopped while queued: it never started"
    said = "stopped (stopped while queued: it never started); latest checkpoint step-000080"
    assert stop_words(rep) == said
    trained = {**rep, "step": 80, "phase": "stopped: checkpoint saved"}
    assert stop_words(trained) == "stopped at step 80; latest checkpoint step-000080"
    said = "stopped (stopped while queued: it never started)"
    assert not_running_words(rep) == f"{said}; latest checkpoint step-000080"
    assert not_running_words({**rep, "latest_checkpoint": None}) == said
    dropped = {**rep, "status": "dropped", "latest_checkpoint": None, "phase": "position 1, waiting for 1 CPU slot"}
    assert not_running_words(dropped) == "dropped (was queued; its waiter is gone)"  # not its queue's stale words
