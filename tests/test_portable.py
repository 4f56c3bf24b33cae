"""The driver and the `local` host on a system without Linux's extras (macOS): the guarded Linux-only calls
are monkeypatched away and the portable fallbacks run, so they cannot rot. Also: the driver's import
closure holds no torch, numpy or trainer module for any verb."""

from __future__ import annotations

import ast
import errno
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO
from support.remote import wait_until

from enlace import sysinfo
from enlace.contract import Status
from enlace.state import runs
from orchestrator.errors import Transient
from orchestrator.ssh import portable
from orchestrator.ssh.duplex import ProcessDuplex


def test_helpers_start_without_prctl_or_pipe_sizing(monkeypatch):
    monkeypatch.setattr(portable, "LINUX", False)
    monkeypatch.setattr(sysinfo, "LINUX", False)

    def no_fcntl(*args):
        raise AssertionError("fcntl.fcntl called on a system without F_SETPIPE_SZ")

    monkeypatch.setattr(fcntl, "fcntl", no_fcntl)
    assert portable.die_with_us() is None
    with ProcessDuplex(["cat"], stall_timeout=30, tick=lambda: None) as helper:
        helper.write(b"hello over a default pipe\n")
        assert helper.read(26) == b"hello over a default pipe\n"


def test_local_liveness_and_machine_facts_without_linux_reads(monkeypatch, tmp_path):
    """The `local` host's run state and preflight's machine facts, with sysinfo's Linux paths off: liveness
    is psutil's (pid + create time), peak RSS the process's ru_maxrss, the CPU name platform's."""
    monkeypatch.setattr(sysinfo, "LINUX", False)
    real_open = open

    def no_proc(path, *args, **kwargs):
        if str(path).startswith("/proc"):
            raise AssertionError(f"{path} read with the Linux paths off")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(sysinfo, "open", no_proc, raising=False)  # sysinfo's own reads (psutil reads its own)
    assert sysinfo.peak_rss_bytes() > 10 * 2**20
    assert sysinfo.total_memory_bytes() > 2**30
    assert isinstance(sysinfo.cpu_name(), str) and sysinfo.cpu_name()
    sysinfo.reset_peak_rss()  # a no-op there, never an error
    proc = subprocess.Popen(["sleep", "60"])
    try:
        runs.update(tmp_path / "r", status=Status.RUNNING, pid=proc.pid, pid_start=runs.proc_start(proc.pid))
        assert runs.observe(tmp_path / "r")["status"] == "running"
    finally:
        proc.kill()
        proc.wait()
    assert runs.observe(tmp_path / "r")["status"] == "crashed"


# -- the driver's import closure ------------------------------------------------------------------

# The enlace modules the driver may import (docs/design.md, "Two halves, one contract", says why each is light).
DRIVER_MAY_IMPORT = {
    "enlace",
    "enlace.contract",
    "enlace.errors",
    "enlace.names",
    "enlace.yamlio",
    "enlace.slurm",  # the packages themselves: their __init__ holds only a docstring
    "enlace.slurm.settings",
    "enlace.preflight",
    "enlace.preflight.report",
    "enlace.clitypes",
    "enlace.tools",
    "enlace.tools.plot",  # the plot verb: matplotlib (and with it numpy), never torch
    "enlace.tools.curves",  # plot's and the board's curves: standard library
    "enlace.config",
    "enlace.config.schema",  # data push/ls resolve a run's data paths here as the trainer does (yaml, stdlib)
    "enlace.config.rules",
    "enlace.config.keys",  # which key a wrong one meant (standard library): schema's errors
    "enlace.config.cards",  # profile: auto, read with nvidia-smi (standard library)
    "enlace.config.command",  # a run of the user's own command: launch and data push read its run file (stdlib)
    "enlace.remote",  # remote.sh and the package's key and tar (standard library)
    "enlace.manifest",  # a checkpoint's MANIFEST (standard library): a command run's resume rule asks for the newest
    "enlace.data",
    "enlace.data.paths",
    "enlace.datadir",  # where a run's data lives, the rule both halves and both kinds of run use (standard library)
    "enlace.hashing",  # the one sha256 of a file (fetch, data push), the venv key (standard library)
    "enlace.units",  # durations for the status table (standard library)
    "enlace.sysinfo",  # the guarded pipe sizing (psutil, standard library)
}
NEVER = ("torch", "numpy")


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    for cand in (REPO.joinpath(*parts).with_suffix(".py"), REPO.joinpath(*parts, "__init__.py")):
        if cand.is_file():
            return cand
    return None


def test_the_drivers_import_closure_has_no_torch_numpy_or_trainer_module():
    """Statically, over every import in every driver module (function-level ones too, which are what the
    verbs run): the driver reaches only the light enlace modules, and none of those reaches torch or numpy
    (plot's matplotlib brings numpy with it; that verb alone)."""
    todo = list((REPO / "orchestrator").rglob("*.py"))
    seen: set[Path] = set()
    reached: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            top = name.split(".")[0]
            if top == "enlace":
                module = name if _module_file(name) else name.rsplit(".", 1)[0]
                reached.add(module)
                if module == "enlace.tools.plot":
                    continue  # matplotlib's numpy: the plot verb only
                if _module_file(module):
                    todo.append(_module_file(module))
            elif top in NEVER:
                raise AssertionError(f"{path.relative_to(REPO)} imports {name}")
    assert reached <= DRIVER_MAY_IMPORT, sorted(reached - DRIVER_MAY_IMPORT)


@pytest.mark.parametrize(
    ("verb", "answer"),
    [
        ("check-config smoke-cpu --json", '"ok": true'),
        ("check-config distill-cpu --json", "run 'smoke-cpu' has no complete checkpoint on this machine"),
        ("runs --json", "[]"),
    ],
)
def test_server_verbs_a_launch_calls_before_training_start_without_torch(verb, answer, project):
    """verify's check-config (of a distillation run too: the answer shows its teacher was looked for) and the run
    list answer without importing torch: each launch waits on them, and torch's import is slow."""
    code = (
        "import sys\nfrom enlace.cli import main\n"
        f"try:\n    main({[*verb.split(), '--root', str(project)]!r}, standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=project, timeout=120)
    assert out.returncode == 0, out.stderr
    assert answer in out.stdout, out.stdout[-500:]


@pytest.mark.parametrize("verb", ["--help", "hosts", "status --help", "launch --help", "fetch --help"])
def test_driver_verbs_start_without_torch_or_numpy(verb):
    code = (
        "import sys\nfrom orchestrator.cli import main\n"
        f"try:\n    main({verb.split()!r}, standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        "bad = [m for m in ('torch', 'numpy', 'enlace.config.schema', 'enlace.train', 'enlace.state.runs') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr


def test_slurm_print_of_a_distillation_run_needs_no_teacher_on_this_machine(repo_template, monkeypatch, tmp_path):
    """The driver reads run_name from the run file by the contract's rule; a config that names a teacher
    checkpoint only the server has is not loaded here (check-config on the server checks the teacher)."""
    from click.testing import CliRunner

    from enlace.config.machine import check_environment
    from enlace.config.schema import load_config
    from enlace.errors import ConfigError
    from orchestrator.cli import main

    assert not (repo_template / "runs").exists()
    monkeypatch.chdir(repo_template)
    monkeypatch.setenv("ENLACE_HOSTS_FILE", str(tmp_path / "none.yaml"))
    result = CliRunner().invoke(main, ["launch", "distill-cpu", "--slurm", "--print"])
    assert result.exit_code == 0, result.output
    assert "enlace slurm-job" in result.output and "distill-cpu" in result.output
    renamed = CliRunner().invoke(main, ["launch", "distill-cpu", "--slurm", "--print", "--set", "run_name=other"])
    assert renamed.exit_code == 0 and "other" in renamed.output
    cfg = load_config("distill-cpu", root=repo_template)  # values only: loads without the teacher
    with pytest.raises(ConfigError, match=r"distill\.teacher"):
        check_environment(cfg)  # where the run starts, the missing teacher is one clear error


def test_local_helpers_die_with_the_driver(tmp_path):
    """Local helpers (git) run with PR_SET_PDEATHSIG: a SIGKILLed enlace-remote leaves none writing on."""
    pidfile = tmp_path / "child.pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import subprocess, time
from orchestrator.ssh.portable import die_with_us
p = subprocess.Popen(["sleep", "120"], preexec_fn=die_with_us())
open({str(pidfile)!r}, "w").write(str(p.pid))
time.sleep(120)
""",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    wait_until(lambda: pidfile.exists() and pidfile.read_text(), what="the child")
    child = int(pidfile.read_text())
    parent.kill()
    parent.wait()
    from enlace.state.runs import proc_start

    wait_until(lambda: proc_start(child) is None, timeout=10, what="the child to die with its parent")


def test_a_command_that_stops_reading_mid_write_still_finishes_with_its_code_and_stderr():
    """Seen under load: a data push to a full disk exited 1 without a word. The server stopped reading in
    mid-write; the rest of the write stayed in stdin's buffer, finish() flushed it into the closed pipe,
    and click took the BrokenPipeError for `| head` closing stdout (exit 1, silent)."""
    script = "import sys; sys.stdin.buffer.read(10); sys.stderr.write('no space left'); sys.exit(9)"
    with ProcessDuplex([sys.executable, "-c", script], stall_timeout=30, tick=lambda: None) as helper:
        helper.write(b"0123456789")
        helper.p.wait(60)  # it has stopped reading: a small write stays in stdin's buffer, its flush fails
        with pytest.raises(Transient):
            helper.write(b"a frame's header")
        assert helper.finish() == (9, "no space left")


def test_an_error_closing_stdin_still_closes_stdout_and_stderr():
    """close() closed stdin, stdout and the stderr file in turn; an error other than EPIPE closing stdin (EIO,
    say) left the other two open."""

    class FailingClose:
        def __init__(self, f):
            self.f = f

        def close(self):
            self.f.close()
            raise OSError(errno.EIO, "Input/output error")

    helper = ProcessDuplex(["cat"], stall_timeout=30, tick=lambda: None)
    helper.p.stdin = FailingClose(helper.p.stdin)
    helper.close()
    assert helper.p.stdin.f.closed and helper.p.stdout.closed and helper.err.closed
    assert helper.p.returncode is not None  # and cat was ended


@pytest.mark.parametrize("pipes_select, chosen", [(True, "SystemSSHDuplex"), (False, "ChannelDuplex")])
def test_a_system_without_select_on_pipes_fetches_over_paramikos_channel(monkeypatch, pipes_select, chosen):
    """Windows' select() takes sockets only: the system ssh client's pipes could not be waited on there (fetch
    and data push would fail at their first read), so a host without a shared connection uses paramiko's
    channel, a socket. The classes are stood in for: choosing one is what is tested (both run for real over
    the test sshd in test_fetch.py)."""
    from orchestrator.ssh import transport

    monkeypatch.setattr(portable, "PIPES_SELECT", pipes_select)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/ssh")  # a Windows 10 laptop has OpenSSH
    for name in ("SystemSSHDuplex", "ChannelDuplex"):
        monkeypatch.setattr(transport, name, lambda *a, name=name: name)
    assert transport.SSHTransport.duplex(object(), ["enlace", "fetch-serve"], 60, lambda: None) == chosen
