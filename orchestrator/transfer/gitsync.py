"""`sync`: ship the commit with git, and refuse what would not arrive.

Anything git ignores never reaches the server: an unanchored `data/` once hid enlace/data/ and
configs/data/, and the server got a package that could not import. So sync refuses when git
ignores any file under the shipped dirs, quoting the .gitignore line responsible.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from enlace import remote
from orchestrator.errors import UsageError, VerifyError
from orchestrator.hosts.resolve import driver_dir
from orchestrator.ssh.session import SHA_RE, Session

SHIPPED_DIRS = ("enlace", "configs", "scripts")
BUILD_LITTER = ("__pycache__/", ".pyc", ".pyo")  # ignored on purpose, regenerated on the server


def git(repo: Path, *args: str, check: bool = True, env: dict | None = None) -> str:
    p = subprocess.run(  # its own session: git's ssh has no terminal to prompt on (a verb never prompts)
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    if check and p.returncode != 0:
        raise UsageError(f"`git {' '.join(args)}` failed in {repo}: {(p.stderr or p.stdout).strip()}")
    return p.stdout


def repo_root(start: Path) -> Path:
    p = subprocess.run(["git", "-C", str(start), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if p.returncode != 0:
        raise UsageError(
            f"{start} is not inside a git repository — enlace-remote ships code with git; run it from your "
            "enlace checkout or your own repository (`git init`, commit your script, `enlace-remote init`)"
        )
    return Path(p.stdout.strip())  # enlace's own checkout, or a repository of the user's own (docs/own-script.md)


def ignored_shipped_files(repo: Path) -> list[tuple[str, str]]:
    """(path, 'source:line:pattern') for every file under the shipped dirs that git ignores."""
    untracked = git(repo, "ls-files", "--others", "--ignored", "--exclude-standard", "--", *SHIPPED_DIRS).split("\n")
    tracked = git(repo, "ls-files", "--cached", "--ignored", "--exclude-standard", "--", *SHIPPED_DIRS).split("\n")
    paths = [p for p in untracked + tracked if p and not any(x in p for x in BUILD_LITTER)]
    if not paths:
        return []
    p = subprocess.run(
        ["git", "-C", str(repo), "check-ignore", "-v", "--no-index", "--stdin"],
        input="\n".join(paths),
        capture_output=True,
        text=True,
    )
    out = []
    for line in p.stdout.splitlines():
        source, _, path = line.partition("\t")
        out.append((path, source))
    return sorted(set(out))


@dataclass
class SyncReport:
    commit: str
    dirty: list[str] = field(default_factory=list)
    pushed: bool = False
    seconds: float = 0.0
    tree: str = ""


# the driver's own files here (ignored in enlace's checkout), and enlace.job's checkpoints of a run on this machine
DRIVER_LOCAL = ("?? .enlace/", "?? runs/", "?? exports/", "?? enlace-run/")


def not_in_head(dirty: list[str]) -> list[str]:
    """The configs among `git status --porcelain` lines that HEAD lacks (new, or only staged): the server, which
    reads the commit, will not have them."""
    return [line[3:] for line in dirty if line[:2] in ("??", "A ", "AM") and line[3:].startswith("configs/")]


def local_checks(repo: Path, allow_dirty: bool, check_ignored: bool = True) -> SyncReport:
    sha = git(repo, "rev-parse", "--verify", "-q", "HEAD", check=False).strip()
    if not SHA_RE.fullmatch(sha):  # (--allow-dirty, the other fix offered below, ended in git's own words)
        raise UsageError(f"{repo} has no commit yet, and the server reads a commit — `git add` your files, commit")
    status = git(repo, "status", "--porcelain", "--untracked-files=all").splitlines()
    # in a repository of the user's own, what the driver writes here (last runs, fetched runs) is not a change
    own = () if remote.is_enlace_checkout(repo) else DRIVER_LOCAL
    dirty = [line for line in status if line and not (own and line.startswith(own))]
    if dirty and not allow_dirty:
        listing = "\n".join(f"  {d}" for d in dirty[:30]) + ("\n  ..." if len(dirty) > 30 else "")
        # a run file not in HEAD (a new `init`): the server reads it from the commit, --allow-dirty cannot ship it
        unborn = not_in_head(dirty)
        raise VerifyError(
            f"the working tree has uncommitted changes; they would NOT ship:\n{listing}\n"
            + (
                f"commit them: {', '.join(unborn[:3])} is not in HEAD, and the server reads the commit (--allow-dirty "
                "would ship HEAD without it)"
                if unborn
                else "commit them, or pass --allow-dirty to ship HEAD without them"
            )
        )
    if check_ignored:
        bad = ignored_shipped_files(repo)
        if bad:
            committed = set(git(repo, "ls-files", "--cached", "--", *(path for path, _ in bad)).splitlines())
            said = lambda path: (
                "; committed, it arrives, but a new file beside it would not" if path in committed else ""
            )
            listing = "\n".join(f"  {path}   (ignored by {source}{said(path)})" for path, source in bad[:40])
            raise VerifyError(
                f"git ignores {len(bad)} file(s) the server needs — a file it ignores never arrives:\n{listing}\n"
                "fix .gitignore (anchor root-only entries with a leading slash, e.g. /data/)"
                + ("" if committed >= {path for path, _ in bad} else ", then add and commit the files")
            )
    return SyncReport(commit=sha, dirty=dirty)


def sync(session: Session, repo: Path, allow_dirty: bool = False, check_ignored: bool = True) -> SyncReport:
    """Push HEAD to <remote_dir>/repo.git, check it out under trees/<sha>, prepare the python."""
    t0 = time.perf_counter()
    report = local_checks(repo, allow_dirty, check_ignored)
    if Path(session.host.remote_dir).is_relative_to(repo / ".enlace"):  # the `local` host's, by default
        driver_dir(repo)
    state = session.setup(report.commit)
    if session.server_half and not state.get("server_half"):  # a repository of the user's own: enlace beside it
        install_server_half(session)
    if not state["have_tree"]:
        push(session, repo, report.commit)
        report.pushed = True
    # idempotent; with `python: venv` the first checkout builds the venv: pip's progress is shown as it comes
    argv = session.argv("checkout", report.commit, session.host.python, *session.host.pip_args)
    done = session.stream_call(
        argv, "remote.sh checkout", lambda line: click.echo(f"  server: {line}", err=True), stall_timeout=1800
    )
    report.tree = done["tree"]
    report.seconds = time.perf_counter() - t0
    return report


def install_server_half(session: Session) -> None:
    """The driver's own enlace package, unpacked on the server as server/KEY (remote.sh server-install): what
    runs the supervisor, the run state and the transfers beside a repository of the user's own."""
    click.echo(f"  server: installing enlace's server half {session.server_half} (the driver's own version)", err=True)
    tar = remote.package_tar()
    with session.transport.duplex(session.argv("server-install", str(len(tar))), 120, lambda: None) as wire:
        wire.write(tar)
        code, err = wire.finish()
    if code != 0:
        raise UsageError(
            f"installing enlace's server half on {session.host.name} failed (exit {code}): {err.strip()[-500:]}"
        )


def push(session: Session, repo: Path, sha: str) -> None:
    dest = f"{session.remote_dir}/repo.git"
    t = session.transport
    env = {}
    if t.ssh_argv():
        dest = t.git_url(dest)
        env["GIT_SSH_COMMAND"] = shlex.join(t.ssh_argv())
    git(repo, "push", "--quiet", "--force", dest, f"{sha}:refs/enlace/{sha}", env=env)


def print_sync(rep) -> None:
    if rep.dirty:
        click.echo(
            f"warning: --allow-dirty: {len(rep.dirty)} uncommitted change(s) NOT shipped; "
            f"the server gets HEAD {rep.commit[:12]}",
            err=True,
        )
    sent = "pushed and checked out" if rep.pushed else "already on the server"
    click.echo(f"sync: {rep.commit[:12]} {sent} ({rep.tree}) in {rep.seconds:.2f}s", err=True)
