"""What a launch refuses before anything starts because the run it would resume is not what it launches: a
checkpoint saved by another number of processes (its MANIFEST's record, against the launch's), a run of the
other kind (enlace's trainer against a command of your own) under the same name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.launch.pipeline import Plan


def test_a_launch_of_the_other_kind_under_a_runs_name_is_refused_before_its_preflight():
    """A finished command run launched as enlace's trainer (a trainer file added under its name) was said
    `finished: step None of None`, with a --set training.max_steps hint; the reverse went on to the server."""
    from orchestrator.errors import UsageError
    from orchestrator.launch.stages import worth_launching

    row = {"run_name": "x", "status": "finished", "alive": False, "step": None, "max_steps": None}
    for kind, launched_as_command in (({"command_spec": {"command": ["python", "t.py"]}}, False), ({}, True)):
        session = SimpleNamespace(enlace_json=lambda *a, r={**row, **kind}, **k: [r], host=SimpleNamespace(name="h"))
        with pytest.raises(UsageError, match=r"x: a run of .* here, and this launch starts .* under its name"):
            worth_launching(session, "x", command=launched_as_command)


def test_an_until_the_newest_checkpoint_has_reached_is_refused_before_anything_starts(monkeypatch):
    """`launch r --until 600` where r's newest checkpoint is step-000647: it resumed, trained nothing, exited 0,
    and its log said to raise training.max_steps. (The session stands in for the host's `runs`.)"""
    from orchestrator.errors import HOST_ENV, UsageError
    from orchestrator.launch.stages import worth_launching

    monkeypatch.delenv(HOST_ENV, raising=False)
    row = {"run_name": "r", "status": "stopped", "alive": False, "step": 650, "max_steps": 1600}
    session = SimpleNamespace(
        enlace_json=lambda *a, **k: [{**row, "latest_checkpoint": "step-000647"}], host=SimpleNamespace(name="box")
    )
    for until in (600, 647):
        with pytest.raises(UsageError, match=f"step 647: --until {until} trains nothing — give --until above 647"):
            worth_launching(session, "r", until=until)
    assert worth_launching(session, "r", until=648) and worth_launching(session, "r")
    assert worth_launching(session, "r", fresh=True, until=600)  # --resume none: from step 0
    with pytest.raises(UsageError, match="`enlace-remote --host box launch r` trains to its max_steps"):
        worth_launching(session, "r", until=1)


def test_a_plan_knows_how_many_processes_resume_the_run():
    """verify's resume check compares it with the number its checkpoint's MANIFEST records (None: not known here)."""
    plan = lambda targets=("a",), **kw: Plan(run_file="tiny", targets=list(targets), train_args=[], **kw)
    assert plan().world == 1 and plan(gpus="4").world == 4 and plan(gpus="all").world is None
    assert plan(("a", "b"), gpus="2").world == 4  # --hosts a,b --gpus 2: two per host
    assert plan(slurm=SimpleNamespace(nodes=3), nproc=2).world == 6  # --nodes 3, two per node


def test_a_checkpoint_saved_by_two_processes_is_refused_for_a_launch_on_one_before_it_starts(project):
    """verify's resume check (data-files --against-checkpoint --world N) reads the number from the MANIFEST, in
    the trainer's own words; a launch on one started a trainer that refused it, among torchrun's error lines."""
    import json

    from support.cli import enlace
    from support.configs import write_run

    from enlace.manifest import publish, read_manifest

    write_run(project, "two")
    ckpts = project / "runs" / "two" / "checkpoints"
    for step, record in ((5, {"world": 2}), (10, {})):  # step 10 saved before MANIFESTs recorded it
        tmp = ckpts / f".tmp-{step}"
        tmp.mkdir(parents=True)
        (tmp / "trainer.pt").write_bytes(b"stands in for the state: only its MANIFEST is read")
        publish(ckpts, tmp, step, keep=5, record=record)
    assert read_manifest(ckpts / "step-000005")["world"] == 2

    def refused(*args: str) -> str | None:
        out = enlace(project, "data-files", "two", "--json", "--against-checkpoint", *args)
        return json.loads(out.stdout)["changed"]

    said = refused("checkpoints/step-000005", "--world", "1") or ""
    assert said.startswith("two's checkpoint step-000005 was saved by 2 processes, resuming with 1"), said
    assert "launch it with --gpus 2" in said and "--resume none" in said, said
    assert refused("checkpoints/step-000005", "--world", "2") is None
    assert refused("checkpoints/step-000005") is None  # --gpus all: the number is not known before it starts
    assert refused("latest", "--world", "1") is None  # nothing recorded: the trainer alone can say


def test_a_commands_fresh_start_on_slurm_sets_its_line_aside_before_the_job_is_submitted(project, monkeypatch):
    """launch NAME --resume none of a command on a Slurm host: `submit --fresh` (sbatch stands in: the Slurm
    tests run real jobs, whose minute-long limits this wiring need not pay for; docs/own-script.md)."""
    import json

    from click.testing import CliRunner

    from enlace.manifest import publish
    from enlace.slurm import cli, settings
    from enlace.state import runs

    run_dir = project / "runs" / "mine"
    tmp = run_dir / "checkpoints" / ".tmp-3"
    tmp.mkdir(parents=True)
    (tmp / "state.pt").write_bytes(b"a script's own state")
    publish(run_dir / "checkpoints", tmp, 3, keep=2)
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 3, "loss": 1.0}\n')
    runs.update(run_dir, run_name="mine", status="finished", command={"command": ["python", "t.py"]})
    seen = []
    monkeypatch.setattr(settings, "submit", lambda script, where, out: seen.append(sorted(run_dir.iterdir())) or "77")
    spec = json.dumps({"command": ["python", "t.py"], "run_name": "mine"})
    args = [
        "mine",
        "--slurm",
        json.dumps({"partition": "cpu"}),
        "--command-spec",
        spec,
        "--fresh",
        "--root",
        str(project),
    ]
    result = CliRunner().invoke(cli.submit_cmd, [*args, "--json"])
    assert result.exit_code == 0, result.output
    aside = runs.read(run_dir)["set_aside"]["path"]
    assert aside.startswith("runs/mine/checkpoints-set-aside/") and (project / aside / "step-000003").is_dir()
    assert not (run_dir / "checkpoints" / "step-000003").exists() and (run_dir / "metrics.jsonl").read_text() == ""
    assert seen and run_dir / "checkpoints-set-aside" in seen[0]  # set aside before the job could start


def test_a_fresh_start_says_what_it_set_aside(tmp_path):
    """A script that never checkpointed, started afresh, was said to leave "checkpoints" it never had."""
    from enlace.server.ownchild import afresh

    run_dir = tmp_path / "runs" / "once"
    run_dir.mkdir(parents=True)
    assert afresh(run_dir, "L1") is None  # nothing there: nothing set aside
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 1.0}\n')
    aside = afresh(run_dir, "L2")
    assert aside["what"] == "metrics.jsonl" and aside["path"].startswith("runs/once/checkpoints-set-aside/")
    assert (tmp_path / aside["path"] / "metrics.jsonl").read_text().startswith('{"kind": "train"')


def test_a_commands_fresh_start_counts_its_elapsed_time_from_zero(tmp_path):
    """ELAPSED went on over the launches set aside (7 s shown for a line of 5)."""
    from enlace.server import lifecycle
    from enlace.state import runs

    run_dir = tmp_path / "runs" / "own"
    command = {"command": ["python", "t.py"]}
    for fresh, counted in ((False, 100.0), (True, 0.0)):
        runs.update(run_dir, run_name="own", status="stopped", command=command, trained_before_s=100.0)
        with lifecycle.launching(run_dir, command, fresh):
            assert runs.read(run_dir)["trained_before_s"] == counted
