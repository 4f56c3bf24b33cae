"""The run file and the run name are two things (the maintainer's pass, item 1): `launch long --set
run_name=mytry` starts `mytry`, and every bare verb after it acts on `mytry`; `launch mytry` resumes it from
the file and --set items it was launched with, and `--set training.max_steps=M` extends it. Seen before: bare
`logs`, `stop`, `fetch` looked for a run called `long`; `launch mytry` found no run config."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from support.remote import remote, server_dir, tiny_corpus, wait_until
from support.repocopy import commit_all

from enlace.names import quoted, validate_run_name
from enlace.state import runs

pytestmark = pytest.mark.slow


def test_bare_verbs_act_on_the_run_launch_started_and_launch_name_resumes_and_extends_it(sshd, user_repo, tmp_path):
    tiny_corpus(server_dir(sshd, "testhost"))
    run_dir = server_dir(sshd, "testhost") / "runs" / "mytry"
    remote(
        user_repo,
        sshd.env,
        "launch",
        "long",
        "--set",
        "run_name=mytry",
        "--set",
        "training.log_every=5",
        "--no-preflight",
    )
    assert json.loads((user_repo / ".enlace" / "last-runs.json").read_text())["testhost"] == "mytry"
    rows = json.loads(remote(user_repo, sshd.env, "status", "--json").stdout)
    assert [(r["run_name"], r["run_file"], r["status"]) for r in rows] == [("mytry", "long", "running")]

    stopped = remote(user_repo, sshd.env, "stop")
    assert stopped.stdout.startswith("mytry: stopped"), stopped.stdout + stopped.stderr
    step = runs.read(run_dir)["step"]
    logs = remote(user_repo, sshd.env, "logs")
    assert "run: mytry" in logs.stderr and f"checkpoint step-{step:06d} saved" in logs.stdout
    remote(user_repo, sshd.env, "fetch")
    assert (user_repo / "runs" / "mytry" / "run.json").is_file()
    measured = remote(user_repo, sshd.env, "preflight", "mytry", "--steps", "2")  # a run's name, as launch takes it
    assert "from configs/runs/long.yaml" in measured.stderr and "--set training.log_every=5" in measured.stderr
    assert json.loads((user_repo / "runs" / "mytry" / "preflight.json").read_text())["run_name"] == "mytry"
    sample = remote(user_repo, sshd.env, "sample", "--bytes", "20", "--prompt", "def ")
    assert "run: mytry" in sample.stderr

    resumed = remote(user_repo, sshd.env, "launch", "mytry", "--no-preflight")  # resume: the same file and sets
    assert "from configs/runs/long.yaml" in resumed.stderr and "--set training.log_every=5" in resumed.stderr
    st = runs.read(run_dir)
    assert st["resumed_from"] and st["run_name"] == "mytry" and st["step"] >= step, st
    remote(user_repo, sshd.env, "stop")
    wait_until(lambda: not runs.observe(run_dir)["alive"], 60, "mytry to stop")

    target = runs.read(run_dir)["step"] + 3
    remote(user_repo, sshd.env, "launch", "mytry", "--set", f"training.max_steps={target}", "--no-preflight")
    remote(user_repo, sshd.env, "logs", "-f")
    row = json.loads(remote(user_repo, sshd.env, "status", "mytry", "--json").stdout)[0]
    assert (row["status"], row["step"], row["max_steps"]) == ("finished", target, target), row
    # ELAPSED is the training time of all three starts (it showed the latest start's alone), that one beside it
    assert row["elapsed_s"] > row["start_elapsed_s"] > 0, row
    assert "this start)" in remote(user_repo, sshd.env, "status").stdout
    # nothing to print (as for a Slurm job cancelled while pending, whose log stays empty): where it stands, said
    nothing = remote(user_repo, sshd.env, "logs", "mytry", "--tail", "0", "-f")
    assert nothing.stdout == "" and "nothing new in mytry's train.log; it is finished" in nothing.stderr
    # finished: launch NAME says so and starts nothing (its recorded --set of max_steps is no extension)
    launch_id = runs.read(run_dir)["launch_id"]
    again = remote(user_repo, sshd.env, "launch", "mytry", "--no-preflight")
    assert "mytry is finished" in again.stderr and runs.read(run_dir)["launch_id"] == launch_id, again.stderr
    assert not (server_dir(sshd, "testhost") / "runs" / "long").exists()
    # from another clone, whose run file `mytr` is a name close to the run's: the host's run is asked for (it
    # said "no run config 'mytry' — did you mean 'mytr'?", where `launch mytry` from here resumed the run)
    other = tmp_path / "other"
    subprocess.run(["git", "clone", "-q", str(user_repo), str(other)], check=True)
    shutil.copy(other / "configs" / "runs" / "long.yaml", other / "configs" / "runs" / "mytr.yaml")
    commit_all(other, "a run file named close to the run")
    there = remote(other, sshd.env, "launch", "mytry", "--no-preflight")
    assert "mytry is finished" in there.stderr and runs.read(run_dir)["launch_id"] == launch_id, there.stderr
    # a typo of the run's name: it suggested run files only ("no run config 'mytyr' in configs/runs/")
    typo = remote(user_repo, sshd.env, "launch", "mytyr", "--no-preflight", check=False)
    assert typo.returncode == 2, typo.stderr
    assert "did you mean the run 'mytry'? (`launch mytry` resumes it) — run files:" in typo.stderr
    assert "runs on testhost: mytry" in typo.stderr and "Traceback" not in typo.stderr


def test_a_huge_bad_name_is_quoted_by_a_short_prefix():
    with pytest.raises(Exception) as e:
        validate_run_name("x/" * 60_000, "--set")
    assert len(str(e.value)) < 400 and "120002 characters" in str(e.value)
    assert quoted("ok") == "'ok'"


def test_launch_of_a_run_named_as_its_file_keeps_the_set_items_it_was_launched_with(tmp_path):
    """`launch corpus-cpu --set optim.warmup_steps=5`, then `launch corpus-cpu --set training.max_steps=40`: verify
    checked the file without the recorded item (warmup 50 > max_steps 40) and refused what the trainer takes."""
    from types import SimpleNamespace

    from orchestrator.launch import choose

    (tmp_path / "configs" / "runs").mkdir(parents=True)
    (tmp_path / "configs" / "runs" / "corpus-cpu.yaml").write_text("data: tiny\n")
    from enlace.contract import ErrorKind
    from enlace.errors import EnlaceError

    def cannot_say(*argv):  # nothing synced on the host yet: what this machine remembers stands
        error = EnlaceError("nothing was launched or synced there yet")
        error.kind = ErrorKind.NOT_SYNCED
        raise error

    session = SimpleNamespace(host=SimpleNamespace(name="gpu1"), enlace_json=cannot_say)
    assert choose.launch_target(session, tmp_path, "corpus-cpu", ("training.max_steps=40",))[1] == (
        "training.max_steps=40",
    )  # never launched with --set items: the file and this launch's own
    choose.remember_run(tmp_path, "gpu1", "corpus-cpu", "corpus-cpu", ("optim.warmup_steps=5", "run_name=corpus-cpu"))
    file, items = choose.launch_target(session, tmp_path, "corpus-cpu", ("training.max_steps=40",))
    assert file == "corpus-cpu" and items == ("optim.warmup_steps=5", "run_name=corpus-cpu", "training.max_steps=40")
    # --resume none starts afresh without them (configs.md): the file and this launch's own items only
    fresh = choose.launch_target(session, tmp_path, "corpus-cpu", ("training.max_steps=30",), fresh=True)
    assert fresh == ("corpus-cpu", ("training.max_steps=30",)), fresh
    # another run from the same file: the file and its own items (it copied corpus-cpu's warmup_steps=5)
    other = choose.launch_target(session, tmp_path, "corpus-cpu", ("run_name=b",))
    assert other == ("corpus-cpu", ("run_name=b",)), other
    choose.remember_run(tmp_path, "gpu1", "mytry", "corpus-cpu", ("optim.warmup_steps=5", "run_name=mytry"))
    fresh = choose.launch_target(session, tmp_path, "mytry", (), fresh=True)  # a run named apart: its name stays
    assert fresh == ("corpus-cpu", ("run_name=mytry",)), fresh

    # a launch whose trainer refused its --set (another model over the run's checkpoints) is remembered here, but
    # the run's line kept its own: the host's run.json wins, so a plain `launch mytry` resumes the good line
    choose.remember_run(tmp_path, "gpu1", "mytry", "corpus-cpu", ("model.n_layer=3", "run_name=mytry"))
    line = {"run_file": "corpus-cpu", "overrides": ["optim.warmup_steps=5", "run_name=mytry"]}
    session.enlace_json = lambda *argv: [line] if argv[1:3] == ("runs", "mytry") else []
    assert choose.launch_target(session, tmp_path, "mytry", ()) == ("corpus-cpu", tuple(line["overrides"]))
    # a run of your own command records no run file there: what this machine remembers stands
    line = {"run_file": None, "overrides": []}
    assert choose.launch_target(session, tmp_path, "mytry", ())[1] == ("model.n_layer=3", "run_name=mytry")
    # a host that does not answer is said as such (taken for "no such run", the remembered --set stood again)
    session.enlace_json = lambda *argv: (_ for _ in ()).throw(EnlaceError("on gpu1: connection reset"))
    with pytest.raises(EnlaceError, match="connection reset"):
        choose.launch_target(session, tmp_path, "mytry", ())


def test_a_run_launched_again_keeps_its_placement_unless_an_option_is_given(tmp_path, capsys):
    """`launch NAME` of a run launched with --gpus/--hosts/--nodes: the options given win, the others are what it
    was launched with from here (said); the rendezvous port is remembered only with --hosts."""
    from types import SimpleNamespace

    from orchestrator.launch import choose

    def options(**given):
        return SimpleNamespace(**{"gpus": None, "hosts": None, "nodes": None, "master_port": 29500, **given})

    assert choose.placement_of(options(gpus="2")) == {"gpus": "2"}  # no --hosts: the port is not its placement
    assert choose.placement_of(options()) == {}
    spread = choose.placement_of(options(gpus="4", hosts="a,b", master_port=29600))
    assert spread == {"gpus": "4", "hosts": "a,b", "master_port": 29600}
    choose.remember_run(tmp_path, "a", "big", "corpus-cpu", ("run_name=big",), spread)
    choose.remember_run(tmp_path, "cluster", "job", "corpus-cpu", (), {"nodes": 2})
    choose.remember_run(tmp_path, "a", "small", "corpus-cpu")  # launched without any: nothing kept, nothing said

    kept = choose.kept_placement(tmp_path, "a", "big", options(), set())
    assert kept == {"gpus": "4", "hosts": "a,b", "nodes": None, "master_port": 29600}
    assert "run: big keeps --gpus 4 --hosts a,b --master-port 29600, as it was launched" in capsys.readouterr().err
    kept = choose.kept_placement(tmp_path, "a", "big", options(gpus="2"), {"gpus", "resume"})  # given: it wins
    assert kept["gpus"] == "2" and kept["hosts"] == "a,b"
    assert "--gpus" not in capsys.readouterr().err
    assert choose.kept_placement(tmp_path, "cluster", "job", options(), set())["nodes"] == 2
    assert choose.kept_placement(tmp_path, "a", "small", options(), set()) == vars(options())
    assert choose.kept_placement(tmp_path, "cluster", "big", options(), set()) == vars(options())  # another host's
    assert capsys.readouterr().err.count("keeps") == 1


def test_a_sweeps_point_started_afresh_keeps_its_swept_values(tmp_path):
    """`launch fast-sweep1-lr0.2 --resume none` trained the file's lr 0.1 under the point's name, which its sweep's
    table still ranked as lr 0.2; other recorded --set items are still left out, as for any run."""
    from types import SimpleNamespace

    from orchestrator.launch import choose
    from orchestrator.sweep import record

    (tmp_path / "configs" / "runs").mkdir(parents=True)
    (tmp_path / "configs" / "runs" / "fast.yaml").write_text("command: [python, train.py]\n")
    point = {"run_name": "fast-sweep1-lr0.2", "host": "local", "values": {"args.lr": "0.2"}}
    record.save(tmp_path, record.Sweep("fast-sweep1", "fast", ["args.steps=30"], ["args.lr"], [point]))
    sets = ("args.steps=30", "args.lr=0.2", "env.X=1", "run_name=fast-sweep1-lr0.2")
    choose.remember_run(tmp_path, "local", "fast-sweep1-lr0.2", "fast", sets)
    session = SimpleNamespace(host=SimpleNamespace(name="local"), enlace_json=lambda *a, **k: [])  # (no run.json)
    for fresh, kept in ((False, sets), (True, ("args.lr=0.2", "run_name=fast-sweep1-lr0.2"))):
        file, overrides = choose.launch_target(session, tmp_path, "fast-sweep1-lr0.2", (), fresh)
        assert file == "fast" and sorted(overrides) == sorted(kept), overrides


def test_verifys_hints_name_the_host_they_are_for(monkeypatch, capsys):
    """The server's refusal of a config its checkpoints cannot resume ends with the command that starts afresh; on
    `--host box` it read `enlace-remote launch smoke-cpu ... --resume none`, and run as printed it set aside the
    default host's run of that name and started it from step 0. (The session stands in for box's answer.)"""
    from types import SimpleNamespace

    from orchestrator.errors import HOST_ENV
    from orchestrator.launch.ship import verify

    monkeypatch.delenv(HOST_ENV, raising=False)  # a bare command reaches `local`
    hint = "cannot resume it — start afresh: enlace-remote launch smoke-cpu --set a.b=1 --resume none"
    doc = {"ok": False, "exit_code": 3, "checks": [{"name": "resume", "ok": False, "detail": hint}], "warnings": [hint]}
    session = SimpleNamespace(host=SimpleNamespace(name="box", python="python3"), call_json=lambda *a, **k: doc)
    with pytest.raises(Exception, match="enlace-remote --host box launch smoke-cpu") as refused:
        verify(session, "a" * 40, "smoke-cpu")
    assert "enlace-remote launch" not in str(refused.value)
    err = capsys.readouterr().err
    assert err.count("enlace-remote --host box launch smoke-cpu --set a.b=1 --resume none") == 2, err
