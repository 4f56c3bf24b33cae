"""Checkpoints under faults: a full disk, broken or incomplete MANIFESTs, a corrupt newest checkpoint — each
named, with the way to resume from the one before."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from support.cli import enlace, run_json
from support.configs import write_run
from support.writes import file_write_sizes


@pytest.fixture
def small_disk(tmp_path):
    """A 1.2 MiB tmpfs: room for two tiny checkpoints, not three (needs root and mount)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root): the disk-full test needs a real small filesystem")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
def test_disk_full_during_a_checkpoint_fails_the_run_clearly_and_relaunch_refuses(project, small_disk):
    write_run(project, "full", checkpoint={"every": 2, "keep": 10}, training={"max_steps": 200, "eval_every": 0})
    # ≈0.4 MiB a checkpoint: two fit (train checks that before it starts), the third cannot
    out = enlace(project, "train", "full", "--runs-dir", str(small_disk), check=False)
    run_dir = small_disk / "full"
    state = run_json(run_dir)
    assert out.returncode == 9, out.stdout[-2000:] + out.stderr[-2000:]
    assert state["status"] == "failed" and state["exit_code"] == 9
    assert state["error"].startswith("No space left on device while saving step-") and "MiB free" in state["error"]
    assert "needs ≈" in state["error"] and "Traceback" not in out.stderr
    assert "error: No space left on device while saving" in (run_dir / "train.log").read_text()
    assert not [p for p in run_dir.rglob(".*tmp*")], list(run_dir.rglob(".*tmp*"))  # no temp file left behind
    assert run_json(run_dir)["step"] >= 2  # the earlier checkpoints are intact and complete
    from enlace.manifest import latest_checkpoint
    from enlace.train.checkpoint import verify_checkpoint

    verify_checkpoint(latest_checkpoint(run_dir / "checkpoints"))
    again = enlace(project, "train", "full", "--runs-dir", str(small_disk), check=False)
    assert again.returncode == 9 and "2 checkpoints need" in again.stderr, again.stderr  # refused before training
    assert run_json(run_dir)["status"] == "failed"


def _three_checkpoints(project, name="ck"):
    write_run(project, name, checkpoint={"every": 2, "keep": 5}, training={"max_steps": 6, "eval_every": 0})
    enlace(project, "train", name)
    return project / "runs" / name / "checkpoints"


@pytest.mark.slow
def test_broken_manifests_are_named_and_a_lost_history_is_said(project):
    ckpts = _three_checkpoints(project)
    # each MANIFEST names the data its checkpoint was trained on, as trainer.pt does (verify reads it without torch)
    import torch

    from enlace.manifest import read_manifest

    trainer = torch.load(ckpts / "step-000006" / "trainer.pt", weights_only=True)
    assert read_manifest(ckpts / "step-000006")["data"] == trainer["data"] and trainer["data"]["sha256"]
    (ckpts / "step-000006" / "MANIFEST").write_text("{}")
    (ckpts / "step-000004" / "MANIFEST").write_text("{not json")
    from enlace.errors import CheckpointError
    from enlace.manifest import latest_checkpoint, read_manifest

    with pytest.raises(CheckpointError, match="MANIFEST has format version None"):
        read_manifest(ckpts / "step-000006")
    with pytest.raises(CheckpointError, match="MANIFEST is not valid JSON"):
        read_manifest(ckpts / "step-000004")
    assert latest_checkpoint(ckpts).name == "step-000002"
    (ckpts / "step-000002" / "MANIFEST").unlink()  # every checkpoint is gone now
    out = enlace(project, "train", "ck", "--set", "training.max_steps=7")
    assert "ignored (not a complete checkpoint): " in out.stdout and "MANIFEST is not valid JSON" in out.stdout
    assert "no complete checkpoint: starting from step 0" in out.stdout


@pytest.mark.slow
def test_corrupt_newest_checkpoint_names_the_previous_one_and_resume_path_continues(project):
    ckpts = _three_checkpoints(project)
    model = ckpts / "step-000006" / "model.pt"
    model.write_bytes(model.read_bytes()[:-10] + b"0123456789")
    out = enlace(project, "train", "ck", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "step-000006" in out.stderr and "--resume checkpoints/step-000004" in out.stderr, out.stderr
    out = enlace(project, "train", "ck", "--resume", "checkpoints/step-000004")
    assert "resumed from checkpoints/step-000004 at step 4" in out.stdout
    assert "checkpoints past it moved to checkpoints-set-aside/" in out.stdout  # the corrupt one is not resumed
    assert run_json(project / "runs" / "ck")["status"] == "finished"


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["manifest-deleted", "manifest-empty", "files-removed", "dir-removed"])
def test_an_incomplete_newest_checkpoint_is_said_in_status_and_train_log(project, damage):
    """`latest` names step-000006 but it is not complete: resuming from step-000004 costs 2 steps, and
    status and train.log say so, with --resume offered — never a silent step back."""
    from enlace.state import runs

    ckpts = _three_checkpoints(project)
    newest = ckpts / "step-000006"
    if damage == "manifest-deleted":
        (newest / "MANIFEST").unlink()
    elif damage == "manifest-empty":
        (newest / "MANIFEST").write_text("{}")
    elif damage == "files-removed":
        for f in newest.iterdir():
            f.unlink()
    else:
        shutil.rmtree(newest)
    said = "step-000006 is incomplete ({}): resuming from step-000004; 2 steps will be trained again"
    reason = {
        "manifest-deleted": "no MANIFEST",
        "manifest-empty": "MANIFEST has format version None; this enlace reads v1",
        "files-removed": "no MANIFEST",
        "dir-removed": "missing",
    }[damage]
    assert runs.observe(project / "runs" / "ck")["checkpoint_warning"] == said.format(reason)
    out = enlace(project, "train", "ck")
    assert "resumed from checkpoints/step-000004 at step 4" in out.stdout
    assert f"warning: {said.format(reason)} — to resume from another checkpoint: --resume" in out.stdout
    log = (project / "runs" / "ck" / "train.log").read_text()
    assert said.format(reason) in log
    assert runs.observe(project / "runs" / "ck")["checkpoint_warning"] is None  # step-000006 written anew


def test_disk_messages_name_the_real_path_not_the_trees_symlink(tmp_path):
    from enlace.errors import NoSpaceError
    from enlace.train.checkpoint import check_free_space

    (tmp_path / "remote" / "runs" / "r").mkdir(parents=True)
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "runs").symlink_to(tmp_path / "remote" / "runs")
    with pytest.raises(NoSpaceError) as e:
        check_free_space(tmp_path / "tree" / "runs" / "r" / "checkpoints", need_each=1 << 60)
    assert str(tmp_path / "remote" / "runs" / "r" / "checkpoints") in e.value.message
    assert str(tmp_path / "tree") not in e.value.message


def test_a_checkpoint_made_on_cuda_is_refused_on_cpu_in_one_line(project):
    """No GPU here: the test rewrites a CPU checkpoint as a CUDA run would have saved it (its fingerprint's
    runtime.device and a CUDA RNG state), then resumes it on the CPU. It crashed in the RNG restore
    (asking for the current CUDA device initialises CUDA), and the supervisor retried the crash 3 times."""
    import torch

    from enlace.manifest import latest_checkpoint
    from enlace.train.checkpoint import load_checkpoint, save_checkpoint

    write_run(project, "moved", training={"max_steps": 4, "eval_every": 0}, checkpoint={"every": 2, "keep": 2})
    enlace(project, "train", "moved", "--until", "2")
    ckpts = project / "runs" / "moved" / "checkpoints"
    files = load_checkpoint(latest_checkpoint(ckpts))
    trainer = files["trainer.pt"]
    trainer["fingerprint"]["runtime.device"] = "cuda"
    for rank in trainer["ranks"]:
        rank["rng"]["cuda"] = [torch.zeros(16, dtype=torch.uint8)]
    save_checkpoint(ckpts, trainer["step"], files, 2)  # complete, with a MANIFEST that matches
    out = enlace(project, "train", "moved", check=False)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "runtime.device='cuda'" in lines[0] and "--set runtime.device=cuda" in lines[0], lines[0]
    assert "--resume none" in lines[0]


def test_a_checkpoints_tensors_reach_the_disk_in_pieces_of_at_most_256_kib(tmp_path, monkeypatch):
    """torch.save gives each tensor's bytes to one write(). Linux 6.x sizes a file's page-cache folios by the
    write, and on ext4 here a large checkpoint saved that way stalled (bench/large_writes.py, docs/benchmarks.md).
    Every byte of a checkpoint goes out in pieces of 256 KiB at most."""
    import torch

    from enlace.hashing import WRITE_PIECE
    from enlace.train.checkpoint import load_checkpoint, save_checkpoint

    sizes = file_write_sizes(monkeypatch)
    state = {"w": torch.randn(3 << 18), "b": torch.arange(10)}  # 3 MiB of float32, and a small one
    ck = save_checkpoint(tmp_path, 1, {"model.pt": state}, keep=2)
    monkeypatch.undo()
    written = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())  # the checkpoint, MANIFEST, latest
    assert sizes and sum(sizes) == written and max(sizes) == WRITE_PIECE, sizes
    loaded = load_checkpoint(ck)["model.pt"]
    assert all(loaded[k].numpy().tobytes() == state[k].numpy().tobytes() for k in state)


def test_what_a_killed_save_left_is_removed_and_the_checkpoints_stay(tmp_path):
    """A save killed mid-way leaves its temp dir, a replaced step's old dir, or a `latest` not yet put in place
    (.latest.tmp-PID, once left for good after a full disk); the next start removes them, nothing else."""
    import torch

    from enlace.train.checkpoint import remove_stale_temps, save_checkpoint

    ck = save_checkpoint(tmp_path, 2, {"model.pt": {"w": torch.zeros(3)}}, keep=2)
    for name in (".tmp-step-000004-123", ".old-step-000002-77"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.pt").write_bytes(b"partial")
    (tmp_path / ".latest.tmp-456").write_bytes(b"step-000004")
    remove_stale_temps(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", ck.name]
    assert (tmp_path / "latest").read_text() == ck.name + "\n"


def test_an_explicit_resume_sets_the_later_checkpoints_aside_and_restarts_go_on_from_its_own(tmp_path):
    """--resume none or a checkpoint starts a line of history: what lies past it is moved aside (never deleted:
    one folder per line left), a checkpoint from elsewhere is linked in as this run's,
    `latest` names the start, and a restart's command line resumes from the newest once this launch's trainer
    has begun the line (enlace/server/trainerchild.py)."""
    import json

    from enlace.manifest import write_manifest
    from enlace.server.trainerchild import again_argv
    from enlace.train.checkpoint import SET_ASIDE, start_line

    def line(*steps: int) -> Path:
        root = tmp_path / f"run{len(list(tmp_path.iterdir()))}" / "checkpoints"
        for step in steps:
            (root / f"step-{step:06d}").mkdir(parents=True)
            (root / f"step-{step:06d}" / "model.pt").write_bytes(b"%d" % step)
            write_manifest(root / f"step-{step:06d}", step, ["model.pt"])
        (root / "latest").write_text(f"step-{steps[-1]:06d}\n")
        return root

    def aside(root: Path) -> list[list[str]]:
        return [sorted(p.name for p in d.iterdir()) for d in sorted((root.parent / SET_ASIDE).iterdir())]

    def names(root: Path) -> list[str]:
        return sorted(p.name for p in root.iterdir())

    root = line(5, 10, 15)  # --resume checkpoints/step-000010: 15 goes, latest names 10
    moved = start_line(root, root / "step-000010")
    assert moved.parent == root.parent / SET_ASIDE and (moved / "step-000015" / "model.pt").read_bytes() == b"15"
    assert names(root) == ["latest", "step-000005", "step-000010"] and aside(root) == [["step-000015"]]
    assert (root / "latest").read_text() == "step-000010\n"
    assert start_line(root, root / "step-000010") is None  # nothing past it: nothing moved

    root = line(5, 10)  # --resume none: all of them go, and latest
    start_line(root, None)
    assert names(root) == [] and aside(root) == [["step-000005", "step-000010"]]

    other, root = line(20), line(5, 30)  # a checkpoint of another run: this run's all go; it is linked in
    start_line(root, other / "step-000020")
    assert names(root) == ["latest", "step-000020"] and aside(root) == [["step-000005", "step-000030"]]
    assert (root / "step-000020" / "model.pt").stat().st_ino == (other / "step-000020" / "model.pt").stat().st_ino
    assert (root / "latest").read_text() == "step-000020\n"

    (root / "step-000025").mkdir()  # the new line saved; back to the line set aside: nothing is removed
    back = next((root.parent / SET_ASIDE).iterdir()) / "step-000030"
    start_line(root, back)  # the same second, the same process: a folder of its own
    assert names(root) == ["latest", "step-000030"] and (root / "step-000030" / "model.pt").read_bytes() == b"30"
    assert aside(root) == [["step-000005", "step-000030"], ["step-000020", "step-000025"]]

    root = line(5, 10, 15)  # metrics.jsonl keeps the line's records (steps up to the start), the rest aside
    records = [{"step": 0, "kind": "eval"}, {"step": 5}, {"step": 10}, {"step": 12, "kind": "start"}, {"step": 15}]
    text = "".join(json.dumps(r) + "\n" for r in records) + '{"step": 16, "lo'  # a write a kill cut short
    (root.parent / "metrics.jsonl").write_text(text)
    moved = start_line(root, root / "step-000010")
    assert (moved / "metrics.jsonl").read_text() == text  # as it was, beside the line's checkpoints
    assert [json.loads(r)["step"] for r in (root.parent / "metrics.jsonl").read_text().splitlines()] == [0, 5, 10]
    (root.parent / "metrics.jsonl").write_text(text)  # records past the start, no checkpoint: a folder for them
    only = start_line(root, root / "step-000010")
    assert only != moved and sorted(p.name for p in only.iterdir()) == ["metrics.jsonl"]
    assert start_line(root, root / "step-000010") is None  # nothing past the start any more: nothing moves
    start_line(root, None)  # --resume none: every record goes
    assert (root.parent / "metrics.jsonl").read_text() == ""

    root = line(5, 10)  # a copy named otherwise inside checkpoints/ is a start from elsewhere (it crashed)
    shutil.copytree(root / "step-000005", root / "best")
    start_line(root, root / "best")
    assert names(root) == ["best", "latest", "step-000005"] and aside(root) == [["step-000005", "step-000010"]]

    argv = [
        "python",
        "-m",
        "enlace",
        "train",
        "r",
        "--resume",
        "none",
        "--set",
        "a=--resume",
        "--resume=x",
        "--until",
        "9",
    ]
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    assert again_argv(argv, run_dir, "L1") == argv  # its trainer never began the line (it failed sooner): as given
    (run_dir / "run.json").write_text(json.dumps({"line_of": "L1"}))
    assert again_argv(argv, run_dir, "L1") == [
        "python",
        "-m",
        "enlace",
        "train",
        "r",
        "--set",
        "a=--resume",
        "--until",
        "9",
    ]
    assert again_argv(argv, run_dir, "L2") == argv and again_argv(argv, run_dir, None) == argv


def test_resume_takes_a_step_dir_as_listed_and_says_a_missing_one(tmp_path):
    """A newcomer's walk: `--resume step-000020`, copied from the refusal's list, was refused again ("no MANIFEST"),
    as was a path that does not exist; the list now names them as --resume takes them."""
    from enlace.errors import CheckpointError
    from enlace.manifest import write_manifest
    from enlace.train.checkpoint import resolve_resume

    root = tmp_path / "run" / "checkpoints"
    (root / "step-000020").mkdir(parents=True)
    (root / "step-000020" / "model.pt").write_bytes(b"20")
    write_manifest(root / "step-000020", 20, ["model.pt"])
    assert (
        resolve_resume(root, "step-000020") == resolve_resume(root, "checkpoints/step-000020") == root / "step-000020"
    )
    with pytest.raises(CheckpointError) as e:
        resolve_resume(root, "checkpoints/step-99")
    assert "(no such directory) — complete checkpoints of this run: checkpoints/step-000020" in e.value.message


@pytest.mark.slow
def test_an_explicit_resume_that_fails_moves_nothing_and_a_set_aside_line_can_be_resumed(project):
    """Seen in a fault hunt: a --resume of a checkpoint the run cannot load (another model) had already moved
    the run's own checkpoints aside, and a second try removed them; going back to a set-aside line by the path
    train.log names failed (it was moved before it loaded)."""
    import os

    ckpts = _three_checkpoints(project)  # ck: step-2, 4, 6 (d_model as the tiny config has it)
    write_run(
        project, "wide", model={"d_model": 64}, checkpoint={"every": 2}, training={"max_steps": 2, "eval_every": 0}
    )
    enlace(project, "train", "wide")
    foreign = project / "runs" / "wide" / "checkpoints" / "step-000002"
    for _ in range(2):
        out = enlace(project, "train", "ck", "--resume", str(foreign), check=False)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step-000002", "step-000004", "step-000006"]
    assert not (ckpts.parent / "checkpoints-set-aside").exists()
    before = json.loads((ckpts.parent / "run.json").read_text())
    bad = ("--set", "data.kind=shards", "--set", "data.shard_dir=data/nowhere")  # fails as it opens the data
    out = enlace(project, "train", "ck", "--resume", "none", *bad, check=False)
    assert out.returncode == 2 and not (ckpts.parent / "checkpoints-set-aside").exists(), out.stderr
    after = json.loads((ckpts.parent / "run.json").read_text())  # the line's record: the next launch inherits it
    assert (after["overrides"], after["fingerprint"]) == (before["overrides"], before["fingerprint"])
    out = enlace(project, "train", "ck", "--resume", "checkpoints/step-000002", "--until", "3")
    assert "moved to checkpoints-set-aside/" in out.stdout and "(step-000004, step-000006)" in out.stdout, out.stdout
    (aside,) = (ckpts.parent / "checkpoints-set-aside").iterdir()
    # metrics.jsonl is this line's: the records up to step 2, then its own (plot showed the line left's evals
    # and resumes); the file as it was lies beside the line's checkpoints
    steps = [json.loads(line)["step"] for line in (ckpts.parent / "metrics.jsonl").read_text().splitlines()]
    left = [json.loads(line)["step"] for line in (aside / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 3 and steps[steps.index(3) - 1] <= 2 and max(left) == 6, (steps, left)
    out = enlace(project, "train", "ck", "--resume", f"checkpoints-set-aside/{aside.name}/step-000006")
    assert "resumed from" in out.stdout and "at step 6" in out.stdout, out.stdout  # back on the line left
    # ... with its history, which its folder kept (a newcomer's walk: plot drew one point, at step 6)
    restored = (ckpts.parent / "metrics.jsonl").read_text().splitlines()
    history = [line for line in (aside / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= 6]
    assert len(history) > 3 and restored[: len(history)] == history, (restored, history)
    assert run_json(project / "runs" / "ck")["status"] == "finished"
    # a hand `train --resume` beside a live trainer of the run is refused before anything moves
    run_json_path = ckpts.parent / "run.json"
    doc = json.loads(run_json_path.read_text())
    from enlace.state.runs import proc_start

    run_json_path.write_text(json.dumps({**doc, "pid": os.getppid(), "pid_start": proc_start(os.getppid())}))
    out = enlace(project, "train", "ck", "--resume", "none", check=False)
    assert out.returncode == 7 and "is live (its trainer" in out.stderr and "stop it first" in out.stderr, out.stderr
