"""A short real training run on CPU: the loss falls and the run directory is complete."""

from __future__ import annotations

import pytest
import yaml
from support.cli import enlace, metrics, run_json
from support.configs import write_run


def test_short_run_lowers_loss_and_leaves_a_complete_run_dir(project):
    write_run(project, "tiny", training={"max_steps": 40, "eval_every": 20, "log_every": 5}, model={"dropout": 0.0})
    out = enlace(project, "train", "tiny")
    run = project / "runs" / "tiny"
    for name in ("config.yaml", "run.json", "train.log", "metrics.jsonl", "checkpoints/latest"):
        assert (run / name).is_file(), name
    evals = metrics(run, "eval")
    assert [e["step"] for e in evals] == [0, 20, 40]
    assert evals[-1]["val_bpb"] < evals[0]["val_bpb"] - 1.0  # from ~8 bits per byte down by > 1
    state = run_json(run)
    assert state["status"] == "finished" and state["exit_code"] == 0 and state["step"] == 40
    assert state["pid"] > 0 and state["torch"].startswith("2.")
    assert 0 < state["last_save_s"] < 60  # the last save's seconds: what a stop's default grace is sized from
    assert yaml.safe_load((run / "config.yaml").read_text())["run_name"] == "tiny"
    log = (run / "train.log").read_text()
    assert "step     40/40" in log and "tok/s" in log and "params" in log
    assert "step     40/40" in out.stdout  # echoed to the terminal too
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000040"
    summary = metrics(run, "summary")[-1]
    assert summary["peak_rss_mib"] > 100 and summary["tokens_per_s"] > 0


@pytest.mark.slow
def test_finished_run_restarted_does_nothing_more(project):
    write_run(project, "again", training={"max_steps": 6})
    enlace(project, "train", "again")
    out = enlace(project, "train", "again")
    assert "resumed from checkpoints/step-000006" in out.stdout
    assert [m["step"] for m in metrics(project / "runs" / "again", "train")] == [1, 2, 3, 4, 5, 6]


def test_missing_corpus_fails_cleanly_and_marks_run_failed(project):
    (project / "configs" / "data" / "gone.yaml").write_text("kind: bytes\npaths: ['data/gone/*.txt']\n")
    write_run(project, "nodata", data="gone")
    out = enlace(project, "train", "nodata", "--set", "training.max_steps=7", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "data/gone/*.txt" in out.stderr
    st = run_json(project / "runs" / "nodata")
    # a start cut short before its checkpoint step, with no checkpoint that could refuse its --set items, keeps them
    # as the run's (a plain launch dropped them); where a checkpoint refuses them they are not (test_remote_ddp.py)
    assert st["status"] == "failed" and st["overrides"] == ["training.max_steps=7"], st
    enlace(project, "train", "nodata", "--set", "training.max_steps=9", check=False)
    assert run_json(project / "runs" / "nodata")["overrides"] == ["training.max_steps=9"]


def test_cuda_profile_on_a_cpu_machine_says_how_to_fix(project):
    write_run(project, "gpu", profile="rtx2060")
    out = enlace(project, "train", "gpu", check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "--set runtime.device=cpu" in out.stderr


def test_deterministic_mode_is_switched_on_and_off_without_importing_the_compiler():
    """determinism.configure sets torch's deterministic flag both ways; it does so without
    torch.use_deterministic_algorithms's import of torch._inductor (≈1.3 s at every trainer start)."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from enlace.train import determinism\n"
        "from enlace.config.schema import RuntimeConfig\n"
        "cpu = torch.device('cpu')\n"
        "determinism.configure(RuntimeConfig(deterministic=True), cpu)\n"
        "on = torch.are_deterministic_algorithms_enabled()\n"
        "determinism.configure(RuntimeConfig(deterministic=False), cpu)\n"
        "print(on, torch.are_deterministic_algorithms_enabled(), 'torch._inductor' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False", "False"], out.stdout + out.stderr


def test_train_step_frees_the_logits_before_backward(project):
    """backward does not need the (B, T, V) logits: train_step drops them before it starts, so they
    do not sit beside backward's own peak (on a GPU, the step's peak memory)."""
    import weakref

    import torch

    from enlace.config.schema import load_config
    from enlace.train import engine

    write_run(project, "step")
    setup = engine.build_setup(load_config("step", [], root=project))
    logits = []  # a weak reference to each forward's logits
    setup.model.register_forward_hook(lambda _module, _args, out: logits.append(weakref.ref(out[0])))
    alive = {}

    def phase(name):
        if logits:  # "forward" is announced before the forward runs
            alive[name] = logits[-1]() is not None

    x = torch.randint(0, 256, (2, 8))
    engine.train_step(setup, 0, lambda: (x, x), phase)
    assert alive == {"backward": False, "optimizer step": False, "done": False}
