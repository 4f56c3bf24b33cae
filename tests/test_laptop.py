"""The laptop half as a user installs it: `pip install -c constraints.txt .` (no extras) in a fresh venv
gives enlace-remote without torch, and every driver verb works against the test sshd, whose server
python (the test's own, with the trainer) does the training."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.configs import write_tiny_corpus
from support.procs import install_driver
from support.remote import remote, server_dir
from support.repocopy import commit_all


@pytest.fixture(scope="session")
def driver_venv(tmp_path_factory, repo_template) -> Path:
    """A venv with `pip install -c constraints.txt .` of this tree (committed or not): the driver alone."""
    venv = tmp_path_factory.mktemp("laptop") / "venv"
    install_driver(venv, repo_template, sys.executable)
    return venv


@pytest.mark.slow
@pytest.mark.longest
def test_the_driver_alone_installs_without_torch_and_drives_every_verb(driver_venv, sshd, user_repo):
    python = driver_venv / "bin" / "python"
    no_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    assert subprocess.run([str(python), "-c", "import numpy"], capture_output=True).returncode == 0  # matplotlib's
    driver = [str(driver_venv / "bin" / "enlace-remote")]
    run = lambda *args, **kw: remote(user_repo, sshd.env, *args, driver=driver, **kw)

    assert "Ship this repo" in run("--help").stdout
    assert "testhost" in run("hosts").stdout
    run("setup")
    write_tiny_corpus(user_repo / "data" / "tiny")  # the data travels from here, by the driver alone
    pushed = run("data", "push", "tiny")
    assert "data push tiny → testhost: sent" in pushed.stderr, pushed.stderr
    assert sorted(p.name for p in (server_dir(sshd, "testhost") / "data" / "tiny").iterdir()) == sorted(
        p.name for p in (user_repo / "data" / "tiny").iterdir()
    )
    preflight = run("preflight", "tiny", "--steps", "2")
    assert "verdict" in preflight.stdout.lower() or "verdict" in preflight.stderr.lower()
    run("launch", "tiny", "--no-preflight")
    logs = run("logs", "tiny", "-f")
    assert "done (finished)" in logs.stdout
    rows = json.loads(run("status", "tiny", "--json").stdout)
    assert rows[0]["status"] == "finished"
    run("launch", "long", "--no-preflight")
    stopped = run("stop", "long")
    assert "checkpoint" in stopped.stdout
    fetched = run("fetch", "tiny")
    assert (user_repo / "runs" / "tiny" / "checkpoints" / "step-000030" / "MANIFEST").is_file(), fetched.stdout
    run("plot", "tiny", "--out", str(user_repo / "tiny.png"))
    assert (user_repo / "tiny.png").read_bytes()[:4] == b"\x89PNG"
    sample = run("sample", "tiny", "--prompt", "def ", "--bytes", "32")
    assert sample.stdout.startswith("def ")
    export = run("export", "tiny")  # no trainer here: the server exports, the export travels home verified
    assert (user_repo / "exports" / "tiny-hf" / "model.safetensors").is_file(), export.stdout + export.stderr
    _board_lists(driver, user_repo, sshd.env, "tiny")


def _board_lists(driver: list[str], repo: Path, env: dict, run_name: str) -> None:
    """The board from the driver-only install: its page comes from the package, its runs from the host."""
    import os
    import re
    import time
    import urllib.request

    full = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **env}
    cmd = [*driver, "--host", "testhost", "board", "--no-browser", "--hosts", "testhost"]
    proc = subprocess.Popen(cmd, cwd=repo, env=full, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        url = re.search(r"http://\S+", proc.stderr.readline()).group(0)
        token = url.split("token=")[1]
        with urllib.request.urlopen(url, timeout=60) as page:
            assert b"enlace board" in page.read()
        deadline = time.time() + 60
        while True:
            req = urllib.request.Request(url.split("?")[0] + "api/runs", headers={"X-Enlace-Token": token})
            with urllib.request.urlopen(req, timeout=60) as r:
                rows = json.loads(r.read())["rows"]
            if any(r.get("run_name") == run_name for r in rows) or time.time() > deadline:
                break
            time.sleep(0.5)
        assert any(r.get("run_name") == run_name and r["host"] == "testhost" for r in rows), rows
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# a training script of a repository that is not enlace's: prints its steps, writes its output, nothing of enlace
OWN_TRAIN = """\
import argparse, hashlib, pathlib
p = argparse.ArgumentParser(); p.add_argument("--out_dir"); p.add_argument("--steps", type=int)
a = p.parse_args()
data = pathlib.Path("data/shakespeare_char/train.bin").read_bytes()  # where nanoGPT looks, relative to its checkout
print(f"train.bin: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}", flush=True)
for step in range(1, a.steps + 1):
    print(f"iter {step}: loss {1 / step:.4f}", flush=True)
out = pathlib.Path(a.out_dir); out.mkdir(parents=True, exist_ok=True)
(out / "result.txt").write_text(f"trained {a.steps} steps\\n")
"""


@pytest.mark.slow
def test_a_repository_of_your_own_with_the_driver_from_pip(driver_venv, sshd, tmp_path):
    """`git init`, a script, `enlace-remote init` (one run file, nothing else), then the same verbs, with the
    driver pip-installed into a venv without torch: the server runs the driver's own enlace beside the tree."""
    repo = tmp_path / "mine"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "train.py").write_text(OWN_TRAIN)
    (repo / ".gitignore").write_text("*.bin\n")  # as nanoGPT: the prepared data is ignored, its script tracked
    (repo / "data" / "shakespeare_char").mkdir(parents=True)
    (repo / "data" / "shakespeare_char" / "prepare.py").write_text("# writes train.bin\n")
    train_bin = bytes(range(256)) * 300
    (repo / "data" / "shakespeare_char" / "train.bin").write_bytes(train_bin)
    commit_all(repo, "my own training script")
    driver = [str(driver_venv / "bin" / "enlace-remote")]
    run = lambda *args, **kw: remote(repo, sshd.env, *args, driver=driver, **kw)

    run("init", "mine", "--", "python", "train.py", "--out_dir", "{run_dir}/out", "--steps", "5")
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True).stdout
    assert status.split() == ["??", "configs/"], status  # the run file and nothing else
    with open(repo / "configs" / "runs" / "mine.yaml", "a") as fh:
        fh.write('outputs: ["out/*"]\ndata: ["data/shakespeare_char/*.bin"]\n')
    commit_all(repo, "an enlace run")

    out = run("launch", "mine", "--push-data")  # the ignored train.bin goes to the shared data/, once
    assert "installing enlace's server half" in out.stderr, out.stderr
    logs = run("logs", "mine", "-f").stdout
    digest = hashlib.sha256(train_bin).hexdigest()
    assert f"train.bin: {len(train_bin)} bytes, sha256 {digest}" in logs and "iter 5: loss 0.2000" in logs, logs
    assert json.loads(run("status", "mine", "--json").stdout)[0]["status"] == "finished"
    run("fetch", "mine", "--dest", str(tmp_path / "got"))
    assert (tmp_path / "got" / "out" / "result.txt").read_text() == "trained 5 steps\n"

    rd = server_dir(sshd, "testhost")
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert not (rd / "trees" / sha / "enlace").exists()  # the user's tree only; enlace runs from its server half
    (half,) = (rd / "server").iterdir()
    assert (half / "enlace" / "server" / "supervise.py").is_file()
    out = run("launch", "mine")  # again: the server half is there already
    assert "installing" not in out.stderr
