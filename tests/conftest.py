"""Shared fixtures: a throwaway project root, a user repo, a real sshd. What they are built from is
tests/support/ (pytest's pythonpath is tests/, see pyproject.toml)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from support import REPO
from support.configs import write_run, write_tiny_corpus
from support.procs import kill_processes_under
from support.repocopy import commit_all, copy_worktree_repo
from support.sshd import make_server

TINY_DATA = "kind: bytes\npaths: ['data/tiny/*.txt']\nval_fraction: 0.1\n"


def pytest_configure(config: pytest.Config) -> None:
    """With N xdist workers on C cores, each worker's torch (and every trainer it starts, here or
    through the test sshd) gets C // N threads: N processes each spinning C OpenMP threads on C cores
    wait on one another. An OMP_NUM_THREADS of your own wins."""
    # the `local` host's queue (enlace/server/queue.py) is the account's: one per test process, so that the
    # workers' runs do not wait for one another (each test sshd's account has its own HOME, hence its own)
    os.environ["ENLACE_QUEUE_DIR"] = tempfile.mkdtemp(prefix="enlace-queue-")
    # the shared connections' sockets (orchestrator/ssh/openssh.py): a short path of the test process's own
    os.environ["ENLACE_CONTROL_DIR"] = tempfile.mkdtemp(prefix="enlace-ssh-")
    config.enlace_dirs = [os.environ["ENLACE_QUEUE_DIR"], os.environ["ENLACE_CONTROL_DIR"]]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


def pytest_unconfigure(config: pytest.Config) -> None:
    """This test process's queue and socket folders go with it (each run used to leave two in /tmp)."""
    for folder in getattr(config, "enlace_dirs", []):
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `longest` tests first, then the other `slow` ones, then the quick ones (a stable sort: each
    kind keeps its order), so the last tests the workers share are short ones. Seen with 2 workers
    beside a CPU hog: the 4-min sample-quality test, collected late, ran alone for its last 15 min."""
    items.sort(key=lambda item: (item.get_closest_marker("longest") is None, item.get_closest_marker("slow") is None))


def make_project(root: Path) -> Path:
    """A project root: the repo's configs/ plus data/tiny/*.txt (a few hundred KB of real text)."""
    shutil.copytree(REPO / "configs", root / "configs")
    write_tiny_corpus(root / "data" / "tiny")
    (root / "configs" / "data" / "tiny.yaml").write_text(TINY_DATA)
    return root


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")


@pytest.fixture(scope="module")
def module_project(tmp_path_factory) -> Path:
    """One project for a module's tests that share what they train (each test adds its own runs)."""
    return make_project(tmp_path_factory.mktemp("module") / "proj")


@pytest.fixture
def sshd(tmp_path: Path):
    """A real sshd on 127.0.0.1 with a trusted host key; .env points enlace-remote at it."""
    srv = make_server(tmp_path)
    yield srv
    srv.stop()
    kill_processes_under(tmp_path)


@pytest.fixture(scope="session")
def repo_template(tmp_path_factory) -> Path:
    """A git repo holding the current working tree (committed or not), committed once."""
    return copy_worktree_repo(tmp_path_factory.mktemp("template") / "repo", "template")


@pytest.fixture
def user_repo(tmp_path: Path, repo_template: Path) -> Path:
    """The user's checkout: a clone of the template plus the tiny corpus config, committed."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(repo_template), str(repo)], check=True)
    (repo / "configs" / "data" / "tiny.yaml").write_text(TINY_DATA)
    write_run(repo, "tiny", training={"max_steps": 30, "log_every": 1, "eval_every": 10}, run_name="tiny")
    write_run(
        repo,
        "long",
        training={"max_steps": 1_000_000, "log_every": 1, "eval_every": 0},
        run_name="long",
        checkpoint={"every": 50, "keep": 2},
    )
    commit_all(repo, "tiny and long runs")
    return repo


@pytest.fixture
def fresh_users():
    """A factory of fresh unix accounts (own HOME, no password, not locked); all removed afterwards."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("creating a fresh unix account needs root and useradd")
    made: list[str] = []

    def make() -> str:
        name = f"enl{uuid.uuid4().hex[:8]}"
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", "-p", "*", name], check=True)  # "*": no password
        made.append(name)
        return name

    try:
        yield make
    finally:
        for name in made:
            subprocess.run(["pkill", "-KILL", "-u", name], check=False)
            subprocess.run(["userdel", "-r", "-f", name], capture_output=True, check=False)
            shutil.rmtree(f"/tmp/torchinductor_{name}", ignore_errors=True)  # torch's per-user dir; userdel keeps it


@pytest.fixture
def fresh_user(fresh_users) -> str:
    return fresh_users()
