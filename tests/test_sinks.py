"""The optional metric sinks (enlace/train/sinks.py) with the real packages: TensorBoard's event files read back
with TensorBoard's own reader, W&B in offline mode; across a stop and a resume from an older checkpoint;
and a sink that fails drops out with one line in train.log while training goes on."""

from __future__ import annotations

import pytest
from support.cli import enlace, metrics, run_json
from support.configs import write_run

TRAIN_TAGS = ("train/loss", "train/lr", "train/tokens_per_s", "train/grad_norm", "train/scale", "train/skipped")


def _scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_has_one_scalar_per_logged_step_across_a_stop_and_an_older_resume(project):
    write_run(
        project,
        "tb",
        training={"max_steps": 8, "log_every": 1, "eval_every": 4},
        checkpoint={"every": 2, "keep": 5},
        logging={"tensorboard": True},
    )
    enlace(project, "train", "tb", "--until", "6")  # stops at 6
    # resumed from an older checkpoint: a new line, whose metrics.jsonl keeps steps 1-4 (the line left's 5 and 6
    # are set aside with its checkpoints); TensorBoard's event files hold both, each step's latest shown
    enlace(project, "train", "tb", "--resume", "checkpoints/step-000004")
    run = project / "runs" / "tb"
    logged = metrics(run, "train")
    assert [m["step"] for m in logged] == [1, 2, 3, 4, 5, 6, 7, 8]
    (aside,) = (run / "checkpoints-set-aside").iterdir()
    assert [m["step"] for m in metrics(aside, "train")] == [1, 2, 3, 4, 5, 6]
    acc = _scalars(run)
    assert set(TRAIN_TAGS) <= set(acc.Tags()["scalars"])
    last = {m["step"]: m for m in logged}  # the run as it stands: each step's latest record
    for tag in TRAIN_TAGS:
        events = acc.Scalars(tag)
        assert [e.step for e in events] == list(range(1, 9)), tag
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx([last[s]["loss"] for s in range(1, 9)])
    assert [e.step for e in acc.Scalars("eval/val_bpb")] == [4, 8]  # the evals at 0 is logged before any step
    assert any(t.startswith("config") for t in acc.Tags()["tensors"])  # the resolved config, as text


def test_wandb_offline_names_one_run_id_across_a_resume(project):
    write_run(
        project,
        "wb",
        training={"max_steps": 6, "log_every": 1, "eval_every": 0},
        logging={"wandb": "offline", "wandb_project": "enlace-test"},
    )
    env = {"WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true", "WANDB_DIR": str(project / "wandb-home")}
    enlace(project, "train", "wb", "--until", "3", env=env, fresh=True)
    run = project / "runs" / "wb"
    run_id = run_json(run)["wandb_id"]
    enlace(project, "train", "wb", env=env, fresh=True)
    assert run_json(run)["wandb_id"] == run_id
    offline = sorted((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(d.name.endswith("-" + run_id) for d in offline), offline
    assert all((d / f"run-{run_id}.wandb").is_file() for d in offline)
    assert metrics(run, "train")[-1]["step"] == 6


def test_a_failing_sink_is_said_once_and_training_goes_on(project):
    """The TensorBoard directory cannot be created (a file stands in its way): one line, then training."""
    write_run(project, "broken", training={"max_steps": 4, "log_every": 1}, logging={"tensorboard": True})
    run = project / "runs" / "broken"
    run.mkdir(parents=True)
    (run / "tensorboard").write_text("in the way")
    enlace(project, "train", "broken")
    log = (run / "train.log").read_text()
    assert log.count("logging.tensorboard failed") == 1, log
    assert run_json(run)["status"] == "finished" and [m["step"] for m in metrics(run, "train")] == [1, 2, 3, 4]


def test_a_sink_without_its_package_is_a_config_error_before_the_run(project, monkeypatch):
    import importlib.util

    from enlace.config.machine import check_environment
    from enlace.config.schema import load_config
    from enlace.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    write_run(project, "nowb", logging={"wandb": "online"})
    with pytest.raises(ConfigError, match=r"logging.wandb.*not installed.*pip install 'enlace\[wandb\]'"):
        check_environment(load_config("nowb", root=project))
