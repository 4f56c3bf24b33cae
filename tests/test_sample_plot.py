"""`enlace sample` and `enlace plot` on real checkpoints and metrics of a tiny run."""

from __future__ import annotations

import json
import os

import pytest
from support.cli import enlace
from support.configs import write_run

pytestmark = pytest.mark.xdist_group("sample_plot")  # one worker trains `trained` once for both tests


@pytest.fixture(scope="module")
def trained(module_project):
    """A tiny run trained to step 10, stopped, then resumed to 20 (a resume point to mark), shared
    by the tests here: they only add runs and files of their own."""
    write_run(module_project, "s", training={"max_steps": 20, "eval_every": 5}, checkpoint={"every": 5, "keep": 5})
    enlace(module_project, "train", "s", "--until", "10")
    enlace(module_project, "train", "s")
    return module_project


def _sample(project, *args):
    out = enlace(project, "sample", *args, "--json")
    return json.loads(out.stdout)


@pytest.mark.slow
def test_sample_is_seeded_honours_the_prompt_and_never_breaks_on_bytes(trained, tmp_path):
    a = _sample(trained, "s", "--bytes", "80", "--seed", "3", "--prompt", "def main(")
    b = _sample(trained, "s", "--bytes", "80", "--seed", "3", "--prompt", "def main(")
    c = _sample(trained, "s", "--bytes", "80", "--seed", "4", "--prompt", "def main(")
    assert a["text"] == b["text"] and a["text"] != c["text"]
    assert a["text"].startswith("def main(") and a["step"] == 20 and a["bytes_per_s"] > 0
    ckpt = trained / "runs" / "s" / "checkpoints" / "step-000010"
    assert _sample(trained, str(ckpt), "--bytes", "5")["step"] == 10  # a checkpoint dir (e.g. a fetched one)
    raw = tmp_path / "prompt.bin"
    raw.write_bytes(b"\xff\xfe\xc3")  # not UTF-8: shown replaced, never a crash
    out = enlace(trained, "sample", "s", "--prompt-file", str(raw), "--bytes", "40", "--temperature", "1.5")
    assert "\ufffd" in out.stdout and out.returncode == 0
    greedy = [_sample(trained, "s", "--bytes", "30", "--temperature", "0", "--seed", str(s))["text"] for s in (1, 2)]
    assert greedy[0] == greedy[1]  # temperature 0 does not depend on the seed


def test_sample_refuses_what_is_not_a_checkpoint(project, tmp_path):
    out = enlace(project, "sample", str(tmp_path), check=False)
    assert out.returncode == 2 and "neither a checkpoint" in out.stderr and "Traceback" not in out.stderr
    ckpt = tmp_path / "fake"
    ckpt.mkdir()
    (ckpt / "MANIFEST").write_text("{}")
    out = enlace(project, "sample", str(ckpt), check=False)
    assert out.returncode == 2 and "MANIFEST" in out.stderr
    (project / "runs" / "lr-1e-3").mkdir(parents=True)
    out = enlace(project, "sample", "lr-1e3", check=False)  # a mistyped run name: the runs there are
    assert (
        out.returncode == 2
        and "no run named 'lr-1e3' here — did you mean 'lr-1e-3'? runs on this host: lr-1e-3" in out.stderr
    ), out.stderr
    assert "`enlace-remote fetch lr-1e3` brings it here" in out.stderr  # here, not on a server: where runs are
    (project / "runs" / "lr-1e-3" / "preflight.json").write_text("{}")  # what a launch leaves here
    out = enlace(project, "sample", "lr-1e-3", check=False)
    assert out.returncode == 2 and "this run has no complete checkpoint here" in out.stderr, out.stderr
    assert "`enlace-remote fetch lr-1e-3`" in out.stderr
    # on the server it trains on (ENLACE_ROOT, as remote.sh sets it): no fetch is offered (a walk was told to fetch)
    from enlace.state.runs import proc_start

    alive = {"status": "running", "step": 3, "pid": os.getpid(), "pid_start": proc_start(os.getpid())}
    (project / "runs" / "lr-1e-3" / "run.json").write_text(json.dumps(alive))
    out = enlace(project, "sample", "lr-1e-3", check=False, env={"ENLACE_ROOT": str(project)})
    assert out.returncode == 2 and "lr-1e-3 has no complete checkpoint yet: its first comes at" in out.stderr
    assert "fetch" not in out.stderr, out.stderr
    (project / "runs" / "lr-1e-3" / "run.json").write_text('{"status": "running", "step": 60}')  # killed -9
    out = enlace(project, "sample", "lr-1e-3", check=False, env={"ENLACE_ROOT": str(project)})
    assert "lr-1e-3 ended (crashed at step 60) before its first checkpoint" in out.stderr, out.stderr
    assert "launch lr-1e-3` trains it again from step 0" in out.stderr and "stop" not in out.stderr, out.stderr
    out = enlace(project, "sample", str(tmp_path / "gone" / "ckpt"), check=False)  # a path: not a run name
    assert out.returncode == 2 and "gone/ckpt: no such directory — name a run" in out.stderr, out.stderr
    from enlace.train.checkpoint import save_checkpoint

    own = save_checkpoint(tmp_path / "script", 20, {"state.pt": {"step": 20}}, 1)  # what a script saves (enlace.job)
    out = enlace(project, "sample", str(own), check=False)  # it was torch's weights_only error about its files
    assert (
        out.returncode == 2
        and "not a checkpoint of enlace's trainer (it lacks model.pt and trainer.pt; it holds state.pt" in out.stderr
    ), out.stderr


@pytest.mark.slow
def test_plot_one_run_and_two_overlaid(trained):
    import matplotlib.image as mpimg

    write_run(trained, "t", training={"max_steps": 10, "eval_every": 5})
    enlace(trained, "train", "t")
    one = json.loads(enlace(trained, "plot", "s", "--json").stdout)
    img = mpimg.imread(one["out"])
    assert img.shape[0] > 600 and img.shape[1] > 600 and img[..., :3].std() > 0.01  # drawn, not blank
    run = one["runs"][0]
    assert run["markers"] == [[10, "stopped, resume"]], run["markers"]  # --until 10, then resumed: one label
    assert run["points"]["loss"] == 20 and run["points"]["val_bpb"] >= 4
    two = json.loads(enlace(trained, "plot", "s", "t", "--metrics", "loss,val_bpb", "--json").stdout)
    assert two["out"].endswith("s+t.png") and [r["name"] for r in two["runs"]] == ["s", "t"]
    assert mpimg.imread(two["out"]).shape[0] < img.shape[0]  # two panels, not four
    bad = enlace(trained, "plot", "s", "--metrics", "loss,accuracy", check=False)
    assert bad.returncode == 2 and "accuracy" in bad.stderr


def test_plot_draws_a_run_resumed_from_an_older_checkpoint_as_it_stands(tmp_path):
    """A crash at step 30 and a resume from the checkpoint at 20: the steps 21-30 trained again are drawn
    once, from the attempt that stands (before, the line ran back from 30 to 21), as the board draws them."""
    from enlace.tools.plot import plot, read_run

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    records = [{"kind": "start", "step": 0}]
    records += [{"kind": "train", "step": s, "loss": 3.0, "lr": 0.1, "tokens_per_s": 9.0} for s in range(1, 31)]
    records += [{"kind": "eval", "step": s, "val_bpb": 4.0} for s in (10, 20, 30)]
    records += [{"kind": "start", "step": 20, "resumed_from": "step-000020"}]
    records += [{"kind": "train", "step": s, "loss": 1.0, "lr": 0.1, "tokens_per_s": 9.0} for s in range(21, 26)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    series = read_run(run)["series"]
    assert [s for s, _ in series["loss"]] == list(range(1, 26)) and series["loss"][-1] == (25, 1.0)
    assert series["val_bpb"] == [(10, 4.0), (20, 4.0)]  # the eval at 30 was of the attempt resumed past
    drawn = plot([run], tmp_path / "r.png", ["loss", "val_bpb"])
    assert drawn["runs"][0]["points"] == {"loss": 25, "val_bpb": 2} and drawn["runs"][0]["markers"] == [(20, "resume")]


def test_plot_draws_a_scripts_val_loss_where_no_run_has_a_val_bpb(tmp_path):
    """A script of your own logs a val loss (enlace.job), not enlace's val bits/byte: the val panel draws it.
    A run with val bpb keeps its own panel; a wrong --metrics is one line naming the choices, on both CLIs."""
    from click.testing import CliRunner

    from enlace.tools.plot import plot
    from orchestrator.cli import main

    run = tmp_path / "runs" / "mine"
    run.mkdir(parents=True)
    records = [{"kind": "train", "step": s, "loss": 1.0 / s} for s in (1, 2, 3)]
    records += [{"kind": "eval", "step": s, "val_loss": 0.5 / s} for s in (1, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    drawn = plot([run], tmp_path / "m.png", ["loss", "val_bpb"])
    assert drawn["runs"][0]["points"] == {"loss": 3, "val_loss": 2}
    # the default panels: lr and tokens/s, which this script does not log, are left out (they were drawn empty)
    drawn = plot([run], tmp_path / "m.png", ["loss", "val_bpb", "lr", "tokens_per_s"])
    assert drawn["metrics"] == ["loss", "val_loss"], drawn
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps({"kind": "eval", "step": 3, "val_bpb": 2.0}) + "\n")
    assert plot([run], tmp_path / "m.png", ["val_bpb"])["runs"][0]["points"] == {"val_bpb": 1}
    bad = CliRunner().invoke(main, ["plot", "mine", "--metrics", "loss,accuracy"])
    assert bad.exit_code == 2 and "accuracy: choose from loss, val_bpb, val_loss, lr, tokens_per_s" in bad.output


def test_plot_of_a_run_that_has_logged_nothing_says_where_it_stands(tmp_path):
    from enlace.errors import EnlaceError
    from enlace.tools.plot import read_run

    run_dir = tmp_path / "runs" / "q"
    run_dir.mkdir(parents=True)
    with pytest.raises(EnlaceError, match=r"no metrics\.jsonl — no step logged yet"):
        read_run(run_dir)
    (run_dir / "run.json").write_text(json.dumps({"status": "queued", "phase": "position 1, waiting for 1 GPU"}))
    with pytest.raises(
        EnlaceError, match=r"run.json says queued \(position 1, waiting for 1 GPU\): no step logged yet"
    ):
        read_run(run_dir)
    (run_dir / "run.json").write_text(json.dumps({"status": "failed", "phase": None}))
    with pytest.raises(EnlaceError, match=r"its run.json says failed, and it logged no step$"):
        read_run(run_dir)
