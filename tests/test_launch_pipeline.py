"""`enlace-remote launch` as one pipeline (orchestrator/launch/pipeline.py): the stages a plan runs, in order,
and the plans the command line builds for a plain host and a Slurm host, handed to the same `run`. (The
pipeline's stages against real hosts: test_remote_run.py, test_slurm.py, test_remote_multihost.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from enlace.errors import EnlaceError
from orchestrator.cli import main
from orchestrator.launch import pipeline
from orchestrator.launch.pipeline import Plan, SlurmBackend, SSHBackend, backend_for, stages_for


def test_the_stages_a_plan_runs_in_order():
    plan = Plan(run_file="tiny", targets=["h"], train_args=[])
    assert stages_for(plan) == ["ship", "decide", "preflight", "start", "wait"]
    plan.preflight = False
    assert stages_for(plan) == ["ship", "decide", "start", "wait"]
    plan.follow = True
    assert stages_for(plan) == ["ship", "decide", "start", "wait", "follow"]
    plan.wait = False  # --no-wait: nothing to follow either
    assert stages_for(plan) == ["ship", "decide", "start"]


def test_a_stage_that_says_stop_ends_the_launch(monkeypatch):
    ran = []
    fake = {name: (lambda n: lambda launch: ran.append(n))(name) for name in pipeline.STAGES}
    fake["decide"] = lambda launch: ran.append("decide") or pipeline.STOP  # e.g. the run has finished
    monkeypatch.setattr(pipeline, "STAGES", fake)
    pipeline.run(Plan(run_file="tiny", targets=["h"], train_args=[]), session_for=None, repo=None)
    assert ran == ["ship", "decide"]


def test_data_its_checkpoint_was_not_trained_on_is_refused_only_where_the_run_would_train(monkeypatch):
    """verify says how the data differs from the newest checkpoint's; decide refuses it only when the run would
    train (it was refused at verify: a finished run's launch said 'data differs', not 'finished')."""
    from types import SimpleNamespace

    from orchestrator.errors import UsageError

    host = SimpleNamespace(name="gpu")
    plan = Plan(run_file="tiny", targets=[host], train_args=[])
    launch = pipeline.Launch(
        plan, lambda h: None, None, SSHBackend(), run_name="tiny", resume_refused="the data differs"
    )
    for worth, then in ((False, pipeline.STOP), (True, UsageError)):
        monkeypatch.setattr(pipeline.stages, "worth_launching", lambda *a, worth=worth: worth)
        if then is pipeline.STOP:
            assert pipeline._decide(launch) is pipeline.STOP  # "finished: nothing to train", exit 0
        else:
            with pytest.raises(UsageError, match="tiny on gpu: the data differs"):
                pipeline._decide(launch)


def test_a_cuda_run_on_a_slurm_host_asking_for_no_gpu_is_refused_before_it_queues(monkeypatch):
    """Its job queued, started on a node without a GPU and failed there; a plain host refuses it at verify."""
    from types import SimpleNamespace

    from enlace.slurm.settings import SlurmSpec
    from orchestrator.errors import VerifyError

    monkeypatch.setattr(pipeline.stages, "worth_launching", lambda *a: True)
    host = SimpleNamespace(name="hpc")
    for spec, device, refused in (
        (SlurmSpec(partition="cpu"), "cuda", True),
        (SlurmSpec(partition="gpu", gpus_per_node=4), "cuda", False),
        (SlurmSpec(extra_sbatch=("--gres=gpu:a100:1",)), "cuda", False),
        (SlurmSpec(extra_sbatch=("-G 1",)), "cuda", False),
        (SlurmSpec(extra_sbatch=("--gres=tmpdisk:10",)), "cuda", True),
        (SlurmSpec(partition="cpu"), "cpu", False),
    ):
        plan = Plan(run_file="smoke-2060", targets=[host], train_args=[], slurm=spec)
        launch = pipeline.Launch(plan, lambda h: None, None, pipeline.SlurmBackend(), run_name="big", device=device)
        if refused:
            with pytest.raises(
                VerifyError, match=r"big: runtime\.device is cuda, but the Slurm host hpc asks its jobs"
            ):
                pipeline._decide(launch)
        else:
            assert pipeline._decide(launch) is None


def test_ctrl_c_says_whether_the_run_was_started(monkeypatch, capsys):
    """Ctrl-C in a launch said `interrupted` alone, though the run it had started went on (a relaunch: exit 7)."""
    from types import SimpleNamespace

    def interrupt(launch):
        raise KeyboardInterrupt

    def started(launch):
        launch.started, launch.run_name = {"pid": 1}, "walk-b"

    plan = Plan(run_file="tiny", targets=[SimpleNamespace(name="gpu")], train_args=[])
    for where, said in (
        ("ship", "nothing was started (ship was under way)"),
        ("wait", "walk-b was started on gpu and goes on: `enlace-remote --host gpu logs walk-b -f` follows it"),
    ):
        fake = {name: (lambda launch: None) for name in pipeline.STAGES}
        fake["start"], fake[where] = started, interrupt
        monkeypatch.setattr(pipeline, "STAGES", fake)
        with pytest.raises(KeyboardInterrupt):
            pipeline.run(plan, session_for=None, repo=None)
        assert said in capsys.readouterr().err

    def half_started(launch):  # --hosts a,b,c: a started, then the Ctrl-C came while b's start was under way
        launch.run_name = "walk-c"
        launch.remembered.append(("a", None))
        raise KeyboardInterrupt

    three = Plan(run_file="tiny", targets=[SimpleNamespace(name=h) for h in "abc"], train_args=[])
    monkeypatch.setattr(pipeline, "STAGES", {**fake, "start": half_started})
    with pytest.raises(KeyboardInterrupt):
        pipeline.run(three, session_for=None, repo=None)
    said = "walk-c was started on a and may have started on b, not on c: `enlace-remote --host a stop walk-c` ends it"
    assert said in capsys.readouterr().err

    def all_started(launch):  # after the last host's start, before launch.started was set: an IndexError
        launch.run_name = "walk-c"
        launch.remembered.extend([("a", None), ("b", None), ("c", None)])
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "STAGES", {**fake, "start": all_started})
    with pytest.raises(KeyboardInterrupt):
        pipeline.run(three, session_for=None, repo=None)
    assert "walk-c was started on a, b, c: `enlace-remote --host a stop walk-c` ends it" in capsys.readouterr().err


def test_ctrl_c_in_stop_says_the_run_may_be_stopping_on_its_own(capsys):
    """Ctrl-C while the server waited for a stop's checkpoint said `interrupted` alone; its SIGTERM was sent first.
    (The session stands in for the server's wait, which the Ctrl-C cuts short.)"""
    from orchestrator.commands.common import ask_to_stop

    class Waiting:
        def enlace_json(self, *args, **kw):
            assert args[1:3] == ("stop", "long") and "--kill" in args
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ask_to_stop(Waiting(), "gpu", "long", 30.0, kill=True)
    err = capsys.readouterr().err
    assert (
        "long on gpu may already have been sent SIGTERM" in err
        and "once they have saved a checkpoint, not killed" in err
    )
    assert "`enlace-remote --host gpu status long`" in err and "`enlace-remote --host gpu stop long` waits" in err


@pytest.fixture
def planned(user_repo, tmp_path, monkeypatch):
    """Run `enlace-remote ARGS` in the user's repo with pipeline.run replaced by a recorder: the plan it built."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        "hosts:\n  gpu: {ssh: alice@gpu.example.org}\n"
        "  cluster: {ssh: bob@login.example.org, scheduler: slurm, partition: gpu, gpus_per_node: 4}\n"
    )
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(hosts))
    monkeypatch.chdir(user_repo)
    plans = []
    monkeypatch.setattr(pipeline, "run", lambda plan, session_for, repo: plans.append(plan))

    def launch(*args: str) -> Plan:
        result = CliRunner().invoke(main, ["launch", *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return plans[-1]

    return launch


def test_a_plain_host_and_a_slurm_host_run_the_same_pipeline(planned):
    ssh = planned("tiny", "--host", "gpu")
    assert isinstance(backend_for(ssh), SSHBackend) and [h.name for h in ssh.targets] == ["gpu"]
    assert stages_for(ssh) == ["ship", "decide", "preflight", "start", "wait"]
    assert ssh.policy == ["--restarts", "3"]

    quick = planned("tiny", "--host", "gpu", "--no-preflight", "--until", "5", "--follow")
    assert stages_for(quick) == ["ship", "decide", "start", "wait", "follow"]
    assert quick.train_args == ["--until", "5"]

    slurm = planned("tiny", "--host", "cluster")
    assert isinstance(backend_for(slurm), SlurmBackend) and slurm.nproc == 4
    assert stages_for(slurm) == stages_for(ssh)  # the same stages; only `start` differs by backend


def test_a_host_named_twice_is_refused_before_anything_starts(planned):
    """--hosts local,local started the run's rank 0 there twice: the second was refused, the first waited for its
    peer until a stop --kill, and `launch NAME` kept the pair."""
    for verb in (["launch", "tiny", "--gpus", "1"], ["sweep", "tiny", "--set", "optim.learning_rate=1e-3,2e-3"]):
        result = CliRunner().invoke(main, [*verb, "--hosts", "gpu, gpu"])
        assert result.exit_code == 2 and "--hosts: gpu is named twice: name each host once" in result.output, (
            result.output
        )
        assert "Traceback" not in result.output


def test_the_log_under_a_failed_starts_error_does_not_say_it_again():
    """The error, the trainer's `error:` line and its CLI's `Error:` line were the same words three times."""
    from orchestrator.launch.stages import tail_under

    why = "runs/r/checkpoints/step-000010: the data differs from the checkpoint's"
    error = f"r failed: {why}; last logged step 10/20, fix what it says, then `enlace-remote launch r`"
    log = (
        "2026-12-07 03:57:17 loading the checkpoint\nTraceback (most recent call last):\n}\n"
        f"2026-12-07 03:57:18 error: {why}\nError: {why}\n"
        "2026-12-07 03:57:18 supervisor: the trainer exited 2: not retried\n"
    )
    kept = "2026-12-07 03:57:17 loading the checkpoint\nTraceback (most recent call last):\n}"
    assert tail_under(error, log) == kept + "\n2026-12-07 03:57:18 supervisor: the trainer exited 2: not retried"


_STOPPED = {"stopped": True, "killed": False, "grace_s": 30.0, "status": "stopped", "latest_checkpoint": "ck"}


class _SweepServers:
    """Stand-ins for the servers of a sweep's runs, one host each: `q` queued, `a` fast, `b` waits for its
    checkpoint until released, `c` unreachable. `during` "queued": a real SIGINT to this process while q's stop
    waits; "running": once a, b and c were all asked and c has failed."""

    def __init__(self, monkeypatch, during: str | None):
        import threading

        from orchestrator.commands import sweep as sweep_cmd

        self.release, self.ready, self.asked, self.during = threading.Event(), threading.Event(), set(), during
        runs = (("q", "queued-run", "queued"), ("a", "fast", "running"), ("b", "slow", "running"))
        rows = [{"host": h, "run_name": n, "alive": True, "status": st} for h, n, st in runs]
        rows.append({"host": "c", "run_name": "broken", "alive": True, "status": "running"})
        rows.append({"host": "d", "run_name": "later", "alive": False, "status": "not launched"})  # (no stop asked)
        rows.append({"host": "e", "run_name": "lost", "alive": False, "status": "no answer"})  # e did not answer
        monkeypatch.setattr(sweep_cmd.record, "load", lambda repo, name: SimpleNamespace(name="lr"))
        monkeypatch.setattr(sweep_cmd, "_rows", lambda remote, sweep: rows)
        monkeypatch.setattr("orchestrator.hosts.resolve.resolve_host", lambda name, repo: name)
        self.remote = SimpleNamespace(
            repo=None, session_for=lambda host: SimpleNamespace(enlace_json=lambda *args, **kw: self.answer(host))
        )
        if during:
            threading.Thread(target=self._interrupt, daemon=True).start()

    def _interrupt(self) -> None:
        import os
        import signal

        if self.ready.wait(60):
            os.kill(os.getpid(), signal.SIGINT)

    def answer(self, host: str) -> dict:
        from orchestrator.errors import UnreachableError

        self.asked.add(host)
        if (self.during == "running" and {"a", "b", "c"} <= self.asked) or (self.during == "queued" and host == "q"):
            self.ready.set()
        if host == "c":
            raise UnreachableError("c (10.0.0.3): connection refused")
        if host == "b" or (host == "q" and self.during == "queued"):
            self.release.wait(60)  # its checkpoint
        return {**_STOPPED, "step": {"q": 0, "a": 4, "b": 9}[host], "phase": "queued"}


@pytest.mark.parametrize("during", ["running", "queued", None])
def test_stop_sweep_says_each_runs_outcome_and_ctrl_c_returns_at_once_naming_what_is_left(capsys, monkeypatch, during):
    """Ctrl-C in `stop --sweep` waited, silent, for every stop its threads had under way (each up to the grace),
    then said `interrupted` alone; in a queued run's stop it said that run alone, as if it were the whole stop.
    One host's failure abandoned the other stops, unsaid. (Stand-ins for the servers; the SIGINT is real.)"""
    from orchestrator.commands import sweep as sweep_cmd

    servers = _SweepServers(monkeypatch, during)
    if during is None:
        servers.release.set()
    try:
        with pytest.raises(KeyboardInterrupt if during else SystemExit) as ended:
            sweep_cmd.stop_all(servers.remote, "lr", 30.0, kill=False)
    finally:
        servers.release.set()
    out, err = capsys.readouterr()
    queued_line = "queued-run on q: stopped (queued); latest checkpoint ck\n"
    broken_line = "broken on c: not stopped — c (10.0.0.3): connection refused\n"
    fast_line = "fast on a: stopped at step 4; latest checkpoint ck\n"
    if during is None:  # every outcome said, the failure too; exit 1
        assert ended.value.code == 1  # and the point not launched said: a `sweep` still launching it goes on
        assert (
            err == "note: 1 point(s) of sweep lr not launched: where `enlace-remote sweep` is still launching them,"
            " Ctrl-C it, then `enlace-remote stop --sweep lr` again\n"
        ), err
        slow_line = "slow on b: stopped at step 9; latest checkpoint ck\n"
        lost_line = "lost on e: not stopped — its host did not answer\n"  # it read "not launched": never said
        assert out == queued_line + fast_line + slow_line + broken_line + lost_line
    elif during == "running":  # at once: what ended, and the stops still under way (slow's, and fast's or
        # broken's where the SIGINT came as its thread was ending), each run said once
        ended_lines = [line for line in (fast_line, broken_line) if line in out]
        assert out == queued_line + "".join(ended_lines), out
        left = [w for line, w in ((fast_line, "fast on a"), (broken_line, "broken on c")) if line not in out]
        assert f"sweep lr: interrupted. Under way: the stop of {', '.join([*left, 'slow on b'])} (a running" in err
        assert "Not asked" not in err
    else:
        assert out == ""
        assert "Under way: the stop of queued-run on q" in err, err
        assert "Not asked to stop: fast on a, slow on b, broken on c." in err, err
    if during:
        assert (
            "`enlace-remote status --sweep lr`" in err and "`enlace-remote stop --sweep lr` stops what is left" in err
        )


def test_plot_sweep_asks_each_host_once_and_never_waits_on_one_that_does_not_answer(capsys, monkeypatch, tmp_path):
    """Seen: `plot --sweep m221` with its points never launched warned, for each, "no run named … here — did you
    mean 'm228-lr1e-3'? runs on this host: <80 names>"; with one host down it took 96 s (its point's fetch retried
    for 90 s, 13 times), where `status --sweep` and `fetch --sweep` give up on it in 2. Each host is now asked
    once, as status asks: a point never launched and one whose host is down are said and not fetched; the latter
    is drawn as fetched before, if it was. The title names the sweep (six points' names ran off the figure). (The
    sessions stand in for each host's answer to `runs`; the down one raises as a refused connection does.)"""
    from orchestrator.commands import sweep as sweep_cmd
    from orchestrator.sweep.record import Sweep

    points = [{"host": "local", "run_name": f"m221-lr{v}", "values": {"lr": v}} for v in ("1e-3", "3e-3")] + [
        {"host": "dead", "run_name": f"m221-lr{v}", "values": {"lr": v}} for v in ("1e-2", "3e-2")
    ]
    sweep = Sweep(name="m221", run_file="r", fixed=[], keys=["lr"], points=points)
    monkeypatch.setattr(sweep_cmd.record, "load", lambda repo, name: sweep)
    monkeypatch.setattr("orchestrator.hosts.resolve.resolve_host", lambda name, repo: name)

    def runs_of(host: str):
        if host == "dead":
            raise EnlaceError("dead: ssh: connect to host 127.0.0.1 port 2: Connection refused")
        return [{"run_name": "m221-lr1e-3", "status": "finished", "step": 5}]  # lr3e-3: never launched

    fetched, drawn = [], {}

    def fetch_run_files(session, run_name, dest, names):
        fetched.append(run_name)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')

    monkeypatch.setattr("orchestrator.transfer.fetch.fetch_run_files", fetch_run_files)
    monkeypatch.setattr(
        "enlace.tools.plot.plot", lambda dirs, out, metrics, title=None: drawn.update(dirs=dirs, title=title)
    )
    before = tmp_path / "runs" / "m221-lr1e-2"  # fetched before its host went down
    before.mkdir(parents=True)
    (before / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    sessions = lambda host: SimpleNamespace(enlace_json=lambda *argv: runs_of(host))
    sweep_cmd.plot_all(SimpleNamespace(repo=tmp_path, session_for=sessions), "m221", None, [])
    err = capsys.readouterr().err
    assert fetched == ["m221-lr1e-3"] and [d.name for d in drawn["dirs"]] == ["m221-lr1e-3", "m221-lr1e-2"]
    assert "m221-lr3e-3: not launched (`status --sweep` shows it)" in err and "did you mean" not in err, err
    assert "m221-lr1e-2: its host did not answer: as fetched before" in err, err
    assert "m221-lr3e-2: its host did not answer\n" in err and err.count("warning: dead: ") == 1, err
    assert drawn["title"] == "sweep m221: 2 of its 4 runs"


def test_a_run_stopped_at_its_last_step_is_not_launched_again_without_an_extension(capsys):
    """A queued extension of a finished run, stopped before it started, left the run `stopped` at 400 of 400;
    `launch NAME` then queued a start that built the model to say "nothing to train". (The session stands in for
    the host's `runs`.)"""
    from orchestrator.launch.stages import worth_launching

    row = {"run_name": "r", "status": "stopped", "alive": False, "step": 400, "max_steps": 400}
    row |= {"latest_checkpoint": "step-000400", "phase": "stopped while queued: it never started"}
    session = SimpleNamespace(enlace_json=lambda *a, **k: [row], host=SimpleNamespace(name="local"))
    assert worth_launching(session, "r") is False
    assert "r is stopped at its end: step 400 of 400" in capsys.readouterr().err
    assert worth_launching(session, "r", ("training.max_steps=500",)) is True  # an extension goes ahead
    for step, kept in ((250, "step-000250"), (400, "step-000300")):  # half way; killed in its final save
        answer = [{**row, "step": step, "latest_checkpoint": kept}]
        there = SimpleNamespace(enlace_json=lambda *a, answer=answer, **k: answer, host=session.host)
        assert worth_launching(there, "r") is True  # it resumes
    # finished, its final checkpoint's MANIFEST lost: it was said both "100 steps will be trained again" and
    # "is finished ... nothing to train"; the steps are trained again, from the newest complete checkpoint
    lost = "step-000400 is incomplete (MANIFEST missing): resuming from step-000300; 100 steps will be trained again"
    answer = [{**row, "status": "finished", "latest_checkpoint": "step-000300", "checkpoint_warning": lost}]
    there = SimpleNamespace(enlace_json=lambda *a, **k: answer, host=session.host)
    capsys.readouterr()
    assert worth_launching(there, "r") is True
    err = capsys.readouterr().err
    assert "100 steps will be trained again" in err and "finished" not in err, err
    answer[0]["checkpoint_warning"] = None  # complete: finished, nothing to train
    assert worth_launching(there, "r") is False


def test_fetch_sweep_fetches_every_run_it_can_and_says_the_one_it_could_not(capsys, monkeypatch, tmp_path):
    """One run's corrupt checkpoint ended `fetch --sweep` there: the runs after it were left unfetched. (The
    fetch stands in for the host's; the error is the one a corrupt checkpoint raises.)"""
    from orchestrator.commands import sweep as sweep_cmd
    from orchestrator.transfer.fetch import CorruptCheckpoint

    rows = [{"host": "h", "run_name": n, "status": "finished", "latest_checkpoint": "step-000010"} for n in "abc"]
    monkeypatch.setattr(sweep_cmd.record, "load", lambda repo, name: SimpleNamespace(name="s"))
    monkeypatch.setattr(sweep_cmd, "_rows", lambda remote, sweep: rows)
    monkeypatch.setattr("orchestrator.hosts.resolve.resolve_host", lambda name, repo: name)

    def fetch(session, run_name, dest, every):
        if run_name == "b":
            raise CorruptCheckpoint("checkpoints/step-000010/model.pt of b: sha256 does not match")
        return {"fetched": ["step-000010"], "dest": str(dest)}

    monkeypatch.setattr("orchestrator.transfer.fetch.fetch", fetch)
    with pytest.raises(SystemExit) as ended:
        sweep_cmd.fetch_all(SimpleNamespace(repo=tmp_path, session_for=lambda host: None), "s", False, False)
    out, err = capsys.readouterr()
    assert ended.value.code == 1 and out.count(": step-000010 →") == 2 and "fetch c (h)" in out, out
    assert "fetch b (h): not fetched — checkpoints/step-000010/model.pt of b" in err, err
