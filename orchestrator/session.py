"""A session with one host: the transport plus the server-side script (scripts/remote.sh).

Every remote call is `bash -c <remote.sh> remote.sh REMOTE_DIR VERB ARGS...`, built as an argv
and shlex-joined by the transport: the server needs nothing but bash, git and python, even before
the first sync, and no argument is ever interpreted by a remote shell.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from orchestrator.errors import CommandFailed, RemoteError, UsageError
from orchestrator.hosts import Host
from orchestrator.transport import Result, Transport

RUN_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SHA_RE = re.compile(r"[0-9a-f]{40}")


def check_run_name(name: str, what: str = "RUN") -> str:
    """Refuse anything but a plain run/config name before any I/O (no paths, no shell syntax)."""
    if not RUN_NAME_RE.fullmatch(name or ""):
        raise UsageError(f"{what} {name!r} is not a valid name: 1-64 characters of [A-Za-z0-9._-], starting "
                         "with a letter or digit")  # fmt: skip
    return name


class Session:
    def __init__(self, transport: Transport, repo: Path):
        self.transport, self.repo = transport, repo
        self.host: Host = transport.host
        self.script = (repo / "scripts" / "remote.sh").read_text()
        self.remote_dir: str | None = None  # absolute, once `setup` has answered

    def argv(self, verb: str, *args: str) -> list[str]:
        return ["bash", "-c", self.script, "remote.sh", self.remote_dir or self.host.remote_dir, verb, *args]

    def call(self, verb: str, *args: str, timeout: float = 300, check: bool = True) -> Result:
        return self.transport.run(self.argv(verb, *args), timeout=timeout, check=check)

    def call_json(self, verb: str, *args: str, timeout: float = 300, ok_codes: tuple[int, ...] = (0,)) -> dict[str, Any]:
        r = self.call(verb, *args, timeout=timeout, check=False)
        doc = _last_json(r.stdout)
        if r.exited not in ok_codes and doc is None:
            raise CommandFailed(self.host.name, f"remote.sh {verb} {' '.join(args)}", r.exited, r.stdout + r.stderr)
        self._raise_refusal(doc, r.exited, ok_codes)
        if doc is None:
            raise RemoteError(f"on {self.host.name}: remote.sh {verb} gave no JSON:\n{(r.stdout + r.stderr)[-1500:]}")
        doc["_exit"] = r.exited
        return doc

    def _raise_refusal(self, doc: Any, exited: int, ok_codes: tuple[int, ...]) -> None:
        """remote.sh's own refusals are JSON {"ok": false, "error": ...}: show that one line."""
        if exited not in ok_codes and isinstance(doc, dict) and doc.get("ok") is False and doc.get("error"):
            raise RemoteError(f"on {self.host.name}: {doc['error']}")

    def setup(self, sha: str | None = None) -> dict[str, Any]:
        doc = self.call_json("setup", *([sha] if sha else []))
        self.remote_dir = doc["remote_dir"]
        return doc

    def enlace(self, sha: str, *args: str, timeout: float = 600, check: bool = True) -> Result:
        """`python -m enlace ARGS` in trees/SHA on the server ("latest": the newest tree)."""
        return self.call("enlace", sha, self.host.python, *args, timeout=timeout, check=check)

    def enlace_json(self, sha: str, *args: str, timeout: float = 600, ok_codes=(0,)) -> Any:
        r = self.enlace(sha, *args, timeout=timeout, check=False)
        doc = _last_json(r.stdout)
        self._raise_refusal(doc, r.exited, ok_codes)
        if doc is not None and r.exited in ok_codes:
            return doc
        if r.exited == 2:  # a user error on the server (e.g. no such run): show its one line
            err = (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or ["no output"])[-1]
            raise UsageError(f"on {self.host.name}: {err.removeprefix('Error: ')}")
        raise CommandFailed(self.host.name, f"enlace {' '.join(args)}", r.exited, r.stdout + r.stderr)

    def close(self) -> None:
        self.transport.close()


def _last_json(text: str) -> Any:
    """`text` as JSON, or its last line that parses as JSON (after progress lines)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith(("{", "[")):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None
