"""The laptop half as a user installs it: `pip install -c constraints.txt .` (no extras) in a fresh venv
gives enlace-remote without torch, and every driver verb works against the test sshd, whose server
python (the test's own, with the trainer) does the training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.procs import install_driver
from support.remote import remote, server_dir, tiny_corpus


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
    tiny_corpus(server_dir(sshd, "testhost"))
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
    export = run("export", "tiny", check=False)  # the trainer is not here: said, with the way on the server
    assert export.returncode == 2 and "enlace-remote shell tiny -- enlace export tiny" in export.stderr
