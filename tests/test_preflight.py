"""Preflight on CPU: every figure present, OOM under a memory cap, fp16 instability, max batch."""

from __future__ import annotations

import json
import re
import time

import pytest
from support.cli import enlace
from support.configs import write_run

from enlace.units import duration


def _preflight(project, run, *args, check=False):
    steps = () if "--steps" in args else ("--steps", "3")
    out = enlace(project, "preflight", run, "--json", *steps, *args, check=check)
    return out, json.loads(out.stdout)


@pytest.mark.slow
def test_report_has_every_figure_and_needs_no_corpus(project):
    (project / "configs" / "data" / "absent.yaml").write_text("kind: bytes\npaths: ['data/not-here/*.txt']\n")
    write_run(project, "pf", data="absent")
    out, rep = _preflight(project, "pf")
    assert out.returncode == 0, out.stderr
    assert rep["verdict"] in ("ok", "tight")
    tp, mem, fp16, env = rep["throughput"], rep["memory"], rep["fp16"], rep["environment"]
    assert 0 < tp["median_step_s"] <= tp["p90_step_s"] and tp["tokens_per_s"] > 0
    assert tp["projected_s"] > 0 and tp["projected"] == duration(tp["projected_s"]) and tp["checkpoint_save_s"] > 0
    assert mem["kind"] == "cpu" and mem["peak_rss_mib"] > 100 and 0 < mem["headroom_pct"] < 100
    assert fp16 == {
        "skip_rate": "n/a",
        "skips_after_calibration": "n/a",
        "final_scale": "n/a",
        "nonfinite_losses": "n/a",
    }
    assert env["precision"] == "fp32" and env["torch"].startswith("2.") and env["params"] > 0
    saved = json.loads((project / "runs" / "pf" / "preflight.json").read_text())
    assert saved == rep
    human = enlace(project, "preflight", "pf", "--steps", "2").stdout
    for label in ("memory", "step time", "throughput", "projected", "fp16", "verdict"):
        assert label in human


def test_batch_that_does_not_fit_is_oom_with_its_exit_code_and_phase(project):
    write_run(project, "big", model={"seq_len": 256, "d_model": 128, "n_head": 4}, training={"batch_size": 64})
    out, rep = _preflight(project, "big", "--memory-limit", "600MiB")
    assert out.returncode == 5 and "Traceback" not in out.stderr
    assert rep["verdict"] == "oom" and rep["oom_phase"] in ("forward", "backward", "optimizer step", "eval", "save")
    assert "batch_size" in rep["suggestion"]


def test_fp16_with_absurd_scale_is_unstable_with_its_exit_code(project):
    # torch's CPU backend supports fp16 autocast + GradScaler (torch 2.13): no skip needed.
    write_run(project, "fp16", runtime={"precision": "fp16", "fp16_init_scale": 2.0**40})
    out, rep = _preflight(project, "fp16")
    assert out.returncode == 6, out.stderr
    assert rep["verdict"] == "unstable" and rep["fp16"]["skip_rate"] > 0.5
    assert rep["fp16"]["final_scale"] < 2.0**40  # the scaler halved on every skipped step


def test_fp16_with_sane_scale_is_not_unstable(project):
    write_run(project, "fp16ok", runtime={"precision": "fp16"})
    out, rep = _preflight(project, "fp16ok")
    assert out.returncode == 0 and rep["fp16"]["skip_rate"] == 0.0


@pytest.mark.slow
@pytest.mark.longest
def test_max_batch_finds_the_boundary(project):
    write_run(project, "mb", model={"seq_len": 256, "d_model": 128, "n_head": 4}, training={"batch_size": 4})
    out, rep = _preflight(project, "mb", "--memory-limit", "700MiB", "--max-batch")
    mb = rep["max_batch"]
    step = mb["resolution"]  # 1 below 64, then a power of two from 8 within 1/16 of the batch
    assert step == 1 if mb["batch_size"] < 64 else 8 <= step <= max(8, mb["batch_size"] // 16), mb
    assert mb["batch_size"] >= 4 and mb["batch_size"] < mb["first_failing"] <= mb["batch_size"] + step, mb
    assert mb["tokens_per_s"] > 0 and mb["probes"] >= 2
    limit = ("--memory-limit", "700MiB", "--steps", "1")  # the probes' own settings
    _, above = _preflight(project, "mb", *limit, "--set", f"training.batch_size={2 * mb['batch_size']}")
    assert above["verdict"] == "oom"


@pytest.mark.parametrize(("step_s", "budget_s"), [(5.0, 1.0), (0.2, 2.0)], ids=["one-step-past", "projected-past"])
def test_preflight_gives_up_at_its_own_budget_with_the_runs_projection(project, monkeypatch, step_s, budget_s):
    """A step that takes minutes (fp16 on a CPU took 643 s for one warm-up step) ends preflight at its budget
    with verdict too_slow (exit 10), never hours later: inside one long step (its alarm), or as soon as the
    measured steps project past it. The steps are made slow by sleeping in a stand-in train_step."""

    from enlace import contract
    from enlace.config.schema import load_config
    from enlace.preflight.measure import preflight
    from enlace.train import engine

    real_step = engine.train_step

    calls = []

    def slow_step(*args, **kwargs):
        calls.append(1)
        time.sleep(step_s)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(engine, "train_step", slow_step)
    write_run(project, "slow", runtime={"precision": "fp16"})
    rep = preflight(load_config("slow", root=project), steps=20, budget_s=budget_s)
    assert len(calls) < 20  # the report came at the budget, before the 20 measured steps (and warm-up) ran
    assert rep["verdict"] == "too_slow" and contract.VERDICT["too_slow"] == 10
    assert "fp16 on a CPU is ≈20x slower: --set runtime.precision=fp32" in rep["suggestion"]
    if step_s > budget_s:
        assert "not one step finished within preflight's 1 s budget" in rep["suggestion"]
    else:
        assert rep["too_slow"]["step_s"] >= 0.2 and "the run's 20 steps would take" in rep["suggestion"]


def test_a_gpu_profile_on_a_machine_without_one_hints_at_runs_that_work_here(project):
    """Said where the device is picked (preflight, train): a Slurm login node has no GPU either."""
    from enlace.config.machine import check_environment
    from enlace.config.schema import load_config
    from enlace.errors import ConfigError
    from enlace.train.dist import Dist
    from enlace.train.engine import resolve_device

    check_environment(load_config("smoke-2060", root=project))  # check-config/verify: no device question
    with pytest.raises(ConfigError) as e:
        resolve_device(load_config("smoke-2060", root=project), Dist())
    assert "runtime.device: is cuda but no CUDA device is visible here" in e.value.message
    assert "a CPU run config instead (e.g. smoke-cpu" in e.value.message
    assert "--set runtime.device=cpu --set runtime.precision=fp32" in e.value.message
    sets = ["runtime.device=cpu", "runtime.precision=fp32"]
    assert resolve_device(load_config("smoke-2060", sets, root=project), Dist()).type == "cpu"  # the hint works


@pytest.mark.slow
def test_the_projected_figure_and_its_words_agree_at_a_rounding_edge(project):
    """0.96 s rounded to 1.0 in projected_s while `projected` said 0m00s (a CI run met it): one number."""
    from enlace.config.schema import load_config
    from enlace.preflight.measure import _projection

    write_run(
        project, "edge", training={"max_steps": 1, "eval_every": 0}, optim={"warmup_steps": 0}, checkpoint={"every": 0}
    )
    m = {"step_times": [0.63], "eval_batch_s": 0.0, "save_s": 0.33, "memory": {}, "ckpt_bytes": 1, "skipped": []}
    tp = _projection(load_config("edge", root=project), m, 1, 0)["throughput"]
    assert tp["projected_s"] == 1.0 and tp["projected"] == duration(1.0) == "0m01s"


def test_too_slow_for_a_resumed_run_names_the_steps_left(project):
    """The too_slow words and figure count from where --resume starts (they said "the run's 20 steps would
    take ≈5m00s" for the 5 steps left after step 15)."""
    from enlace.config.schema import load_config
    from enlace.preflight.measure import TooSlow, _too_slow

    write_run(project, "slow", training={"max_steps": 20})
    cfg = load_config("slow", root=project)
    resumed = _too_slow(cfg, TooSlow(300, 60.0, 3), 300, 1, start=15)
    assert (
        resumed["too_slow"]["run_s"] == 300.0
        and "the run's 5 steps left (from step 15) would take ≈5m00s" in resumed["suggestion"]
    ), resumed
    assert (
        "the run's 20 steps would take ≈20m00s" in _too_slow(cfg, TooSlow(300, 60.0, 3), 300, 1, start=0)["suggestion"]
    )


def test_preflight_of_a_resumed_run_projects_the_remaining_steps(project):
    write_run(project, "half", training={"max_steps": 40, "eval_every": 0}, checkpoint={"every": 10})
    from enlace.config.schema import load_config
    from enlace.preflight.measure import _resumes_at

    enlace(project, "train", "half", "--until", "30")
    cfg = load_config("half", root=project)
    assert (_resumes_at(cfg), _resumes_at(cfg, "none")) == (30, 0)  # --resume none: all 40 to go (it said 10)
    # projected from where `train --resume PATH` starts (the launch passes its --resume on to preflight)
    rep = json.loads(
        enlace(project, "preflight", "half", "--json", "--steps", "2", "--resume", "checkpoints/step-000020").stdout
    )
    assert rep["throughput"]["resumes_at"] == 20 and rep["throughput"]["remaining_steps"] == 20
    assert rep["disk"]["ok"] and rep["disk"]["checkpoint_mib"] > 0


def test_a_rank_that_runs_out_of_memory_alone_says_so_and_ends_the_job(project):
    """Under torchrun a rank whose batch does not fit exits with the verdict's code (it exited 0 while its
    peers waited in a collective until NCCL's 10-minute timeout): torchrun then ends the others at once. RANK=1
    alone stands in for the job's second process (one process: no peers to wait for here)."""
    write_run(project, "big", model={"seq_len": 256, "d_model": 128, "n_head": 4}, training={"batch_size": 64})
    out = enlace(
        project, "preflight", "big", "--steps", "3", "--memory-limit", "600MiB", env={"RANK": "1"}, check=False
    )
    assert out.returncode == 5, out.stderr
    assert out.stdout == "" and "Traceback" not in out.stderr  # rank 0 alone prints the report
    assert "rank 1: oom: out of memory in" in out.stderr and "batch_size" in out.stderr


def test_ranks_leave_together_when_another_rank_is_late(project, monkeypatch):
    """The too-slow decision is every rank's: a rank whose own steps are in time still stops at the step where
    another rank projected past the budget (each stopping alone left the others in a collective). The other
    rank is a stand-in: Dist.any_rank answers True, and is asked nothing during the warm-up (each rank warms up
    alike: a collective there would only cost)."""
    from enlace.config.schema import load_config
    from enlace.preflight.measure import WARMUP_STEPS, preflight
    from enlace.train.dist import Dist

    lines, asked = [], []

    def another_rank_is_late(self, flag):
        asked.append((flag, sum(bool(re.search(r" step \d+/", line)) for line in lines)))  # (its own, steps run)
        return True

    monkeypatch.setattr(Dist, "any_rank", another_rank_is_late)
    write_run(project, "late")
    rep = preflight(load_config("late", root=project), steps=20, budget_s=10_000, progress=lines.append)
    # this rank alone was in time; it was asked first after the first measured step, and left there with the other
    assert rep["verdict"] == "too_slow" and asked == [(False, WARMUP_STEPS + 1)]
