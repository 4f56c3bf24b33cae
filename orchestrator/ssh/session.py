"""A session with one host: the transport plus the server-side script (enlace/remote/remote.sh, from the driver's
own package).

Every remote call is `bash -c <remote.sh> remote.sh REMOTE_DIR VERB ARGS...`, built as an argv
and shlex-joined by the transport: the server needs nothing but bash, git and python, even before
the first sync, and no argument is ever interpreted by a remote shell.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from enlace import remote
from orchestrator.errors import CommandFailed, from_doc
from orchestrator.hosts.resolve import Host
from orchestrator.ssh.transport import Transport

SHA_RE = re.compile(r"[0-9a-f]{40}")


class Session:
    def __init__(self, transport: Transport, repo: Path):
        self.transport, self.repo = transport, repo
        self.host: Host = transport.host
        self.script = remote.SCRIPT.read_text()  # the driver's own: driver and script never disagree
        # a repository of the user's own: the server runs the driver's enlace beside it (server/KEY)
        self.server_half = None if remote.is_enlace_checkout(repo) else remote.package_key()
        self.remote_dir: str | None = None  # absolute, once `setup` has answered

    def argv(self, verb: str, *args: str) -> list[str]:
        half = ["env", f"ENLACE_SERVER={self.server_half}"] if self.server_half else []
        return [*half, "bash", "-c", self.script, "remote.sh", self.remote_dir or self.host.remote_dir, verb, *args]

    def enlace_argv(self, sha: str, *args: str, tied: bool = False) -> list[str]:
        """`python -m enlace ARGS` in trees/SHA ("latest": the newest tree); `tied`: the server side ends
        (with everything it started) when this client goes away."""
        return self.argv("enlace", sha, self.host.python, *(["--exit-with-client"] if tied else []), *args)

    def call_json(self, verb: str, *args: str, timeout: float = 300, ok_codes: tuple[int, ...] = (0,)) -> Any:
        """A remote.sh verb's one JSON answer."""
        r = self.transport.run(self.argv(verb, *args), timeout=timeout, check=False)
        return self.answer(f"remote.sh {verb}", r.stdout, r.stderr, r.exited, ok_codes)

    def enlace_json(
        self, sha: str, *args: str, timeout: float = 600, ok_codes: tuple[int, ...] = (0,), idempotent: bool = True
    ) -> Any:
        """`enlace ARGS --json` on the server: its one JSON answer (an error answer raises, with its exit code)."""
        r = self.transport.run(
            self.enlace_argv(sha, *_with_json(args)), timeout=timeout, check=False, idempotent=idempotent
        )
        return self.answer(f"enlace {args[0]}", r.stdout, r.stderr, r.exited, ok_codes)

    def stream_json(
        self,
        sha: str,
        *args: str,
        on_progress: Callable[[str], None],
        stall_timeout: float,
        ok_codes: tuple[int, ...] = (0,),
    ) -> Any:
        """Like enlace_json for long verbs (preflight, wait): stderr lines go to on_progress as they come;
        the server side ends if this client dies."""
        argv = self.enlace_argv(sha, *_with_json(args), tied=True)
        return self.stream_call(argv, f"enlace {args[0]}", on_progress, stall_timeout, ok_codes)

    def stream_call(
        self,
        argv: list[str],
        what: str,
        on_progress: Callable[[str], None],
        stall_timeout: float,
        ok_codes: tuple[int, ...] = (0,),
    ) -> Any:
        """Run argv; its stderr lines go to on_progress as they arrive; its stdout is the one JSON answer."""
        out, err = bytearray(), bytearray()
        pending = b""

        def on_stderr(chunk: bytes) -> None:
            nonlocal pending
            err.extend(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                if text.strip() and not text.startswith(("Error: ", "Usage: ", "Try ")):  # an error is raised once
                    on_progress(text)

        code = self.transport.stream(argv, out.extend, on_stderr, stall_timeout)
        return self.answer(what, out.decode(errors="replace"), err.decode(errors="replace"), code, ok_codes)

    def answer(self, what: str, stdout: str, stderr: str, exited: int, ok_codes: tuple[int, ...]) -> Any:
        """The protocol: stdout is exactly one JSON document. {"ok": false, "error": ...} is a refusal,
        raised with the server's exit code; anything else on stdout is a failure shown with its output."""
        try:
            doc = json.loads(stdout)
        except json.JSONDecodeError:
            raise CommandFailed(self.host.name, what, exited, stdout + stderr) from None
        if isinstance(doc, dict) and doc.get("ok") is False and doc.get("error"):
            raise from_doc(doc, exited, f"on {self.host.name}", self.host.name)
        if exited not in ok_codes:
            raise CommandFailed(self.host.name, what, exited, stdout + stderr)
        return doc

    def setup(self, sha: str | None = None) -> dict[str, Any]:
        doc = self.call_json("setup", *([sha] if sha else []))
        self.remote_dir = doc["remote_dir"]
        return doc

    def close(self) -> None:
        self.transport.close()


def _with_json(args: tuple[str, ...]) -> tuple[str, ...]:
    """ARGS with --json, before a `--` (after it, arguments belong to the command being started)."""
    if "--json" in args:
        return args
    if "--" in args:
        i = args.index("--")
        return (*args[:i], "--json", *args[i:])
    return (*args, "--json")
