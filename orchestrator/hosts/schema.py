"""The hosts file's schema: what `defaults:` and each `hosts.NAME:` entry may hold, checked key by key
when the file is read (as run configs are), so that a wrong type or range is one line naming the file,
the host, the key and the fix (exit 2) — never a traceback from deep inside a connection.

The Slurm keys are checked by the contract's SlurmSpec (enlace/slurm/settings.py); this module checks the rest.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from enlace.names import quoted
from enlace.slurm.settings import KEYS as SLURM_KEYS
from enlace.yamlio import DuplicateKey, load_yaml_unique, read_bounded
from orchestrator.errors import UsageError

# user@host[:port]; a host is dot-separated labels (no empty label, none starting with `-`) or [IPv6]
LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})"
TARGET_RE = re.compile(
    rf"(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]*)@)?(?P<host>{LABEL}(?:\.{LABEL})*\.?|\[[0-9A-Fa-f:.]+\])(?::(?P<port>\d+))?"
)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class HostFileError(UsageError):
    """One wrong key: `{file}: hosts.{name}.{key}: {problem} — {fix}`."""

    def __init__(self, where: str, problem: str, fix: str = ""):
        super().__init__(f"{where}: {problem}" + (f" — {fix}" if fix else ""))


def _text(value: Any, fix: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{quoted(value)} is not a text value", fix)
    if CONTROL.search(value):
        raise ValueError(f"{quoted(value)} holds a control character (a newline?)", fix)
    return value


def check_target(value: Any) -> str:
    fix = "use USER@HOST[:PORT] or an ~/.ssh/config alias, e.g. alice@gpu1.example.org:2222"
    if not isinstance(value, str) or not TARGET_RE.fullmatch(value):
        raise ValueError(f"{quoted(value)} is neither an ~/.ssh/config alias nor user@host[:port]", fix)
    m = TARGET_RE.fullmatch(value)
    if m.group("port"):
        check_port(int(m.group("port")))
    return value


def check_remote_dir(value: Any) -> str:
    fix = "use an absolute path, ~ or ~/DIR (e.g. ~/enlace or /scratch/alice/enlace)"
    value = _text(value, fix)
    if value.startswith("-"):
        raise ValueError(f"{quoted(value)} starts with `-` (it would read as an option)", fix)
    if value.startswith("~") and value != "~" and not value.startswith("~/"):
        raise ValueError(f"{quoted(value)}: another user's home (~user) is not expanded", fix)
    return value


def check_python(value: Any) -> str:
    value = _text(value, "use `venv` (built on the server) or the path of a python that has torch")
    if value.startswith("-"):
        raise ValueError(f"{quoted(value)} starts with `-`", "use `venv` or a path such as /usr/bin/python3")
    return value


def check_run(value: Any) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ValueError(f"{quoted(value)} is not a run name", "1-64 characters of [A-Za-z0-9._-], e.g. smoke-2060")
    return value


def check_path(value: Any) -> str:
    return _text(value, "a file path, e.g. ~/.ssh/id_ed25519")


def check_timeout(value: Any) -> float:
    fix = "seconds, a number from 1 to 600, e.g. 10"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{quoted(value)} is not a number", fix)
    if not math.isfinite(value) or not 0 < value <= 600:
        raise ValueError(f"{quoted(value)} is out of range", fix)
    return float(value)


def check_user(value: Any) -> str:
    if not isinstance(value, str) or not USER_RE.fullmatch(value):
        raise ValueError(f"{quoted(value)} is not a user name", "1-64 characters of [A-Za-z0-9._-], e.g. alice")
    return value


def check_port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(f"{quoted(value)} is not a TCP port", "use a number from 1 to 65535")
    return value


def check_pip_args(value: Any) -> list[str]:
    fix = "a list, one pip argument per item: [--index-url, https://...]"
    if not isinstance(value, list) or not all(isinstance(v, str) and not CONTROL.search(v) for v in value):
        raise ValueError(f"{quoted(value)} is not a list of strings", fix)
    return value


def check_scheduler(value: Any) -> str:
    if value not in ("ssh", "slurm"):
        raise ValueError(
            f"{quoted(value)} is not a scheduler", "use `slurm` (a login node) or leave it out (plain SSH)"
        )
    return value


def check_cpu_slots(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise ValueError(f"{quoted(value)} is not a number of CPU runs", "a whole number from 1, e.g. 2")
    return value


def check_fraction(value: Any) -> float:
    fix = "a share of a GPU's memory above 0, at most 1, e.g. 0.1 (10%)"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{quoted(value)} is not a share above 0 and at most 1", fix)
    return float(value)


def check_url(value: Any) -> str:
    from urllib.parse import urlsplit

    fix = "an http(s) URL, e.g. https://hooks.slack.com/services/T0/B0/XYZ or https://ntfy.sh/my-runs"
    if not isinstance(value, str) or urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).hostname:
        raise ValueError(f"{quoted(value)} is not an http(s) URL", fix)
    try:
        urlsplit(value).port  # noqa: B018 (raises when the port is not a number)
    except ValueError:
        raise ValueError(f"{quoted(value)}: its port is not a number", fix) from None
    _text(value, fix)
    if " " in value:
        raise ValueError(f"{quoted(value)} holds a space", fix)
    return value


def check_connection(value: Any) -> str:
    if value not in ("direct", "shared"):
        fix = "`shared` (OpenSSH's connection sharing: `enlace-remote login` once) or `direct` (the default)"
        raise ValueError(f"{quoted(value)} is not a connection kind", fix)
    return value


DURATION_RE = re.compile(r"[1-9][0-9]{0,6}[smhdw]?")  # ssh_config(5)'s TIME FORMATS, one unit


def check_duration(value: Any) -> str:
    if not isinstance(value, str) or not DURATION_RE.fullmatch(value):
        raise ValueError(f"{quoted(value)} is not a duration", "a number and a unit (s, m, h, d, w), e.g. 30m or 8h")
    return value


CHECKS = {
    "ssh": check_target,
    "remote_dir": check_remote_dir,
    "python": check_python,
    "default_run": check_run,
    "identity_file": check_path,
    "known_hosts": check_path,
    "connect_timeout": check_timeout,
    "user": check_user,
    "port": check_port,
    "pip_args": check_pip_args,
    "scheduler": check_scheduler,
    "cpu_slots": check_cpu_slots,
    "gpu_free_below": check_fraction,
    "notify": check_url,
    "connection": check_connection,
    "persist": check_duration,
}
HOST_KEYS = frozenset(CHECKS) | frozenset(SLURM_KEYS)


def check_entry(entry: Any, where: str) -> dict[str, Any]:
    """One `defaults:` or `hosts.NAME:` mapping, every key checked; the Slurm keys are left to SlurmSpec."""
    if entry is None:
        return {}
    if not isinstance(entry, dict):
        raise HostFileError(
            where, f"{quoted(entry)} is not a mapping", "give the host's keys on indented lines, e.g. `ssh: alice@gpu1`"
        )
    for key, value in entry.items():
        if key not in HOST_KEYS:
            raise HostFileError(f"{where}.{key}", "unknown key", f"valid: {', '.join(sorted(HOST_KEYS))}")
        if key in CHECKS and value is not None:
            try:
                CHECKS[key](value)
            except ValueError as e:
                problem, fix = e.args
                raise HostFileError(f"{where}.{key}", problem, fix) from None
    return entry


def load(path: Path, strict: bool = True) -> dict[str, Any]:
    """A hosts file, its whole shape and every key checked; {} when there is none. Not `strict`: a host
    whose entry is wrong is left out of `hosts` and its one-line error kept under `invalid` (NAME → error),
    so that one bad entry makes only that host unusable."""

    if path.is_dir():  # ENLACE_HOSTS_FILE naming a folder was read as no file, and `hosts add` failed into it
        raise UsageError(f"{path}: a folder, not a hosts file — name a YAML file (ENLACE_HOSTS_FILE, or the default)")
    if not path.is_file():
        return {}
    try:
        data = load_yaml_unique(read_bounded(path).decode("utf-8")) or {}
    except UnicodeDecodeError as e:
        raise HostFileError(str(path), f"not UTF-8 text (byte {e.start})", "save it as UTF-8") from None
    except DuplicateKey as e:
        raise UsageError(
            f"{path}: line {e.again}: {e.key!r} is given twice (first at line {e.first}); YAML would keep "
            f"only the last and silently drop the first — merge them into one `{e.key}:` entry"
        ) from None
    except yaml.YAMLError as e:
        if hasattr(e, "fix"):  # an alias, a file too large: said by the reader itself
            raise UsageError(f"{path}: {e} — {e.fix}") from None
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UsageError(
            f"{path}: not valid YAML{where} ({getattr(e, 'problem', None) or e.__class__.__name__}) — fix the syntax"
        ) from None
    if not isinstance(data, dict):
        raise HostFileError(str(path), "expected `defaults:` and `hosts:` mappings at the top level")
    for key in data:
        if key not in ("defaults", "hosts"):
            raise HostFileError(str(path), f"unknown key {key!r}", "the file has `defaults:` and `hosts:`")
    check_entry(data.get("defaults"), f"{path}: defaults")
    hosts = data.get("hosts") or {}
    if not isinstance(hosts, dict):
        raise HostFileError(f"{path}: hosts", "is not a mapping", "write `hosts:` then one `NAME:` per host, indented")
    invalid: dict[str, str] = {}
    for name, entry in list(hosts.items()):
        try:
            if not isinstance(name, str) or not NAME_RE.fullmatch(name):
                fix = "1-64 characters of [A-Za-z0-9._-]"
                raise HostFileError(f"{path}: hosts", f"{quoted(name)} is not a host name", fix)
            check_entry(entry, f"{path}: hosts.{name}")
        except HostFileError as e:
            if strict:
                raise
            invalid[str(name)[:64]] = e.message
            del hosts[name]
    return {**data, "invalid": invalid} if invalid else data


def with_new_host(text: str, name: str, entry: dict[str, Any]) -> str | None:
    """`text` (a hosts file) with host `name` added as one line at the end of its block-style `hosts:` mapping,
    every other line as it was, comments included (a rewrite through YAML dropped them); None where the file has
    no such block to add to, or where the result would not read as the file plus that host (the caller then
    rewrites it whole)."""
    lines = text.splitlines()
    top = [i for i, line in enumerate(lines) if re.match(r"hosts:\s*(#.*)?$", line)]
    if not top and not any(line.startswith("hosts:") for line in lines):  # only defaults: and comments
        lines, top = [*lines, "hosts:"], [len(lines)]
    if len(top) != 1:
        return None
    end = top[0] + 1
    for i in range(top[0] + 1, len(lines)):
        if lines[i][:1] not in ("", " ", "#"):  # the next top-level key
            break
        if lines[i].startswith(" ") and lines[i].strip() and not lines[i].lstrip().startswith("#"):
            end = i + 1  # after the block's last entry line
    entries = [ln for ln in lines[top[0] + 1 : end] if ln.strip() and not ln.lstrip().startswith("#")]
    indent = len(entries[0]) - len(entries[0].lstrip()) if entries else 2
    flow = yaml.safe_dump({name: entry}, default_flow_style=True, width=10**6).strip()[1:-1]  # `g1: {ssh: x@y}`
    new = "\n".join([*lines[:end], " " * indent + flow, *lines[end:]]) + "\n"
    try:
        before, after = yaml.safe_load(text) or {}, yaml.safe_load(new)
    except yaml.YAMLError:
        return None
    expected = {**before, "hosts": {**(before.get("hosts") or {}), name: entry}} if isinstance(before, dict) else None
    return new if after == expected else None


def write(path: Path, data: dict[str, Any], kept: str | None) -> None:
    """The hosts file replaced whole, in one rename: `kept` (the file with a new host's line, comments and all),
    else `data` written anew under a header. A place it cannot write is one line naming the file (its place is
    ENLACE_HOSTS_FILE's, not the command line's: it was a traceback), with no temporary copy left beside it."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        header = "# enlace-remote hosts (written by `enlace-remote hosts add`; edit freely)\n"
        tmp.write_text(kept or header + yaml.safe_dump(data, sort_keys=False))
        os.replace(tmp, path)
    except OSError as e:
        raise UsageError(f"{path}: cannot write it ({e.strerror}) — name a hosts file you can write") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
