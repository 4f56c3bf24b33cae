"""Shared fixtures: a throwaway project root with the shipped configs and a tiny corpus."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

# A model small enough that a step takes milliseconds on 2 cores.
TINY = {
    "model": {"seq_len": 32, "n_layer": 2, "n_head": 2, "d_model": 32, "dropout": 0.1},
    "optim": {"learning_rate": 3e-3, "min_lr": 3e-4, "warmup_steps": 2},
    "training": {"batch_size": 4, "max_steps": 20, "log_every": 1, "eval_every": 5, "eval_batches": 2},
    "checkpoint": {"every": 5, "keep": 2},
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project root: the repo's configs/ plus data/tiny/*.txt (a few hundred KB of real text)."""
    root = tmp_path / "proj"
    shutil.copytree(REPO / "configs", root / "configs")
    corpus = root / "data" / "tiny"
    corpus.mkdir(parents=True)
    import json
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for i, src in enumerate(sorted((stdlib / "json").glob("*.py"))):
        (corpus / f"{i:02d}-{src.stem}.txt").write_bytes(src.read_bytes())
    (corpus / "zz-json-doc.txt").write_text(json.__doc__ or "")
    (root / "configs" / "data" / "tiny.yaml").write_text("kind: bytes\npaths: ['data/tiny/*.txt']\nval_fraction: 0.1\n")
    return root


def write_run(root: Path, name: str, base: dict | None = None, **sections) -> Path:
    """configs/runs/<name>.yaml from TINY (or `base`), with sections merged over it."""
    doc: dict = {"data": "tiny", "profile": "cpu"}
    for key, value in (base if base is not None else TINY).items():
        doc[key] = dict(value) if isinstance(value, dict) else value
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key].update(value)
        else:
            doc[key] = value
    path = root / "configs" / "runs" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def sshd(tmp_path: Path):
    """A real sshd on 127.0.0.1 with a trusted host key; .env points enlace-remote at it."""
    from sshd import make_server

    srv = make_server(tmp_path)
    yield srv
    srv.stop()
    kill_processes_under(tmp_path)


def kill_processes_under(path: Path) -> None:
    """Detached trainers a failed test left behind (their cwd is a tree under `path`)."""
    import os
    import signal

    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(path)) and int(pid) != os.getpid():
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture(scope="session")
def repo_template(tmp_path_factory) -> Path:
    """A git repo holding the current working tree (committed or not), committed once."""
    from repocopy import copy_worktree_repo

    return copy_worktree_repo(tmp_path_factory.mktemp("template") / "repo", "template")


@pytest.fixture
def user_repo(tmp_path: Path, repo_template: Path) -> Path:
    """The user's checkout: a clone of the template plus the tiny corpus config, committed."""
    import subprocess

    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(repo_template), str(repo)], check=True)
    (repo / "configs" / "data" / "tiny.yaml").write_text("kind: bytes\npaths: ['data/tiny/*.txt']\nval_fraction: 0.1\n")
    write_run(repo, "tiny", training={"max_steps": 30, "log_every": 1, "eval_every": 10}, run_name="tiny")
    write_run(
        repo,
        "long",
        training={"max_steps": 1_000_000, "log_every": 1, "eval_every": 0},
        run_name="long",
        checkpoint={"every": 50, "keep": 2},
    )
    from repocopy import commit_all

    commit_all(repo, "tiny and long runs")
    return repo
