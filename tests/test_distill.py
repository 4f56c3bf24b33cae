"""Distillation: a student from a teacher checkpoint — exact resume, teacher identity, clear errors,
and the teacher's own text as shards (`enlace generate`)."""

from __future__ import annotations

import json

import pytest
from support.cli import enlace, metrics, run_json
from support.configs import write_run
from support.remote import remote, server_dir, tiny_corpus

STUDENT = {
    "model": {"seq_len": 32, "n_layer": 1, "n_head": 2, "d_model": 16, "dropout": 0.0},
    "runtime": {"deterministic": True},
    "training": {"max_steps": 8, "log_every": 1, "eval_every": 4},
    "distill": {"teacher": "teach", "alpha": 0.5, "temperature": 2.0},
}


@pytest.fixture
def teacher(project):
    write_run(project, "teach", training={"max_steps": 6, "eval_every": 0}, checkpoint={"every": 3, "keep": 3})
    enlace(project, "train", "teach")
    return project


@pytest.mark.slow
def test_distillation_resumes_exactly_and_logs_both_terms(teacher):
    write_run(teacher, "stud", **STUDENT)
    out = enlace(teacher, "verify-resume", "stud", "--steps", "8", "--json")
    rep = json.loads(out.stdout)
    assert rep["ok"] and rep["tensors"] > 10 and rep["losses_compared"] == 4, rep
    enlace(teacher, "train", "stud")
    train = metrics(teacher / "runs" / "stud", "train")
    assert all(r["kd"] > 0 and r["ce"] > 0 for r in train)
    assert all(abs(r["loss"] - (0.5 * r["ce"] + 0.5 * r["kd"])) < 1e-4 for r in train)  # the loss is the mix
    assert "distilling from" in (teacher / "runs" / "stud" / "train.log").read_text()
    rep = json.loads(enlace(teacher, "preflight", "stud", "--json", "--steps", "2").stdout)
    assert rep["environment"]["teacher_params"] > rep["environment"]["params"]  # the teacher is built and counted


@pytest.mark.slow
def test_a_changed_teacher_is_refused_on_resume(teacher):
    write_run(teacher, "stud", **STUDENT)
    # a student that does not fit its teacher is refused before the run (it passed check-config and verify)
    for item, said in (
        ("model.seq_len=4096", "4096 is longer than the teacher's seq_len"),
        ("model.vocab_size=300", "the teacher's vocab_size 256 differs"),
    ):
        out = enlace(teacher, "check-config", "stud", "--set", item, check=False)
        assert out.returncode == 2 and out.stderr.startswith(f"Error: --set: {item.split('=')[0]}: {said}"), out.stderr
    enlace(teacher, "train", "stud", "--until", "4")
    enlace(teacher, "train", "teach", "--set", "training.max_steps=7")  # the teacher trained on: a new latest
    out = enlace(teacher, "train", "stud", check=False)
    assert out.returncode == 2 and "the teacher changed" in out.stderr and "--allow-teacher-change" in out.stderr

    # what verify asks before a launch (data-files --against-checkpoint): the same refusal, without torch's load,
    # naming the teacher checkpoint to put back; --allow-data-change does not silence it (it did), nor does a
    # --resume PATH (it was not asked); a teacher given to a run that had none is a change too (none then)
    def refused(run: str, *args: str) -> str | None:
        out = enlace(teacher, "data-files", run, "--json", "--against-checkpoint", *args)
        return json.loads(out.stdout)["changed"]

    for args in (("latest",), ("latest", "--allow-data-change"), ("checkpoints/step-000004",)):
        said = refused("stud", *args) or ""
        assert said.startswith("the teacher changed: stud's checkpoint step-000004 was distilled from teacher"), said
        assert "(--set distill.teacher=runs/teach/checkpoints/step-000006)" in said, said  # the one it began with
    assert refused("stud", "latest", "--allow-teacher-change") is None
    said = refused("teach", "latest", "--set", "distill.teacher=stud") or ""
    assert "the teacher changed: teach's checkpoint step-000007 was distilled from teacher none" in said, said
    enlace(teacher, "train", "stud", "--allow-teacher-change")
    assert run_json(teacher / "runs" / "stud")["status"] == "finished"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "mistyped", "latest", "itself", "incomplete"])
def test_missing_or_incomplete_teacher_is_one_line_exit_2(teacher, case):
    """A mistyped name was told to train a run of that name; `checkpoints/latest` (a file) was a NotADirectoryError."""
    said = {
        "missing": "has no complete checkpoint",
        "mistyped": "no run 'teacj' here — did you mean 'teach'?",
        "latest": "(a file, not a checkpoint directory — name checkpoints/step-N) — name the run (teach: its newest",
        "itself": "'stud' is this run itself — name another run as its teacher",
        "incomplete": "has no complete checkpoint",
    }[case]
    if case == "incomplete":
        for ckpt in (teacher / "runs" / "teach" / "checkpoints").glob("step-*"):
            (ckpt / "MANIFEST").unlink()
        write_run(teacher, "stud", **STUDENT)
    else:
        ref = {"missing": "nobody", "mistyped": "teacj", "latest": "runs/teach/checkpoints/latest", "itself": "stud"}
        ref = ref[case]
        write_run(teacher, "stud", **{**STUDENT, "distill": {"teacher": ref}})
    for verb in ("check-config", "train"):
        out = enlace(teacher, verb, "stud", check=False)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and "distill.teacher" in lines[0], out.stderr
        assert "configs/runs/stud.yaml" in lines[0] and said in lines[0], lines[0]


def test_a_scripts_own_checkpoint_is_no_teacher_and_check_config_says_so(project):
    """A run of a script of your own (enlace.job) has complete checkpoints of its own files: as a teacher it
    passed check-config and verify, and failed once training started."""
    from enlace.train.checkpoint import save_checkpoint

    save_checkpoint(project / "runs" / "scripted" / "checkpoints", 20, {"state.pt": {"step": 20}}, 1)
    write_run(project, "stud", **{**STUDENT, "distill": {"teacher": "scripted"}})
    out = enlace(project, "check-config", "stud", check=False)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "not a checkpoint of enlace's trainer" in lines[0], out.stderr
    assert "distill.teacher" in lines[0] and "it lacks model.pt and trainer.pt" in lines[0], out.stderr


def test_verify_names_a_missing_teacher_before_launch(sshd, user_repo):
    write_run(user_repo, "stud", **{**STUDENT, "distill": {"teacher": "tiny"}}, data="tiny")
    from support.repocopy import commit_all

    commit_all(user_repo, "student")
    tiny_corpus(server_dir(sshd, "local"))
    out = remote(user_repo, sshd.env, "launch", "stud", host="local", check=False)
    assert out.returncode == 3 and "distill.teacher" in out.stderr and "enlace train tiny" in out.stderr
    # its teacher trained further: the student's resume is refused before its preflight and start (it failed as it
    # started, after the preflight, and a finished student read `failed`)
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", "--until", "2", "--follow", host="local")
    remote(user_repo, sshd.env, "launch", "stud", "--no-preflight", "--until", "4", "--follow", host="local")
    remote(user_repo, sshd.env, "launch", "tiny", "--no-preflight", "--until", "4", "--follow", host="local")
    out = remote(user_repo, sshd.env, "launch", "stud", host="local", check=False)
    assert out.returncode == 2 and "stud on local: the teacher changed: stud's checkpoint step-000004" in out.stderr
    assert "launch --allow-teacher-change" in out.stderr and "preflight" not in out.stdout, out.stderr
    assert run_json(server_dir(sshd, "local") / "runs" / "stud")["status"] == "stopped"  # nothing started
    out = remote(user_repo, sshd.env, "launch", "stud", "--no-preflight", "--allow-teacher-change", host="local")
    assert "resumed from checkpoints/step-000004" in out.stderr, out.stderr
    remote(user_repo, sshd.env, "stop", "stud", host="local")


@pytest.mark.slow
def test_generate_writes_shards_a_run_trains_on_and_is_seeded(teacher):
    for name in ("gen-a", "gen-b"):
        enlace(
            teacher,
            "generate",
            "teach",
            "--bytes",
            "6000",
            "--out",
            str(teacher / "data" / name),
            "--seed",
            "7",
            "--streams",
            "8",
        )
    a, b = (sorted((teacher / "data" / n).iterdir()) for n in ("gen-a", "gen-b"))
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]  # same seed, same bytes
    # a stopped generate's text is kept for the same arguments only: others are refused, the text stays (another
    # --bytes threw it away in silence), and a second generate at the same OUT is refused while one writes
    partial = teacher / "data" / "gen-c.partial"
    partial.mkdir()
    (partial / "stream-0000.bin").write_bytes(b"minutes of a teacher's text")
    held = {"teacher": "0" * 64, "bytes": 60000, "streams": 1, "temperature": 1.0, "seed": 7}
    (partial / "generate.json").write_text(json.dumps(held))
    again = ["generate", "teach", "--bytes", "50000", "--out", str(teacher / "data" / "gen-c"), "--streams", "1"]
    out = enlace(teacher, *again, "--seed", "7", check=False)
    assert out.returncode == 2 and "holds an interrupted generate of other arguments (teacher 000000000000 then" in (
        out.stderr
    ), out.stderr
    assert "bytes 60000 then, 50000 now" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert (partial / "stream-0000.bin").read_bytes() == b"minutes of a teacher's text"
    import fcntl

    with open(teacher / "data" / ".gen-d.generate-lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a generate at data/gen-d holds it
        out = enlace(teacher, *again[:5], str(teacher / "data" / "gen-d"), check=False)
        assert out.returncode == 7 and "another generate is writing" in out.stderr, out.stderr  # as a live run's
    assert not (teacher / "data" / "gen-d.partial").exists()
    (teacher / "configs" / "data" / "gen.yaml").write_text("kind: shards\nshard_dir: data/gen-a\n")
    write_run(teacher, "ongen", data="gen", training={"max_steps": 4, "eval_every": 0, "batch_size": 2})
    enlace(teacher, "train", "ongen")
    assert run_json(teacher / "runs" / "ongen")["status"] == "finished"
