"""enlace-remote on a real single-node Slurm cluster (slurmctld + slurmd + munge, tests/slurmcluster.py),
reached through the test sshd as the login node: launch with a pending reason, status, logs -f,
stop, scancel, fetch, time-limit and preemption requeues that resume exactly, max_requeues, a job
that fails on the node, srun + torchrun. Nothing is mocked. To make the tests independent of this
machine's speed, some pause the trainer (SIGSTOP) until Slurm's signal has arrived: a pause cannot
change a deterministic run's bytes, and Slurm, its signals and its requeues stay real."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import pytest
from support import REPO
from support.configs import DETERMINISTIC, TINY, write_run, write_toy
from support.procs import kill_processes_under
from support.remote import DRIVER, remote, server_dir, tiny_corpus, wait_until
from support.repocopy import commit_all
from support.slurmruns import pause_until_limit_signal, run_json, train_log, training

from enlace.manifest import latest_checkpoint
from enlace.preflight.verify_resume import compare_states
from enlace.train.checkpoint import load_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.longest, pytest.mark.xdist_group("slurm")]  # one cluster: one worker

CLUSTER_HOST = """\
  {name}:
    ssh: testhost
    remote_dir: {base}/remote-cluster
    python: {python}
    connect_timeout: 5
    scheduler: slurm
    partition: debug
    time: "2"
    signal_grace: 40
    max_requeues: {max_requeues}
"""


@pytest.fixture(scope="module")
def cluster():
    from support.slurmcluster import SlurmCluster, missing

    if missing():
        raise RuntimeError(
            f"{', '.join(missing())} not found: the Slurm tests need a real cluster — apt-get install "
            "slurmctld slurmd slurm-client munge"
        )
    base = Path(tempfile.mkdtemp(prefix="enlace-slurm-"))
    base.chmod(0o755)  # munged runs as the munge user and keeps its socket here
    c = SlurmCluster(base / "cluster")
    c.start()
    yield c
    c.stop()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def login(tmp_path, cluster):
    """The test sshd as the cluster's login node (its sessions see SLURM_CONF), and two Slurm hosts on it:
    `cluster` (max_requeues 5) and `cluster0` (max_requeues 0), sharing one remote_dir."""
    from support.sshd import make_server

    srv = make_server(tmp_path, session_env=cluster.env)
    with open(srv.env["ENLACE_HOSTS_FILE"], "a") as fh:
        for name, n in (("cluster", 5), ("cluster0", 0)):
            fh.write(CLUSTER_HOST.format(name=name, base=tmp_path, python=sys.executable, max_requeues=n))
    yield srv
    cluster.run("scancel", "-u", "root", check=False)
    srv.stop()
    kill_processes_under(tmp_path)


def spawn(repo: Path, env: dict, log: Path, *args: str, host: str = "cluster") -> subprocess.Popen:
    """enlace-remote in the background, its stderr into `log` (read while it runs)."""
    cmd = [*DRIVER, "--host", host, *args]
    return subprocess.Popen(
        cmd,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )


def test_pending_then_running_logs_stop_scancel_fetch(login, user_repo, cluster, tmp_path):
    tiny_corpus(server_dir(login, "cluster"))
    blocker = cluster.run("sbatch", "--parsable", "-c", "2", "--output=/dev/null", "--wrap", "sleep 600").stdout.strip()
    launch = spawn(user_repo, login.env, tmp_path / "launch.err", "launch", "long", "--no-preflight")
    wait_until(lambda: "PENDING (Resources)" in (tmp_path / "launch.err").read_text(), 180, "launch showing the reason")
    out = remote(user_repo, login.env, "status", "long", host="cluster").stdout
    assert "pending" in out and "PENDING (Resources)" in out, out
    follow = spawn(user_repo, login.env, tmp_path / "follow.err", "logs", "long", "-f")
    wait_until(lambda: "is PENDING (Resources)" in (tmp_path / "follow.err").read_text(), 120, "logs -f: pending")
    cluster.run("scancel", blocker)
    assert launch.wait(timeout=300) == 0, (tmp_path / "launch.err").read_text()
    err = (tmp_path / "launch.err").read_text()
    assert "submitted long to Slurm" in err and "no complete checkpoint: starting from step 0" in err, err
    job = run_json(login, "long")["job_id"]
    row = json.loads(remote(user_repo, login.env, "status", "long", "--json", host="cluster").stdout)[0]
    assert row["status"] == "running" and row["slurm_state"] == "RUNNING" and row["job_id"] == job
    wait_until(lambda: run_json(login, "long").get("step", 0) > 60, 180, "a checkpoint at step 50")

    out = remote(user_repo, login.env, "stop", "long", host="cluster")
    assert "stopped" in out.stdout, out.stdout
    wait_until(lambda: cluster.job_state(job) == "COMPLETED", 120, "the job to complete")
    assert "Restarts=0" in cluster.run("scontrol", "show", "job", job, "-o").stdout  # a stop is not requeued
    assert follow.wait(timeout=120) == 0  # logs -f followed it from pending to its clean stop
    assert "slurm: SIGTERM (stop, scancel or preemption): checkpointed" in train_log(login, "long")
    assert "CANCELLED ***` line Slurm may print next is this stop, not a failure" in train_log(login, "long")
    out = remote(user_repo, login.env, "status", "long", host="cluster").stdout
    assert f"job {job} COMPLETED (stopped)" in out, out

    remote(user_repo, login.env, "fetch", "long", host="cluster")
    local = user_repo / "runs" / "long" / "checkpoints"
    load_checkpoint(latest_checkpoint(local))  # verified against its MANIFEST

    # scancel from outside: the trainer gets Slurm's SIGTERM, checkpoints; status says CANCELLED
    remote(user_repo, login.env, "launch", "long", "--no-preflight", host="cluster")
    job2 = run_json(login, "long")["job_id"]
    before = run_json(login, "long")["step"]
    wait_until(lambda: run_json(login, "long").get("step", 0) > before + 5, 120, "progress after the resume")
    cluster.run("scancel", job2)
    wait_until(lambda: cluster.job_state(job2) == "CANCELLED", 120, "the job to be cancelled")
    out = remote(user_repo, login.env, "status", "long", host="cluster").stdout
    assert f"job {job2} CANCELLED" in out, out
    ckpt = latest_checkpoint(server_dir(login, "cluster") / "runs" / "long" / "checkpoints")
    load_checkpoint(ckpt)
    assert int(ckpt.name[5:]) > before  # the SIGTERM checkpoint


def test_time_limit_requeues_and_resumes_exactly_and_max_requeues_stops_the_run(login, user_repo, cluster, tmp_path):
    """Two runs wait out one time limit together (Slurm's clock is most of this test's time): `det` on
    `cluster` (max_requeues 5) requeues itself and, preempted once more, finishes bit for bit equal to an
    uninterrupted run; `capped` on `cluster0` (max_requeues 0) stops with a checkpoint instead."""
    rd = server_dir(login, "cluster")
    tiny_corpus(rd)
    write_run(
        user_repo,
        "det",
        run_name="det",
        **DETERMINISTIC,
        training={**TINY["training"], "max_steps": 1500, "log_every": 100, "eval_every": 0},
        checkpoint={"every": 500, "keep": 2},
    )
    write_run(
        user_repo,
        "capped",
        run_name="capped",
        training={**TINY["training"], "max_steps": 100000, "log_every": 100, "eval_every": 0},
        checkpoint={"every": 0, "keep": 2},
    )
    commit_all(user_repo, "det and capped runs")
    # --resume none: the launch's own start; each requeue resumes from the newest checkpoint (trainerchild.from_newest)
    remote(user_repo, login.env, "launch", "det", "--no-preflight", "--no-wait", "--resume", "none", host="cluster")
    sha = subprocess.run(
        ["git", "-C", str(user_repo), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    tree = rd / "trees" / sha  # the uninterrupted reference trains on the very same tree and data, meanwhile
    reference = subprocess.Popen(
        [sys.executable, "-m", "enlace", "train", "det", "--runs-dir", str(tmp_path / "ref")],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree), "ENLACE_ROOT": str(tree)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    remote(user_repo, login.env, "launch", "capped", "--no-preflight", host="cluster0")
    pause_until_limit_signal(login, "det", "capped", start=1)  # the time limit: checkpoint, requeue (or not)
    wait_until(lambda: run_json(login, "capped").get("requeue_limit_reached"), 120, "max_requeues reached")
    capped_job = run_json(login, "capped")["job_id"]
    job = run_json(login, "det")["job_id"]
    wait_until(partial(training, login, "det", 2), 180, "the requeued job training")
    pid = run_json(login, "det")["pid"]
    os.kill(pid, signal.SIGSTOP)  # a preemption while it trains: Slurm sends SIGCONT + SIGTERM, then requeues
    cluster.run("scontrol", "requeue", job)
    os.kill(pid, signal.SIGCONT)
    wait_until(lambda: run_json(login, "det").get("status") == "finished", 300, "the run to finish")

    assert reference.wait(timeout=300) == 0, reference.stderr.read()
    log = train_log(login, "det")
    assert "time limit is near" in log and "SIGTERM (stop, scancel or preemption)" in log, log
    assert run_json(login, "det")["requeues"] >= 2 and log.count("resumed from checkpoints/") >= 2, log
    ours = load_checkpoint(rd / "runs" / "det" / "checkpoints" / "step-001500")
    straight = load_checkpoint(tmp_path / "ref" / "det" / "checkpoints" / "step-001500")
    assert compare_states(ours, straight)["identical"]
    out = remote(user_repo, login.env, "status", "det", host="cluster").stdout
    assert "finished" in out and "requeued" in out, out

    wait_until(lambda: cluster.job_state(capped_job) == "COMPLETED", 120, "capped's job to end without a requeue")
    out = remote(user_repo, login.env, "status", "capped", host="cluster0").stdout
    assert "stopped" in out and "max_requeues reached" in out, out
    assert "max_requeues (0) reached" in train_log(login, "capped")
    load_checkpoint(latest_checkpoint(rd / "runs" / "capped" / "checkpoints"))


def test_a_job_failing_on_the_node_is_failed_with_its_log_tail(login, user_repo, cluster):
    """A command that fails as it starts on the node (exit 2, a usage error: not restarted): launch says it failed,
    with the log's tail. (A CUDA run on this CPU-only node no longer gets that far: a host whose jobs ask for no
    GPU refuses it before it queues.)"""
    boom = "import sys; print('the node has no such module', flush=True); sys.exit(2)"
    out = remote(
        user_repo, login.env, "launch", "--name", "boom", "--", "python", "-c", boom, host="cluster", check=False
    )
    assert out.returncode != 0, out.stderr
    assert "the node has no such module" in out.stderr and "boom failed" in out.stderr, out.stderr
    # launch reports the failure from run.json; Slurm lists the job RUNNING until its batch script
    # has exited, which under load can take a few seconds more
    job = run_json(login, "boom")["job_id"]
    wait_until(lambda: cluster.job_state(job) == "FAILED", 120, "Slurm to list the job as FAILED")
    row = json.loads(remote(user_repo, login.env, "status", "boom", "--json", host="cluster").stdout)[0]
    assert row["status"] == "failed" and row["slurm_state"] == "FAILED" and row["error"]


def test_preflight_on_a_compute_node_then_srun_torchrun_with_two_ranks(login, user_repo):
    tiny_corpus(server_dir(login, "cluster"))
    out = remote(user_repo, login.env, "launch", "tiny", "--nodes", "1", "--gpus", "2", host="cluster")
    assert "preflight on a compute node: srun" in out.stderr and "verdict" in out.stdout + out.stderr, out.stderr
    wait_until(lambda: run_json(login, "tiny").get("status") in ("finished", "failed", "crashed"), 180, "the run")
    log = train_log(login, "tiny")
    assert run_json(login, "tiny")["status"] == "finished", log
    assert "world 2" in log and log.count("run tiny |") == 1  # one log, written by rank 0 only
    files = load_checkpoint(latest_checkpoint(server_dir(login, "cluster") / "runs" / "tiny" / "checkpoints"))
    assert len(files["trainer.pt"]["ranks"]) == 2
    assert (server_dir(login, "cluster") / "runs" / "tiny" / "torchrun").is_dir()  # not /tmp/torchelastic_*


def test_a_preflight_job_that_would_never_run_is_one_error_and_asks_for_the_jobs_node(login, user_repo, cluster):
    """Seen on a walk of docs/slurm.md: preflight's srun (15 minutes) over a partition with a 10-minute limit
    waited for ever; an invalid partition printed srun's lines twice and exited 1 ("`enlace on-node` exited 1");
    extra_sbatch's --constraint was left out of preflight's srun, which measured a node the job would not get; a
    GPU run on a host whose jobs ask for no GPU queued, started on a node without one and failed there."""
    tiny_corpus(server_dir(login, "cluster"))
    entry = "  {name}:\n    ssh: testhost\n    remote_dir: {rd}\n    python: {py}\n    scheduler: slurm\n{extra}"
    with open(login.env["ENLACE_HOSTS_FILE"], "a") as fh:
        for name, extra in (
            ("nopart", '    partition: nope\n    time: "5"\n'),
            ("feature", '    time: "5"\n    extra_sbatch: ["--constraint=nofeature"]\n'),
            ("untimed", ""),  # no time of its own: its preflight asks for 15 minutes
        ):
            fh.write(entry.format(name=name, rd=server_dir(login, "cluster"), py=sys.executable, extra=extra))
    for host, said in (
        ("nopart", "Slurm refused the compute-node job: "),
        ("feature", "Slurm refused the compute-node job: Unable to allocate resources: Invalid feature"),
    ):
        out = remote(user_repo, login.env, "preflight", "tiny", host=host, check=False)
        assert out.returncode == 2 and said in out.stderr, out.stderr
        assert "exited 1" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "--constraint=nofeature" in out.stderr  # the job's node, as the job asks for it
    cluster.run("scontrol", "update", "PartitionName=debug", "MaxTime=10")
    try:
        out = remote(user_repo, login.env, "preflight", "tiny", host="untimed", check=False, timeout=120)
        assert out.returncode == 2 and "pending for PartitionTimeLimit" in out.stderr, out.stderr
        assert "srun --time=15" in out.stderr and "the host's time" in out.stderr
        out = remote(user_repo, login.env, "preflight", "tiny", "--steps", "2", host="cluster", timeout=300)
        assert "on a compute node: srun --nodes=1 --ntasks=1" in out.stderr and "--time=2 " in out.stderr
    finally:
        cluster.run("scontrol", "update", "PartitionName=debug", "MaxTime=INFINITE")
    # the pending job was cancelled (the last preflight's job may still be completing, CG, for a moment)
    wait_until(lambda: not cluster.run("squeue", "--noheader").stdout.strip(), 120, "an empty Slurm queue")
    # a GPU run where the host's jobs ask for no GPU: refused before any job (it queued and failed on the node)
    out = remote(user_repo, login.env, "launch", "smoke-2060", "--no-preflight", host="cluster", check=False)
    assert out.returncode == 3 and "asks its jobs for no GPU" in out.stderr, out.stderr
    assert (
        not cluster.run("squeue", "--noheader").stdout.strip()
        and not (server_dir(login, "cluster") / "runs" / "smoke-2060").exists()
    )


def test_the_printed_script_runs_as_printed_on_the_login_node(login, user_repo, cluster, tmp_path):
    """`launch --slurm --print` names the synced tree and the server's python by absolute path: sbatch'ed on
    the login node as printed (from any directory), its job trains (a bare `python` died on Debian)."""
    tiny_corpus(server_dir(login, "cluster"))
    remote(user_repo, login.env, "sync", host="cluster")
    script = remote(
        user_repo, login.env, "launch", "long", "--slurm", "--print", "--resume", "none", host="cluster"
    ).stdout
    assert f"{server_dir(login, 'cluster')}/trees/" in script and "exec python " not in script
    assert "# It starts the run at --resume none (a new line" in script  # submitted again later: over again
    (tmp_path / "job.sh").write_text(script)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def sbatch() -> str:
        submitted = subprocess.run(
            ["sbatch", str(tmp_path / "job.sh")],
            cwd=elsewhere,
            env={**os.environ, **cluster.env},
            capture_output=True,
            text=True,
        )
        assert submitted.returncode == 0, submitted.stderr
        return submitted.stdout.split()[-1]

    job, again = sbatch(), None
    try:
        wait_until(lambda: run_json(login, "long").get("step", 0) > 0, 180, "the printed job's first step")
        assert "step " in train_log(login, "long")  # its output went to the run's train.log
        # its job id names its launch: a requeue of this --resume none goes on from its line, not from step 0
        state = run_json(login, "long")
        assert state["launch_id"] == state["line_of"] == f"slurm-{job}", state
        # submitted twice: the second job is refused while the first trains (it would have set the first's
        # checkpoints aside under it), and the run stays the first job's
        again = sbatch()
        wait_until(lambda: f"is live under Slurm job {job}: this job ({again})" in train_log(login, "long"), 180)
        state = run_json(login, "long")
        assert (state["job_id"], state["launch_id"], state["status"]) == (job, f"slurm-{job}", "running"), state
    finally:
        cluster.run("scancel", job, *([again] if again else []), check=False)


def test_bare_verbs_act_on_the_run_name_and_launch_name_extends_it_on_slurm(login, user_repo):
    """The maintainer's pass, item 1, on the Slurm backend: launch remembers the name the job runs under."""
    tiny_corpus(server_dir(login, "cluster"))
    remote(user_repo, login.env, "launch", "tiny", "--set", "run_name=mytry", "--no-preflight", host="cluster")
    assert json.loads((user_repo / ".enlace" / "last-runs.json").read_text())["cluster"] == "mytry"
    assert remote(user_repo, login.env, "logs", "-f", host="cluster").returncode == 0  # bare: mytry, to its end
    assert run_json(login, "mytry")["status"] == "finished" and not run_json(login, "tiny")
    stop = remote(user_repo, login.env, "stop", host="cluster")
    assert stop.stdout.startswith("mytry is not running (finished"), stop.stdout
    remote(user_repo, login.env, "fetch", host="cluster")
    assert (user_repo / "runs" / "mytry" / "run.json").is_file()
    out = remote(
        user_repo, login.env, "launch", "mytry", "--set", "training.max_steps=34", "--no-preflight", host="cluster"
    )
    assert "from configs/runs/tiny.yaml" in out.stderr, out.stderr
    remote(user_repo, login.env, "logs", "-f", host="cluster")
    state = run_json(login, "mytry")
    assert (state["status"], state["step"], state["resumed_from"]) == ("finished", 34, "step-000030"), state


def test_a_sweep_is_one_job_array_whose_task_requeues_at_its_limit_and_resumes_exactly(login, user_repo, cluster):
    """A sweep of 3 on the Slurm host is one job array, at most 2 tasks at once. Its points differ only in
    training.log_every, which changes no arithmetic: task 0 gets Slurm's time-limit signal while it trains (USR1 to
    its batch step, as Slurm sends it signal_grace s before the limit), checkpoints, requeues itself and resumes;
    the sweep finishes, and task 0's final weights equal an uninterrupted task's, byte for byte."""
    rd = server_dir(login, "cluster")
    tiny_corpus(rd)
    training_ = {**TINY["training"], "max_steps": 300, "log_every": 50, "eval_every": 100}
    write_run(user_repo, "sw", run_name="sw", **DETERMINISTIC, training=training_, checkpoint={"every": 100, "keep": 2})
    commit_all(user_repo, "a run to sweep")
    out = remote(
        user_repo,
        login.env,
        "sweep",
        "sw",
        "--set",
        "training.log_every=10,20,30",
        "--name",
        "arr",
        "--max-running",
        "2",
        host="cluster",
    )
    assert "job array" in out.stderr and "at most 2 at once" in out.stderr, out.stderr
    names = ["arr-le10", "arr-le20", "arr-le30"]
    jobs = [run_json(login, n)["job_id"] for n in names]
    assert len({j.split("_")[0] for j in jobs}) == 1 and [j.split("_")[1] for j in jobs] == ["0", "1", "2"], jobs
    script = next((rd / "runs" / ".sweeps" / "arr").glob("job-*.sh")).read_text()
    assert "#SBATCH --array=0-2%2" in script and "#SBATCH --requeue" in script

    wait_until(partial(training, login, names[0], 1), 180, "task 0 training")
    pid = run_json(login, names[0])["pid"]
    os.kill(pid, signal.SIGSTOP)  # held mid-run until its batch step has the signal (a pause changes no bytes)
    try:
        cluster.run("scancel", "--signal=USR1", "--batch", jobs[0])
        wait_until(lambda: "time limit is near" in train_log(login, names[0]), 120, "the limit's signal")
    finally:
        os.kill(pid, signal.SIGCONT)
    done = lambda: all(run_json(login, n).get("status") == "finished" for n in names)
    wait_until(done, 600, "the sweep to finish")
    log = train_log(login, names[0])
    assert "requeueing job" in log and "resumed from checkpoints/" in log, log
    assert run_json(login, names[0])["requeues"] >= 1
    ours = load_checkpoint(rd / "runs" / names[0] / "checkpoints" / "step-000300")
    straight = load_checkpoint(rd / "runs" / names[1] / "checkpoints" / "step-000300")
    assert compare_states(ours, straight)["identical"]
    table = remote(user_repo, login.env, "status", "--sweep", host="cluster").stdout
    assert table.startswith("sweep arr: sw, 3/3 finished"), table


def test_a_sweep_of_your_own_script_is_one_job_array_ranked_by_its_val_loss(login, user_repo):
    write_toy(user_repo)
    out = remote(user_repo, login.env, "sweep", "toy", "--set", "args.lr=0.1,0.02", "--name", "own", host="cluster")
    assert "job array" in out.stderr, out.stderr
    names = ["own-lr0.1", "own-lr0.02"]
    wait_until(lambda: all(run_json(login, n).get("status") == "finished" for n in names), 300, "the array to end")
    assert [run_json(login, n)["command"]["command"][-1] for n in names] == ["--lr=0.1", "--lr=0.02"]
    assert "lr=0.02 seed=0" in train_log(login, "own-lr0.02")
    table = remote(user_repo, login.env, "status", "--sweep", host="cluster").stdout
    assert table.startswith("sweep own: toy, 2/2 finished; best own-lr0.02 (val loss 0.0100)"), table


def test_a_script_of_your_own_checkpoints_at_the_time_limit_requeues_and_finishes_exactly(
    login, user_repo, cluster, tmp_path
):
    """A training script of the user's (enlace.job; not enlace's trainer) as a Slurm job: Slurm's time-limit
    signal reaches it as SIGTERM through the batch step, it checkpoints and exits, the job requeues itself, the
    script starts again, resumes and finishes with weights byte-equal to a straight run of the same script."""
    from test_own_script_resume import TRAIN

    (user_repo / "scripts" / "tiny_train.py").write_text(TRAIN)
    doc = {"command": ["python", "scripts/tiny_train.py", "40", "0.2"], "supervise": {"restarts": 1, "backoff": 0.2}}
    (user_repo / "configs" / "runs" / "own.yaml").write_text(json.dumps(doc) + "\n")
    commit_all(user_repo, "a script of our own")
    remote(user_repo, login.env, "launch", "own", "--no-wait", host="cluster")
    wait_until(lambda: run_json(login, "own").get("step", 0) >= 7, 180, "the script training")
    cluster.run("scancel", "--signal=USR1", "--batch", run_json(login, "own")["job_id"])
    wait_until(lambda: run_json(login, "own").get("status") == "finished", 600, "the script to finish")
    log = train_log(login, "own")
    assert "time limit is near" in log and "requeueing job" in log and "resumed from step-" in log, log
    assert run_json(login, "own")["requeues"] >= 1

    sha = subprocess.run(["git", "-C", str(user_repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    tree = server_dir(login, "cluster") / "trees" / sha.strip()
    env = {**os.environ, "PYTHONPATH": str(tree), "ENLACE_RUN_DIR": str(tmp_path / "straight")}
    subprocess.run([sys.executable, "scripts/tiny_train.py", "40", "0"], cwd=tree, env=env, check=True, timeout=300)
    ours = server_dir(login, "cluster") / "runs" / "own" / "final.bin"
    assert ours.read_bytes() == (tmp_path / "straight" / "final.bin").read_bytes()
