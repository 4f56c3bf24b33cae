"""Runs that tell you when they end (enlace/server/notify.py): a real HTTP endpoint on 127.0.0.1 receives the
POST; a failing one is retried; a dead one never delays the run's end and is said in train.log; a sweep's end
is told once. The run is a real detached run under its supervisor (`enlace start`, as launch starts it)."""

from __future__ import annotations

import json
import os
import threading

import psutil
import pytest
from support.cli import enlace
from support.configs import write_run
from support.remote import wait_until
from support.webhook import Webhook

from enlace.server import notify
from enlace.state import runs

TINY = {"training": {"max_steps": 6, "log_every": 1, "eval_every": 3, "eval_batches": 2}}


@pytest.fixture
def hook():
    made: list[Webhook] = []

    def make(**kw) -> Webhook:
        made.append(Webhook(**kw))
        return made[-1]

    yield make
    for h in made:
        h.close()


def test_post_retries_a_failing_endpoint_and_never_writes_the_secret_path(hook):
    h = hook(answers=(500, 503))
    said: list[str] = []
    doc = {"event": "run_end", "status": "finished", "text": "enlace: r finished"}
    assert notify.post(h.url, doc, said.append, tries=3, timeout=10)
    assert h.tries == 3 and h.received == [doc]
    assert said == [f"notified http://127.0.0.1:{h.server.server_address[1]}/… of the run end (finished): HTTP 200"]
    assert "secret-token" not in " ".join(said)


def test_a_url_whose_port_is_no_number_is_refused_and_never_breaks_a_log_line():
    from enlace.clitypes import shown_url
    from orchestrator.hosts.schema import check_url

    assert shown_url("https://hooks.example:8x/secret") == "https://hooks.example/…"
    with pytest.raises(ValueError, match="its port is not a number"):
        check_url("https://hooks.example:8x/secret")


def test_post_gives_up_on_a_closed_port_and_says_so():
    said: list[str] = []
    assert not notify.post("http://127.0.0.1:9/x", {"event": "run_end", "status": "failed"}, said.append, tries=2)
    assert len(said) == 1 and said[0].startswith("could not notify http://127.0.0.1:9/… of the run end: ")
    assert said[0].endswith("2 tries; the run is not affected")


@pytest.mark.slow
def test_a_run_tells_its_end_once_and_a_dead_endpoint_never_delays_it(project, hook):
    """Two runs: one told by a live endpoint (one POST, status and text right); one whose endpoint accepts and
    never answers: its final status is recorded while the supervisor still waits on the endpoint, and
    train.log says the notification failed after its tries."""
    live, dead = hook(), hook(hang=True)
    for name in ("told", "stuck"):
        write_run(project, name, **TINY)
    for name, url in (("told", live.url), ("stuck", dead.url)):
        args = ["start", name, "--json", "--notify", url, "--host-name", "box", "--", "-m", "enlace", "train", name]
        enlace(project, *args)
    wait_until(lambda: len(live.received) == 1, 300, "the live endpoint told")
    doc = live.received[0]
    assert doc["event"] == "run_end" and doc["run"] == "told" and doc["status"] == "finished" and doc["host"] == "box"
    assert doc["step"] == 6 and doc["metric"]["val_bpb"] is not None
    assert doc["text"].startswith("enlace: told on box finished at step 6/6, val bpb ")
    stuck = project / "runs" / "stuck"
    wait_until(lambda: dead.tries >= 1, 300, "the dead endpoint tried")
    supervisor = psutil.Process(runs.read(stuck)["launcher_pid"])  # still trying: its argv holds no secret
    assert "secret-token" not in " ".join(supervisor.cmdline())
    assert runs.read(stuck)["status"] == "finished"  # recorded before anyone is told, whatever the endpoint does
    assert runs.observe(stuck)["status"] == "finished"
    log = stuck / "train.log"
    wait_until(lambda: "could not notify" in log.read_text(), 120, "the failure said in train.log")
    assert f"of the run end: timed out, {notify.TRIES} tries; the run is not affected" in log.read_text()
    assert "secret-token" not in log.read_text()
    assert len(live.received) == 1  # once


def test_a_sweeps_end_is_told_once_when_its_last_run_here_ends(tmp_path):
    root = tmp_path / "runs"
    me = {"pid": os.getpid(), "pid_start": runs.proc_start(os.getpid())}  # s-b's trainer: this live process
    for name, status in (("s-a", "finished"), ("s-b", "running"), ("other", "finished")):
        (root / name).mkdir(parents=True)
        sweep = {"sweep": "s", "sweep_share": 2} if name != "other" else {}
        (root / name / "run.json").write_text(json.dumps({"status": status, "val_bpb": 2.0, **sweep, **me}))
    assert notify.sweep_end(root, "s", 2, "box") is None  # s-b is still going
    runs.update(root / "s-b", status="finished", val_bpb=1.5)
    assert notify.sweep_end(root, "s", 3, "box") is None  # this host was given three: one has not been seen yet
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(notify.sweep_end(root, "s", 2, "box"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    told = [r for r in results if r]
    assert len(told) == 1
    assert told[0]["best"] == "s-b" and told[0]["runs"] == {"s-a": "finished", "s-b": "finished"}
    assert told[0]["text"] == "enlace: sweep s on box ended: 2/2 finished; best s-b (val bpb 1.5000)"


def test_a_sweeps_end_waits_for_the_run_end_its_last_supervisor_is_telling(tmp_path):
    """Runs stopped together: s-a's supervisor told its end and saw s-b ended, but s-b's supervisor (alive) had
    not told s-b's yet: sweep_end went out between the two run_ends. It now waits for that supervisor, which
    tells it after its own; a supervisor that is gone (stop --kill) holds nothing up."""
    root = tmp_path / "runs"
    supervisor = {"launcher_pid": os.getpid(), "launcher_start": runs.proc_start(os.getpid()), "launch_id": "L2"}
    for name, extra in (("s-a", {"end_told": "L1", "launch_id": "L1"}), ("s-b", supervisor)):
        (root / name).mkdir(parents=True)
        doc = {"status": "stopped", "sweep": "s", "sweep_share": 2, **extra}
        (root / name / "run.json").write_text(json.dumps(doc))
    assert notify.sweep_end(root, "s", 2, "box") is None  # s-b's supervisor is about to tell its end
    runs.update(root / "s-b", end_told="L1")  # an earlier launch's end: not this one's
    assert notify.sweep_end(root, "s", 2, "box") is None
    runs.update(root / "s-b", end_told="L2")
    assert notify.sweep_end(root, "s", 2, "box")["runs"] == {"s-a": "stopped", "s-b": "stopped"}
    (root / ".sweep-s.told").unlink()
    runs.update(root / "s-b", end_told=None, launcher_start=1.0)  # gone: another process's start time
    assert notify.sweep_end(root, "s", 2, "box") is not None


def test_a_sweep_of_a_script_is_told_with_its_val_loss(tmp_path):
    root = tmp_path / "runs"
    for name, loss in (("m-a", 0.5), ("m-b", 0.25)):
        (root / name).mkdir(parents=True)
        doc = {"status": "finished", "val_loss": loss, "sweep": "m", "sweep_share": 2, "step": 3}
        (root / name / "run.json").write_text(json.dumps(doc))
    told = notify.sweep_end(root, "m", 2, "box")
    assert told["best"] == "m-b" and told["metric"] == {"val_loss": 0.25}
    assert told["text"] == "enlace: sweep m on box ended: 2/2 finished; best m-b (val loss 0.2500)"
    assert notify.run_end(root / "m-b", "box")["text"].startswith(
        "enlace: m-b on box finished at step 3, val loss 0.2500"
    )
