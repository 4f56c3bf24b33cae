"""Fast checks of the Slurm logic without a cluster: hosts.yaml keys and values, the time format, the
batch script, the status cell, the printed script, the trainer's answer to repeated SIGTERMs.
(The cluster itself is exercised in test_slurm.py.)"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys

import pytest
from support import REPO
from support.remote import remote

from enlace.contract import Status
from enlace.slurm.settings import SlurmError, SlurmSpec, job_script, sbatch_lines, spec_from, time_limit_s
from enlace.state import runs
from orchestrator.view.status import slurm_cell


@pytest.mark.parametrize(
    "text, seconds",
    [("60", 3600), ("1", 60), ("1:30", 90), ("4:00:00", 14400), ("2-12", 216000), ("1-00:30", 88200), ("0-0:0:45", 45)],
)
def test_slurm_time_format(text, seconds):
    assert time_limit_s(text) == seconds


@pytest.mark.parametrize(
    "entry, says",
    [
        ({"partition": "gpu; rm -rf ~"}, "partition"),
        ({"partition": "gpu\n#SBATCH --uid=0"}, "partition"),
        ({"time": "1 hour"}, "time"),
        ({"time": True}, "time"),
        ({"nodes": 0}, "nodes"),
        ({"gpus_per_node": "4"}, "gpus_per_node"),
        ({"max_requeues": -1}, "max_requeues"),
        ({"mem": "lots"}, "mem"),
        ({"extra_sbatch": "--exclusive"}, "extra_sbatch"),
        ({"extra_sbatch": ["exclusive"]}, "extra_sbatch"),
        ({"extra_sbatch": ["--comment=a\n--uid=0"]}, "extra_sbatch"),
        ({"time": "1", "signal_grace": 60}, "signal_grace"),
        ({"time": "2", "signal_grace": 60}, "set signal_grace below 60s"),  # seen: Slurm signalled every start at once
    ],
)
def test_bad_slurm_settings_are_refused_naming_the_key(entry, says):
    with pytest.raises(SlurmError) as e:
        spec_from(entry, "host c")
    assert e.value.message.startswith("host c: ") and says in e.value.message


def test_the_batch_script_carries_the_settings_and_quotes_the_paths(tmp_path):
    spec = spec_from(
        {
            "partition": "gpu",
            "account": "ml",
            "qos": "high",
            "time": "4:00:00",
            "gpus_per_node": 4,
            "cpus_per_task": 8,
            "mem": "64G",
            "nodes": 2,
            "extra_sbatch": ["#SBATCH --exclusive"],
            "signal_grace": 300,
        },
        "host c",
    )
    tree = tmp_path / "a dir; $(boom)"
    quoted = shlex.quote(str(tree)), shlex.quote("/opt/py thon")  # the caller's shell words
    script = job_script(spec, "r1", *quoted, {"ENLACE_LAUNCH_ID": "1-2"}, ["r1", "--", "-m", "x"], "a header")
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --account=ml",
        "#SBATCH --qos=high",
        "#SBATCH --time=4:00:00",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=64G",
        "#SBATCH --nodes=2",
        "#SBATCH --exclusive",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@300",
    ):
        assert line in script.splitlines(), line
    # bash reads the paths back exactly, nothing in them runs
    out = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert out.returncode == 0, out.stderr
    assert f"cd '{tree}'" in script and "exec '/opt/py thon' -m enlace slurm-job r1 -- -m x" in script
    assert "trap '' USR1" in script.split("exec ")[0]  # USR1 cannot kill the step before Python handles it
    assert not any(line.startswith("#SBATCH --gpus") for line in sbatch_lines(SlurmSpec(), "x", 0))


def test_slurm_keys_need_scheduler_slurm_and_valid_values(tmp_path, monkeypatch):
    from orchestrator.errors import UsageError
    from orchestrator.hosts.resolve import resolve_host

    hosts = tmp_path / "hosts.yaml"
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(hosts))
    hosts.write_text("hosts:\n  c: {ssh: login.example.org, partition: gpu}\n")
    with pytest.raises(UsageError, match="partition only apply to a Slurm host — add `scheduler: slurm`") as e:
        resolve_host("c", tmp_path)
    assert e.value.message.startswith(f"{hosts}: hosts.c: partition")  # the file, as its other checks name it
    hosts.write_text("hosts:\n  c: {ssh: login.example.org, scheduler: slurm, time: 2m}\n")
    with pytest.raises(Exception, match=f"^{hosts}: hosts.c: time: '2m' — expected"):
        resolve_host("c", tmp_path)
    hosts.write_text("hosts:\n  c: {ssh: login.example.org, scheduler: pbs}\n")
    with pytest.raises(UsageError, match="scheduler: 'pbs'"):
        resolve_host("c", tmp_path)
    hosts.write_text("hosts:\n  c: {ssh: login.example.org, scheduler: slurm, time: '2-00', nodes: 2}\n")
    assert resolve_host("c", tmp_path).slurm == SlurmSpec(time="2-00", nodes=2)
    # unquoted, YAML 1.1 read 4:00:00 as the base-60 number 14400: Slurm's minutes, ten days
    hosts.write_text("hosts:\n  c: {ssh: login.example.org, scheduler: slurm, time: 4:00:00}\n")
    assert resolve_host("c", tmp_path).slurm.time == "4:00:00"


def test_status_cell_and_status_of_a_queued_job():
    row = {
        "job_id": "12",
        "slurm_state": "PENDING",
        "slurm_reason": "Priority",
        "requeues": 2,
        "requeue_limit_reached": False,
    }
    assert slurm_cell(row) == "job 12 PENDING (Priority), requeued 2×"
    assert (
        slurm_cell({"job_id": "3", "slurm_state": None, "requeue_limit_reached": True})
        == "job 3 gone, max_requeues reached"
    )
    assert slurm_cell({"job_id": None}) == "-"
    # a cancelled pending job kept its reason (`CANCELLED (stopped) (Priority)`); a purged one read "gone"
    cancelled = {"job_id": "9", "slurm_state": "CANCELLED", "slurm_reason": "Priority", "status": "stopped"}
    assert slurm_cell(cancelled) == "job 9 CANCELLED (stopped)"
    assert slurm_cell({"job_id": "2", "slurm_state": None, "status": "finished"}) == "job 2 ended, no longer listed"
    # a requeued job is pending whatever the trainer last wrote; a job that is gone leaves an active run crashed
    assert runs.status_of({"status": "stopped"}, True, "PENDING") == Status.PENDING
    assert runs.status_of({"status": "running"}, False, "CANCELLED") == Status.CRASHED
    assert runs.status_of({"status": "stopped"}, False, "CANCELLED") == Status.STOPPED


def test_slurm_print_writes_the_launch_script_without_touching_a_host(user_repo):
    out = remote(user_repo, {}, "launch", "tiny", "--slurm", "--print", "--nodes", "2", "--gpus", "4", host="local")
    script = out.stdout
    assert script.startswith("#!/bin/bash") and "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=4" in script
    assert "#SBATCH --signal=B:USR1@120" in script and "#SBATCH --requeue" in script
    assert "/bin/python -m enlace slurm-job tiny --gpus 4 --nodes 2" in script and "-m enlace train tiny" in script
    assert "exec python " not in script  # no bare python: a Debian login node has only python3
    assert not (user_repo / ".enlace").exists()  # nothing was synced or started
    # launched from here before on 2 nodes × 4: printed on as many, as `launch tiny` would submit it
    from orchestrator.launch.choose import remember_run

    remember_run(user_repo, "local", "tiny", "tiny", (), {"nodes": 2, "gpus": "4"})
    kept = remote(user_repo, {}, "launch", "tiny", "--slurm", "--print", host="local")
    assert "#SBATCH --nodes=2" in kept.stdout and "#SBATCH --gpus-per-node=4" in kept.stdout, kept.stdout
    assert "keeps --nodes 2 --gpus 4" in kept.stderr or "keeps --gpus 4 --nodes 2" in kept.stderr, kept.stderr
    bad = remote(user_repo, {}, "launch", "tiny", "--slurm", host="local", check=False)
    assert bad.returncode == 2 and "not a Slurm host" in bad.stderr and "--slurm --print" in bad.stderr
    # a run file of your own command: refused (it printed the trainer's script, `-m enlace train mine`)
    (user_repo / "configs" / "runs" / "mine.yaml").write_text("command: [python, train.py]\n")
    mine = remote(user_repo, {}, "launch", "mine", "--slurm", "--print", host="local", check=False)
    assert mine.returncode == 2 and "--print: prints enlace's trainer's batch script" in mine.stderr, mine.stderr
    assert mine.stdout == ""


def test_a_repeated_sigterm_is_one_stop_request_and_a_second_ctrl_c_exits():
    def after(*signals: str) -> subprocess.CompletedProcess:
        kills = "; ".join(f"os.kill(os.getpid(), signal.{name})" for name in signals)
        code = (
            "import os, signal\nfrom enlace.train.loop import StopSignal\n"
            f"s = StopSignal(on_second=lambda name: None)\n{kills}\nprint('asked by', s.signame)"
        )
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)

    # from slurmd, then from the batch step: still one request (finish the step, checkpoint)
    assert after("SIGTERM", "SIGTERM").stdout.strip() == "asked by SIGTERM"
    out = after("SIGTERM", "SIGINT")  # Ctrl-C after a stop request: out at once
    assert out.returncode == 128 + signal.SIGINT and "asked by" not in out.stdout


@pytest.mark.parametrize("requeued", [True, False])
def test_a_requeue_that_scontrol_calls_failed_is_believed_only_when_slurm_did_not_requeue(
    tmp_path, monkeypatch, capsys, requeued
):
    """Seen once in four requeues on a walk: `scontrol requeue` ended non-zero saying nothing while Slurm requeued
    the job (it ends this very job for that); train.log said the requeue failed and run.json read stopped with
    that error until the job started again. A stand-in scontrol on PATH plays that race, which a real cluster
    gives only at random; its `show job` answers as Slurm does after a requeue (Restarts=1), or before."""
    from enlace.slurm import job

    bindir = tmp_path / "bin"
    bindir.mkdir()
    restarts = 1 if requeued else 0
    (bindir / "scontrol").write_text(
        f'#!/bin/sh\n[ "$1" = requeue ] && exit 1\necho "JobId=7 JobState=RUNNING Restarts={restarts} Reason=None"\n'
    )
    (bindir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setattr(job._was_requeued, "__defaults__", (5, 0.0))  # no pause between its looks
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runs.update(run_dir, status=Status.STOPPED, step=12, requeues=0)
    assert job._requeue(run_dir, "7", runs.read(run_dir)) == 0
    log, st = capsys.readouterr().out, runs.read(run_dir)
    if requeued:
        assert "failed" not in log and st["status"] == Status.PENDING and not st.get("error"), (log, st)
    else:
        assert "scontrol requeue 7 failed: exit 1, nothing said" in log and st["status"] == Status.STOPPED, log


def test_which_extra_sbatch_options_ask_for_a_gpu_and_which_choose_preflights_node():
    """Only `--gres`/`--gpus` prefixes counted as a GPU request (`-G 1` and `--tres-per-node=gres/gpu:1` were
    refused, `--gres=tmpdisk:10` passed), and preflight's srun left `--gpus-per-node` out and passed
    `--gres gpu:1` to srun as one word."""
    from enlace.slurm.onnode import node_options
    from enlace.slurm.settings import asks_gpu

    gpu = {"-G 1": True, "-G1": True, "--tres-per-node=gres/gpu:1": True, "--gres gpu:1": True}
    gpu |= {"--gpus-per-node=2": True, "--gres=tmpdisk:10": False, "--mail-type=END": False, "--gres=gpu:0": False}
    gpu |= {"-G 0": False, "--gpus=0": False, "--gres=gpu:a100:2": True, "--gres=gpu:1,tmpdisk:0": True}
    gpu |= {"--gpus=1,v100:0": True, "--tres-per-task=gres/gpu:1": True, "--gres=shard:2": False}
    for line, asks in gpu.items():
        assert asks_gpu(SlurmSpec(extra_sbatch=(line,))) is asks, line
    assert asks_gpu(SlurmSpec(gpus_per_node=4))
    spec = SlurmSpec(extra_sbatch=("--gres gpu:1", "--gpus-per-node=2", "-A proj", "--mail-type=END", "--requeue"))
    assert node_options(spec) == ["--gres", "gpu:1", "--gpus-per-node=2", "-A", "proj"]
    assert node_options(SlurmSpec(extra_sbatch=("--gres=gpu:1  # one gpu",))) == ["--gres=gpu:1"]  # not `#` as argv
    with pytest.raises(SlurmError, match="extra_sbatch: '--constraint=\"a100' — No closing quotation"):
        spec_from({"scheduler": "slurm", "extra_sbatch": ['--constraint="a100']}, "host c")
