"""A git repo holding this checkout's working tree (committed or not), for tests and benches
that need a clean user repo to sync from."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from . import REPO

GIT_ID = ["-c", "user.email=t@enlace.invalid", "-c", "user.name=enlace tests"]


def commit_all(repo: Path, message: str) -> None:
    subprocess.run(["git", "-C", str(repo), *GIT_ID, "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), *GIT_ID, "commit", "-qm", message], check=True)


def copy_worktree_repo(dst: Path, message: str = "working tree") -> Path:
    """Copy every file git would ship (tracked or untracked-not-ignored) into a new repo at dst."""
    out = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard"], capture_output=True, text=True, check=True
    ).stdout
    for f in out.splitlines():
        if (REPO / f).is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dst / f)
    subprocess.run(["git", "init", "-q", str(dst)], check=True)
    commit_all(dst, message)
    return dst
