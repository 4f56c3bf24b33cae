"""Run the `enlace` CLI, and the driver `enlace-remote`, as forks of a process that has already
imported torch and the driver's modules.

Every `python -m enlace train` pays a second or more of CPU before its first step importing torch;
every driver command pays for click, paramiko and its own modules (the figures are in
docs/benchmarks.md). The tests start about a hundred trainers and a few hundred driver commands. A fork of a process that has done those
imports, and nothing else (no tensor op has run in it, so no OpenMP pool exists to break in the fork),
runs the same code at once. Each call is still its own process: its own pid, stdio, cwd, environment,
exit status and end.

What a fork cannot give, a real interpreter is used for: a fresh one (`fresh=True`: the cross-process
exactness test, whose two processes would otherwise share one hash seed), an environment that differs
in what is read when torch loads (OMP_NUM_THREADS and the like), an installed driver (its own venv),
and a command whose output the test reads while it runs (pipes: support/remote.popen_remote).
ENLACE_TEST_FORKSERVER=0 turns the fork server off (every call a fresh interpreter).

The server: `python -m support.forkserver SOCKET` imports, prints "ready", then per connection reads
one JSON line {argv, cwd, env} with three file descriptors (stdin, stdout, stderr), forks, answers
{"pid"} and, once the child has ended, {"returncode"} (negative: killed by that signal, as
subprocess says it). argv is a python command line: `python -m MODULE ARGS` or `python -c CODE ARGS`."""

from __future__ import annotations

import atexit
import json
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from orchestrator.ssh.portable import die_with_us

from . import REPO

PRELOAD = (
    "torch",
    "enlace.cli",
    "enlace.train.loop",
    "enlace.preflight.measure",
    "enlace.tools.sample",
    "orchestrator.cli",
    "orchestrator.commands.run",
    "orchestrator.commands.data",
    "orchestrator.commands.tools",
    "orchestrator.launch.pipeline",
    "orchestrator.ssh.transport",
    "orchestrator.transfer.fetch",
    "orchestrator.view.status",
    "paramiko",
)
READ_AT_IMPORT = ("OMP_", "MKL_", "KMP_", "OPENBLAS_", "PYTHON", "LD_", "TORCH", "CUDA")
# What torch writes into os.environ itself, once in use, and reads only then: a test process that ran
# a compiled or exported model has it set, and must not lose the fork server for the rest of its tests.
SET_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR",)


# -- the client (the test's side) ----------------------------------------------------------------


class Forked:
    """A forked `python -m enlace`: the part of subprocess.Popen the tests use (pid, poll, wait,
    send_signal, kill), its stdout and stderr in files read once it has ended."""

    def __init__(self, args: list[str], conn: socket.socket, out, err) -> None:
        self.args, self.returncode = args, None
        self._conn, self._buffer, self._out, self._err = conn, b"", out, err
        self.pid = self._reply(None)["pid"]

    def _reply(self, timeout: float | None) -> dict:
        self._conn.settimeout(timeout)
        while b"\n" not in self._buffer:
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError(f"the test fork server went away while running {shlex.join(self.args)}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def poll(self) -> int | None:
        if self.returncode is None and (self._buffer or select.select([self._conn], [], [], 0)[0]):
            self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = self._reply(timeout)["returncode"]
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self._conn.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def output(self) -> tuple[str, str]:
        """stdout and stderr (the same text when merged) once it has ended."""
        self.wait()
        texts = []
        for f in (self._out, self._err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
        return texts[0], texts[1]


class Fresh(subprocess.Popen):
    """A new interpreter, with the one method Forked adds to Popen."""

    def output(self) -> tuple[str, str]:
        out, err = self.communicate()
        return out, out if err is None else err


class _Client:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="enlace-forkserver-"))
        self.socket = str(self.dir / "sock")
        self.env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "support.forkserver", self.socket],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_us(),  # noqa: PLW1509 - prctl only: a worker killed outright leaves no server
        )
        ready = self.proc.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"the test fork server did not start (said {ready!r}, exit {self.proc.poll()})")
        atexit.register(self.close)

    def serves(self, env: dict) -> bool:
        """Whether a fork of this server can stand for a fresh interpreter under `env`."""
        keys = {k for k in {*env, *self.env} if k.startswith(READ_AT_IMPORT)} - {"PYTHONPATH", *SET_BY_TORCH}
        return self.proc.poll() is None and all(env.get(k) == self.env.get(k) for k in keys)

    def start(self, argv: list[str], cwd: Path, env: dict, merge_stderr: bool = False) -> Forked:
        out = tempfile.TemporaryFile()
        err = out if merge_stderr else tempfile.TemporaryFile()
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(self.socket)
        request = json.dumps({"argv": argv, "cwd": str(cwd), "env": env}).encode() + b"\n"
        with open(os.devnull, "rb") as stdin:
            socket.send_fds(conn, [request], [stdin.fileno(), out.fileno(), err.fileno()])
        return Forked(argv, conn, out, err)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for p in self.dir.iterdir():
            p.unlink()
        self.dir.rmdir()


_started: list[_Client] = []  # this process's fork servers; the last one is the live one


def _server() -> _Client:
    if not _started or _started[-1].proc.poll() is not None:
        _started.append(_Client())
    return _started[-1]


def _enlace_argv(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "enlace", *args]


def _warm_server(env: dict) -> _Client | None:
    """The warm server, where a fork of it can stand for a fresh interpreter under `env`."""
    if os.environ.get("ENLACE_TEST_FORKSERVER", "1") == "0":
        return None
    server = _server()
    return server if server.serves(env) else None


def start_enlace(args: list[str], cwd: Path, env: dict, merge_stderr: bool = False) -> Forked | Fresh:
    """`python -m enlace ARGS` started in `cwd` under `env`, not waited for (start_python)."""
    return start_python(_enlace_argv(args), cwd, env, merge_stderr)


def start_python(cmd: list[str], cwd: Path, env: dict, merge_stderr: bool = False) -> Forked | Fresh:
    """A python command line started in `cwd` under `env`, not waited for: a Forked, or a Fresh
    interpreter where a fork cannot stand for one. Both say what it wrote with .output()."""
    server = _warm_server(env)
    if server is not None:
        return server.start(cmd, cwd, env, merge_stderr)
    err = subprocess.STDOUT if merge_stderr else subprocess.PIPE
    return Fresh(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True)


def run_enlace(args: list[str], cwd: Path, env: dict, timeout: float, fresh: bool) -> subprocess.CompletedProcess:
    """`python -m enlace ARGS` in `cwd` under `env`, to its end (a new interpreter with `fresh`)."""
    return run_python(_enlace_argv(args), cwd, env, timeout, fresh)


def run_python(cmd: list[str], cwd: Path, env: dict, timeout: float, fresh: bool) -> subprocess.CompletedProcess:
    """A python command line (`sys.executable -m MODULE ...` or `-c CODE ...`) in `cwd` under `env`, to its
    end: forked where it can be, else (or with `fresh`) a new interpreter."""
    server = None if fresh else _warm_server(env)
    if server is None:
        return subprocess.run(
            cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env, stdin=subprocess.DEVNULL
        )
    proc = server.start(cmd, cwd, env)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    out, err = proc.output()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# -- the server -----------------------------------------------------------------------------------


def _child(request: dict, fds: list[int]) -> None:
    """In the fork: become `python -m MODULE ARGS` or `python -c CODE ARGS`, as request["argv"] says."""
    import runpy

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _, flag, what, *args = request["argv"]
    if flag == "-m":
        sys.argv = [what, *args]  # runpy sets argv[0] to the module's file, as `python -m` does
        runpy.run_module(what, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *args]  # what `python -c` gives
        exec(compile(what, "<string>", "exec"), {"__name__": "__main__"})


def _wait_and_answer(conn: socket.socket, pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    with conn:
        conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


def serve(path: str) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        while not message.endswith(b"\n"):  # a stream socket may hand the request over in parts (a loaded host):
            more = conn.recv(1 << 20)  # a child given half of it failed before its output was set up, and
            if not more:  # exited 1 without a word
                break
            message += more
        pid = os.fork()
        if pid == 0:  # the child ends as the interpreter would: SystemExit, an exception, or returning
            listener.close()
            conn.close()
            _child(json.loads(message), fds)
            sys.exit(0)
        for fd in fds:
            os.close(fd)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        threading.Thread(target=_wait_and_answer, args=(conn, pid), daemon=True).start()


if __name__ == "__main__":
    serve(sys.argv[1])
