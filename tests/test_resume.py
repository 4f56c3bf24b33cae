"""Exact resume: 2N steps straight == N + resume in a new process + N, byte for byte.

Negative tests tamper with a checkpoint (RNG or data position reset to a fresh start's) and show
the comparison then fails — the exactness check can fail."""

from __future__ import annotations

import json

import pytest
import torch
from support.cli import enlace, run_json
from support.configs import DETERMINISTIC, write_run

from enlace.preflight.verify_resume import compare_states
from enlace.train import determinism
from enlace.train.checkpoint import load_checkpoint, save_checkpoint

RESUME_RUN = {
    **DETERMINISTIC,
    "model": {"dropout": 0.1},
    "training": {"grad_accum": 2, "eval_every": 3, "max_steps": 40},
}


@pytest.fixture
def shard_project(project):
    enlace(project, "prepare", "tiny", "--out", str(project / "data" / "tinyshards"), "--shard-tokens", "8192")
    (project / "configs" / "data" / "tinyshards.yaml").write_text("kind: shards\nshard_dir: data/tinyshards\n")
    return project


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["bytes", "shards", "fp16"])
def test_verify_resume_is_identical(shard_project, variant):
    extra = {"data": "tinyshards"} if variant == "shards" else {}
    if variant == "fp16":  # autocast fp16 + GradScaler work on torch's CPU backend
        extra["runtime"] = {"deterministic": True, "precision": "fp16"}
    write_run(shard_project, "det", **{**RESUME_RUN, **extra})
    out = enlace(shard_project, "verify-resume", "det", "--steps", "12", "--json")
    report = json.loads(out.stdout)
    assert report["ok"] and report["identical"] and report["losses_identical"], report
    assert report["tensors"] > 30 and report["losses_compared"] == 6


def _train(project, runs, until, fresh):
    args = ("train", "det", "--runs-dir", str(runs), "--until", str(until), "--set", "training.log_every=1")
    enlace(project, *args, fresh=fresh)


def _tamper(ckpt, edit):
    files = load_checkpoint(ckpt)
    edit(files["trainer.pt"]["ranks"][0])
    save_checkpoint(ckpt.parent, files["trainer.pt"]["step"], files, keep=5)


def _final(runs, n):
    return load_checkpoint(runs / "det" / "checkpoints" / f"step-{n:06d}")


@pytest.mark.slow
@pytest.mark.parametrize("dropped", ["none", "rng", "data"])
def test_dropping_state_breaks_exactness(project, tmp_path, dropped):
    write_run(project, "det", **RESUME_RUN)
    n, a, b = 5, tmp_path / "A", tmp_path / "B"
    fresh = dropped == "none"  # three new interpreters (own hash seeds): the claim is across processes
    _train(project, a, 2 * n, fresh)  # straight
    _train(project, b, n, fresh)

    def fresh_rng(rank):
        determinism.seed_everything(1337)
        rank["rng"] = determinism.rng_state()

    def fresh_data(rank):
        rank["data"]["position"] = 0

    if dropped != "none":
        _tamper(b / "det" / "checkpoints" / f"step-{n:06d}", fresh_rng if dropped == "rng" else fresh_data)
    _train(project, b, 2 * n, fresh)  # resumed
    report = compare_states(_final(a, 2 * n), _final(b, 2 * n))
    assert report["identical"] is (dropped == "none"), report
    if dropped != "none":
        assert report["first_difference"]["name"].startswith(("model.", "optimizer."))


def test_checkpoint_loads_weights_only_and_holds_all_state(project, tmp_path):
    write_run(project, "det", **RESUME_RUN)
    enlace(project, "train", "det", "--until", "3")
    ckpt = project / "runs" / "det" / "checkpoints" / "step-000003"
    for name in ("model.pt", "optimizer.pt", "trainer.pt"):
        torch.load(ckpt / name, weights_only=True)  # raises if anything needs pickled code
    trainer = load_checkpoint(ckpt)["trainer.pt"]
    assert {"step", "tokens", "scaler", "ranks", "config", "fingerprint", "commit", "torch", "threads"} <= set(trainer)
    assert set(trainer["ranks"][0]["rng"]) == {"python", "numpy", "torch", "cuda"}
    assert trainer["threads"] == 1 and trainer["step"] == 3


@pytest.mark.slow
def test_resume_with_a_different_model_is_refused_naming_the_field(project):
    write_run(project, "det", **RESUME_RUN)
    enlace(project, "train", "det", "--until", "2")
    out = enlace(project, "train", "det", "--set", "model.d_model=64", "--set", "model.n_head=2", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "model.d_model=32" in out.stderr and "64" in out.stderr and "--resume none" in out.stderr


@pytest.mark.slow
def test_keep_bounds_checkpoints_and_resume_flag(project):
    write_run(project, "keep", checkpoint={"every": 1, "keep": 2}, training={"max_steps": 6})
    out = enlace(project, "train", "keep")
    ckpts = sorted(p.name for p in (project / "runs" / "keep" / "checkpoints").iterdir())
    assert ckpts == ["latest", "step-000005", "step-000006"]
    assert "no complete checkpoint: starting from step 0" in out.stdout
    out = enlace(project, "train", "keep", "--resume", str(project / "runs" / "keep" / "checkpoints" / "step-000005"))
    assert "resumed from checkpoints/step-000005 at step 5" in out.stdout
    bad = enlace(project, "train", "keep", "--resume", str(project / "nowhere"), check=False)
    assert (
        bad.returncode == 2
        and "(no such directory) — complete checkpoints of this run: checkpoints/step-000005, checkpoints/step-000006"
        in bad.stderr
    )
    # a run that never started: refused before its directory is made (it was left with a `failed` run.json); an
    # empty --resume is refused as such (it passed verify's check as "a complete checkpoint")
    write_run(project, "never")
    bad = enlace(project, "train", "never", "--resume", "/etc", check=False)
    assert bad.returncode == 2 and "--resume /etc: not a complete checkpoint" in bad.stderr, bad.stderr
    assert not (project / "runs" / "never").exists()
    bad = enlace(project, "train", "keep", "--resume", "", check=False)
    assert bad.returncode == 2 and "Invalid value for '--resume': an empty value" in bad.stderr, bad.stderr


def test_deterministic_with_compile_refused_at_load(project):
    write_run(project, "dc", runtime={"deterministic": True, "compile": True})
    out = enlace(project, "train", "dc", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "runtime.compile" in out.stderr


@pytest.mark.slow
def test_an_extended_run_resumes_with_a_plain_train_and_keeps_its_schedule(project):
    """`--set training.max_steps=M` on a finished run extends it; the override lives with the run, so a plain
    `train RUN` after a stop resumes it (it was refused: 'the checkpoint was made with max_steps=10'); the
    learning rate keeps the run's own cosine (min_lr after its end), said in train.log — never a jump."""
    from support.cli import metrics, run_json

    write_run(project, "ext", training={"max_steps": 6, "eval_every": 0}, checkpoint={"every": 2, "keep": 3})
    enlace(project, "train", "ext")
    enlace(project, "train", "ext", "--set", "training.max_steps=10", "--until", "8")
    assert run_json(project / "runs" / "ext")["status"] == "stopped"
    at = json.loads(enlace(project, "check-config", "ext", "--json", "--set", "training.max_steps=8").stdout)
    assert "at step 8, and training.max_steps=8 is not above it" in at["resume_problem"]  # (it passed, then failed)
    out = enlace(project, "train", "ext")  # plain: the run's recorded --set applies
    state = run_json(project / "runs" / "ext")
    assert state["status"] == "finished" and state["step"] == 10, out.stdout[-2000:]
    log = (project / "runs" / "ext" / "train.log").read_text()
    assert "this run's own --set training.max_steps=10 (recorded in run.json" in log
    assert "the learning rate keeps the run's schedule (cosine to min_lr 0.0003 at step 6); steps 7-10 train" in log
    lrs = {m["step"]: m["lr"] for m in metrics(project / "runs" / "ext", "train")}
    assert lrs[6] > lrs[7] == lrs[8] == lrs[9] == lrs[10] == 3e-4  # the cosine's end, then min_lr: no jump back up
    fresh = enlace(project, "check-config", "ext", "--json", "--set", "model.n_layer=3")
    problem = json.loads(fresh.stdout)["resume_problem"]
    assert "ext's checkpoints were trained with model.n_layer=2, this config gives 3" in problem
    # seen: the start-afresh command dropped this --set and the recorded ones: it started another config
    assert problem.endswith(
        "enlace-remote launch ext --set training.max_steps=10 --set model.n_layer=3 --resume none"
    ), problem
    # a max_steps below the newest checkpoint's step: said as such (it read as another config's, "resume with the
    # same training.max_steps", where any M above the step extends it), before a launch and by the trainer
    lower = json.loads(enlace(project, "check-config", "ext", "--json", "--set", "training.max_steps=8").stdout)
    assert lower["resume_problem"].startswith(
        "ext's newest checkpoint is at step 10, and training.max_steps=8 is not above it: nothing to train — extend"
    ) and lower["resume_problem"].endswith("--set training.max_steps=8 --resume none"), lower["resume_problem"]
    out = enlace(project, "train", "ext", "--set", "training.max_steps=8", check=False)
    assert (
        out.returncode == 2 and "the checkpoint is at step 10, and training.max_steps=8 is not above it" in out.stderr
    )
    # its recorded max_steps (10) at the step: resumes to say it is finished; another equal to the step is refused
    assert json.loads(enlace(project, "check-config", "ext", "--json").stdout)["resume_problem"] is None
    # what verify checks for `launch ext --resume none`: the config without the recorded --set, and no word
    # that they apply (verify said they did, then the launch started without them, as documented)
    afresh = json.loads(enlace(project, "check-config", "ext", "--json", "--fresh").stdout)
    assert afresh["config"]["training"]["max_steps"] == 6 and afresh["warnings"] == [], afresh["warnings"]
    enlace(project, "train", "ext", "--set", "training.max_steps=12", "--until", "4")  # --until behind the step:
    log = (project / "runs" / "ext" / "train.log").read_text()  # raising max_steps, as it said, changes nothing
    assert "nothing to train: at step 10 of 12 (--until 4) — give --until above 10, or none" in log


@pytest.mark.slow
def test_resume_on_different_data_is_refused_with_the_override(project):
    write_run(project, "d", training={"max_steps": 4, "eval_every": 0}, checkpoint={"every": 2})
    enlace(project, "train", "d", "--until", "2")
    extra = project / "data" / "tiny" / "zz-extra.txt"
    extra.write_text("another machine's stdlib has one more file\n")
    out = enlace(project, "train", "d", check=False)
    assert out.returncode == 2 and "the data differs from the checkpoint's" in out.stderr
    assert "--allow-data-change" in out.stderr
    out = enlace(project, "train", "d", "--allow-data-change")
    assert run_json(project / "runs" / "d")["status"] == "finished"
    # said where the run's story is kept: this resume is not exact (docs/data.md promises it)
    assert "resuming on other data than the checkpoint's" in (project / "runs" / "d" / "train.log").read_text()
