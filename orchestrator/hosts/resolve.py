"""Hosts: where runs go. `--host NAME` / ENLACE_REMOTE_HOST, default `local`.

Settings come from two YAML files, the per-user one winning key by key:

    configs/hosts.yaml                    repo defaults (shipped)
    ~/.config/enlace/hosts.yaml           per user (ENLACE_HOSTS_FILE overrides the path)

    defaults: {remote_dir: ~/enlace, python: python3, connect_timeout: 10}
    hosts:
      gpu1: {ssh: alice@gpu1.example.org:2222, remote_dir: /scratch/enlace, default_run: smoke-2060}
      box:  {}              # an ~/.ssh/config alias: HostName/User/Port/IdentityFile come from there

A NAME not in the files is itself the SSH target: an ~/.ssh/config alias or user@host[:port].
The host `local` runs the same pipeline on this machine without SSH, in .enlace/local/.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from enlace.contract import CPU_SLOTS, GPU_FREE_BELOW
from enlace.errors import EnlaceError
from enlace.slurm.settings import KEYS as SLURM_KEYS
from enlace.slurm.settings import SlurmSpec, spec_from
from orchestrator.errors import UsageError
from orchestrator.hosts import schema as hostfile
from orchestrator.hosts.schema import NAME_RE, TARGET_RE
from orchestrator.hosts.sshconfig import ssh_config_lookup

USER_KNOWN_HOSTS = "~/.ssh/known_hosts ~/.ssh/known_hosts2"  # OpenSSH's defaults (ssh_config(5))
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"


@dataclass
class Host:
    name: str
    local: bool
    remote_dir: str
    python: str
    hostname: str = ""
    user: str | None = None
    port: int = 22
    identity_files: list[str] = field(default_factory=list)
    known_hosts: str = str(Path("~/.ssh/known_hosts").expanduser())  # where --accept-new-host-key writes
    known_hosts_also: tuple[str, ...] = ()  # the other files ssh reads for it (its further user files, the global)
    host_key_alias: str | None = None  # ~/.ssh/config's HostKeyAlias: the name known_hosts knows it by
    revoked_host_keys: str | None = None  # ~/.ssh/config's RevokedHostKeys file
    host_key_algorithms: tuple[str, ...] = ()  # ~/.ssh/config's HostKeyAlgorithms, as `ssh -G` resolves it
    hash_known_hosts: bool = False  # ~/.ssh/config's HashKnownHosts: a key accepted is written hashed
    connect_timeout: float = 10.0
    default_run: str | None = None
    pip_args: list[str] = field(default_factory=list)  # for `python: venv`: e.g. --index-url URL, --find-links DIR
    slurm: SlurmSpec | None = None  # `scheduler: slurm`: a login node; runs go through sbatch
    configured: bool = True  # False: NAME was in no hosts file (taken as an ssh alias or user@host)
    ciphers: str | None = None  # the Ciphers line ~/.ssh/config gives it, if any
    proxy_jump: str | None = None  # ~/.ssh/config's ProxyJump for it: [user@]host[:port] hops, comma-separated
    proxy_command: str | None = None  # ~/.ssh/config's ProxyCommand for it, tokens (%h, %p, ...) unexpanded
    known: tuple[str, ...] = ()  # the host names the files define (for messages)
    cpu_slots: int = CPU_SLOTS  # the host's queue: CPU runs at once
    gpu_free_below: float = GPU_FREE_BELOW  # the host's queue: a GPU others use less than this share of is free
    notify: str | None = None  # POSTed to when a run (or a sweep) there ends, unless launch --notify says otherwise
    alias: str | None = None  # the ~/.ssh/config name it was reached by (its block's other settings apply to ssh)
    connection: str = (
        "direct"  # `shared`: OpenSSH's connection sharing (enlace-remote login; orchestrator/ssh/openssh.py)
    )
    persist: str | None = None  # how long an unused shared connection stays open (ssh's ControlPersist)

    @property
    def known_hosts_key(self) -> str:
        """How known_hosts names this host: its HostKeyAlias, else `host` on port 22, `[host]:port` otherwise."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def describe(self) -> str:
        if self.local:
            return f"local (this machine, {self.remote_dir})"
        return f"{self.user + '@' if self.user else ''}{self.hostname}:{self.port}{self.via} ({self.remote_dir})"

    @property
    def via(self) -> str:
        """How ~/.ssh/config reaches it, for messages: ` via HOP,...`, ` via ProxyCommand`, or nothing."""
        return f" via {self.proxy_jump}" if self.proxy_jump else " via ProxyCommand" if self.proxy_command else ""


def user_hosts_file() -> Path:
    return Path(os.environ.get("ENLACE_HOSTS_FILE") or "~/.config/enlace/hosts.yaml").expanduser()


@functools.cache  # once per process: a sweep resolves its hosts more than once
def _note_no_hosts_file(given: str, name: str) -> None:
    click.echo(f"note: ENLACE_HOSTS_FILE={given} does not exist: {name!r} is taken as an SSH destination", err=True)


@dataclass
class HostTable:
    """The hosts files merged: the repo's configs/hosts.yaml, then the user's. `invalid`: hosts whose entry
    is wrong (NAME → the one-line error), unusable themselves without making the others so."""

    defaults: dict[str, Any]
    hosts: dict[str, dict[str, Any]]
    invalid: dict[str, str]
    files: dict[str, list[str]] = field(default_factory=dict)  # host → the files its entry comes from
    default_files: list[str] = field(default_factory=list)  # the files holding `defaults:`

    def warn_invalid(self, using: str) -> None:
        """One line on stderr per invalid host, when another host is used."""
        for name, error in self.invalid.items():
            if name != using:
                click.echo(f"warning: host {name} is unusable until its entry is fixed: {error}", err=True)


def load_host_table(repo: Path) -> HostTable:
    table = HostTable({}, {}, {})
    for path in (repo / "configs" / "hosts.yaml", user_hosts_file()):
        data = hostfile.load(path, strict=False)
        table.defaults.update(data.get("defaults") or {})
        table.default_files += [str(path)] if data.get("defaults") else []
        for name, entry in (data.get("hosts") or {}).items():
            table.hosts.setdefault(name, {}).update(entry or {})
            table.files.setdefault(name, []).append(str(path))
        table.invalid.update(data.get("invalid") or {})
    return table


def resolve_host(name: str, repo: Path) -> Host:
    return _resolve(name, repo, load_host_table(repo))


def driver_dir(repo: Path) -> Path:
    """<repo>/.enlace, what the driver keeps in a repository (the `local` host's runs, the last runs, sweeps, the
    board's copies), made with a .gitignore of `*`: a `git add -A` staged it (a bare repository, and trees git took
    for embedded repositories), and launch then refused the tree as uncommitted."""
    folder = repo / ".enlace"
    folder.mkdir(exist_ok=True)
    if not (folder / ".gitignore").exists():
        (folder / ".gitignore").write_text("# enlace-remote's own state in this repository: never committed\n*\n")
    return folder


def resolve_hosts(given: str | None, repo: Path) -> list[Host]:
    """--hosts H1,H2,...: each host once, in order ([] for none given). A host named twice started a run's two
    ranks 0 on it, the second refused, and the first waited for its peer until a stop --kill."""
    names = [h.strip() for h in (given or "").split(",") if h.strip()]
    twice = next((h for h in names if names.count(h) > 1), None)
    if twice:
        raise click.BadParameter(f"{twice} is named twice: name each host once", param_hint="--hosts")
    return [resolve_host(name, repo) for name in names]


def _resolve(name: str, repo: Path, loaded: HostTable) -> Host:
    if name in loaded.invalid:
        raise UsageError(loaded.invalid[name])
    loaded.warn_invalid(using=name)
    defaults, table = loaded.defaults, loaded.hosts
    entry = {**defaults, **table.get(name, {})}
    if name == "local":
        _check_local(table.get("local", {}), _where(loaded, "local", table.get("local", {})))
        remote_dir = table.get("local", {}).get("remote_dir") or str(repo / ".enlace" / "local")
        python = table.get("local", {}).get("python") or sys.executable
        return Host(
            "local",
            True,
            str(Path(remote_dir).expanduser()),
            python,
            default_run=entry.get("default_run"),
            slurm=_scheduler(table.get("local", {}), "local"),
            cpu_slots=entry.get("cpu_slots") or CPU_SLOTS,
            gpu_free_below=entry.get("gpu_free_below", GPU_FREE_BELOW),
            notify=entry.get("notify"),
        )
    target = entry.get("ssh") or name
    if name not in table:  # --host NAME is itself the target: checked before any connection
        try:
            hostfile.check_target(name)
        except ValueError as e:
            raise UsageError(f"--host {name!r}: {e.args[0]} — {e.args[1]}") from None
        given = os.environ.get("ENLACE_HOSTS_FILE")
        if given and not user_hosts_file().exists():  # a typo in that path would make every host an SSH destination
            _note_no_hosts_file(given, name)
    m = TARGET_RE.fullmatch(target)
    alias = m.group("host")
    cfg = ssh_config_lookup(alias)
    port = _port(next(p for p in (m.group("port"), entry.get("port"), cfg.get("port"), 22) if p is not None), name)
    identity = entry.get("identity_file")
    identities = [identity] if identity else cfg.get("identityfile", [])
    if identity and not Path(identity).expanduser().is_file():
        raise UsageError(
            f"host {name}: identity_file {identity}: no such file — give the path of your SSH private key "
            "(e.g. ~/.ssh/id_ed25519), or leave identity_file out to use ssh-agent and ~/.ssh/id_*"
        )
    # every file ssh reads (a changed key in any of them is refused), the first of the user's written to
    users = (cfg.get("userknownhostsfile") or USER_KNOWN_HOSTS).split()
    known, *also = [entry["known_hosts"]] if entry.get("known_hosts") else users
    also += (cfg.get("globalknownhostsfile") or GLOBAL_KNOWN_HOSTS).split()
    revoked = _unless_none(cfg.get("revokedhostkeys"))
    return Host(
        name=name,
        local=False,
        remote_dir=entry.get("remote_dir", "~/enlace"),
        python=entry.get("python", "venv"),
        hostname=cfg.get("hostname", alias).strip("[]"),
        user=m.group("user") or entry.get("user") or cfg.get("user"),
        port=port,
        identity_files=[str(Path(p).expanduser()) for p in identities],
        known_hosts=str(Path(known).expanduser()),
        known_hosts_also=tuple(str(Path(p).expanduser()) for p in also),
        host_key_alias=_unless_none(cfg.get("hostkeyalias")),
        host_key_algorithms=tuple(filter(None, (cfg.get("hostkeyalgorithms") or "").split(","))),
        hash_known_hosts=cfg.get("hashknownhosts", "no").lower() == "yes",
        revoked_host_keys=str(Path(revoked).expanduser()) if revoked else None,
        connect_timeout=float(entry.get("connect_timeout") or 10),
        default_run=entry.get("default_run"),
        pip_args=_pip_args(entry.get("pip_args"), name),
        slurm=_scheduler(entry, name, _where(loaded, name, entry)),
        configured=name in table or bool(set(cfg) - {"hostname"}),
        ciphers=cfg.get("ciphers"),
        proxy_jump=_unless_none(cfg.get("proxyjump")),
        proxy_command=_unless_none(cfg.get("proxycommand")),
        known=("local", *sorted(n for n in table if n != "local")),
        cpu_slots=entry.get("cpu_slots") or CPU_SLOTS,
        gpu_free_below=entry.get("gpu_free_below", GPU_FREE_BELOW),
        notify=entry.get("notify"),
        alias=alias if cfg else None,
        connection=entry.get("connection") or "direct",
        persist=entry.get("persist"),
    )


def _check_local(entry: dict[str, Any], where: str) -> None:
    """`local` runs on this machine, from wherever enlace-remote runs: a relative remote_dir made a new server in
    each folder it ran from, and an `ssh:` was ignored without a word."""
    if "ssh" in entry:
        raise UsageError(f"{where}: ssh: `local` runs on this machine without SSH — remove it, or name another host")
    remote_dir = entry.get("remote_dir")
    if remote_dir and not Path(remote_dir).expanduser().is_absolute():
        raise UsageError(
            f"{where}: remote_dir: {remote_dir!r} is relative (to each folder enlace-remote runs from) — "
            "use an absolute path, ~ or ~/DIR"
        )


def _unless_none(value: str | None) -> str | None:
    return None if value is None or value.lower() == "none" else value


JUMP_RE = re.compile(r"(?:(?P<user>[^@:/\s]+)@)?(?P<host>[A-Za-z0-9._-]+)(?::(?P<port>\d+))?")


def proxy_command(host: Host, ssh_options: list[str]) -> str | None:
    """The command line that carries a connection to `host` when ~/.ssh/config reaches it through another
    (for paramiko, which has no ProxyJump and does not expand tokens), run by /bin/sh as ssh runs it:
    ProxyCommand with %h %p %r %% expanded, or `ssh -W HOST:PORT` through ProxyJump's hops. None: direct."""
    shell = _shell_command(host, ssh_options)
    return shlex.join(["/bin/sh", "-c", f"exec {shell}"]) if shell else None


def _shell_command(host: Host, ssh_options: list[str]) -> str | None:
    if host.proxy_command:

        def token(m: re.Match) -> str:
            values = {"h": host.hostname, "p": str(host.port), "r": host.user or _local_user(), "%": "%"}
            if m.group(1) not in values:
                raise UsageError(
                    f"host {host.name}: ProxyCommand {host.proxy_command!r}: enlace expands %h, %p, %r and %%, not "
                    f"%{m.group(1)} — spell it out in ~/.ssh/config"
                )
            return values[m.group(1)]

        return re.sub(r"%(.)", token, host.proxy_command)
    if not host.proxy_jump:
        return None
    if not shutil.which("ssh"):
        raise UsageError(f"host {host.name}: its ProxyJump ({host.proxy_jump}) needs OpenSSH's ssh client on PATH")
    *via, last = [hop.strip() for hop in host.proxy_jump.split(",")]
    m = JUMP_RE.fullmatch(last)
    if not m:
        raise UsageError(f"host {host.name}: ProxyJump {host.proxy_jump!r}: cannot read {last!r} as [user@]host[:port]")
    first = ["-J", ",".join(via)] if via else []  # the hops before the last, as ssh itself would take them
    port = ["-p", m.group("port")] if m.group("port") else []
    dest = f"{m.group('user')}@{m.group('host')}" if m.group("user") else m.group("host")
    return shlex.join(["ssh", *ssh_options, *first, *port, "-W", f"{host.hostname}:{host.port}", "--", dest])


def _local_user() -> str:
    import getpass

    return getpass.getuser()


def _where(loaded: HostTable, name: str, entry: dict[str, Any]) -> str:
    """Where a host's Slurm keys are written, for its errors: `FILE: hosts.NAME`, or `FILE: defaults` when all
    of them come from the defaults (as the file's own checks name a key)."""
    own = loaded.hosts.get(name, {})
    slurm_keys = [k for k in (*SLURM_KEYS, "scheduler") if entry.get(k) is not None]
    if slurm_keys and not any(k in own for k in slurm_keys) and loaded.default_files:
        return f"{' and '.join(loaded.default_files)}: defaults (for host {name})"
    files = loaded.files.get(name)
    return f"{' and '.join(files)}: hosts.{name}" if files else f"host {name}"


def _scheduler(entry: dict[str, Any], name: str, where: str = "") -> SlurmSpec | None:
    """`scheduler: slurm` and its keys (enlace/slurm/settings.py checks each value); Slurm keys without it are
    refused. Errors name `where` they are written (_where), as the file's own checks do."""
    where = where or f"host {name}"
    kind = entry.get("scheduler") or "ssh"
    if kind not in ("ssh", "slurm"):
        raise UsageError(f"{where}: scheduler: {kind!r} — use `slurm` (a login node) or leave it out (plain SSH)")
    given = sorted(k for k in SLURM_KEYS if entry.get(k) is not None)
    if kind == "ssh":
        if given:
            raise UsageError(f"{where}: {', '.join(given)} only apply to a Slurm host — add `scheduler: slurm`")
        return None
    return spec_from(entry, where)


def _pip_args(value: Any, name: str) -> list[str]:
    return list(value or [])  # its shape was checked when the file was read (hostfile)


def add_host(name: str, entry: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Write (or merge into) the user's hosts file: hosts.NAME gets `entry`'s keys. Returns the file and
    the host's resulting entry."""
    if not NAME_RE.fullmatch(name) or name == "local":
        raise UsageError(f"host name {name!r}: use 1-64 characters of [A-Za-z0-9._-] (and not `local`)")
    given = {k: v for k, v in entry.items() if v not in (None, [])}
    option = {"ssh": "--ssh", "remote_dir": "--remote-dir", "python": "--python", "pip_args": "--pip-arg"}
    for key, value in given.items():  # the option's value must pass the file's own schema
        try:
            hostfile.CHECKS[key](value)
        except ValueError as e:
            flag = option.get(key, "--" + key.replace("_", "-"))
            raise UsageError(f"{flag} {value!r}: {e.args[0]} — {e.args[1]}") from None
    key = given.get("identity_file")
    if key and not Path(key).expanduser().is_file():  # the host would be unusable from the moment it is added
        raise UsageError(f"--identity-file {key}: no such file — give the path of your SSH private key")
    path = user_hosts_file()
    data = hostfile.load(path)  # refuses a broken or duplicated file instead of appending to it
    hosts = data.get("hosts") or {}
    old = path.read_text() if path.is_file() and name not in hosts else ""
    hosts[name] = {**(hosts.get(name) or {}), **given}
    data["hosts"] = hosts
    hostfile.write(path, data, hostfile.with_new_host(old, name, given) if old else None)  # its comments kept
    return path, hosts[name]


def _port(value: Any, name: str) -> int:
    """A TCP port, 1-65535: anything else is refused before it reaches a socket (which would wrap it)."""
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = -1
    if isinstance(value, bool) or not 1 <= port <= 65535:
        raise UsageError(f"host {name}: port {value!r} is not a TCP port — use a number from 1 to 65535")
    return port


def survey_hosts(repo: Path) -> tuple[list[Host], dict[str, str]]:
    """Every host the tables name: the usable ones, and for each other one why not — a wrong value in a file,
    or one only the merged entry shows (Slurm keys, a missing key file)."""
    loaded = load_host_table(repo)
    unusable = dict(loaded.invalid)
    loaded.invalid = {}  # collected above, not raised again per host
    usable = []
    for name in sorted((set(loaded.hosts) | {"local"}) - set(unusable), key=lambda n: (n != "local", n)):
        try:
            usable.append(_resolve(name, repo, loaded))
        except EnlaceError as e:
            unusable[name] = e.format_message()
    return usable, unusable


def list_hosts(repo: Path, warn: bool = True) -> list[Host]:
    """Every usable host (an unusable entry is left out, and said once on stderr with `warn`)."""
    usable, unusable = survey_hosts(repo)
    for name, error in unusable.items() if warn else ():
        click.echo(f"warning: host {name} is unusable until its entry is fixed: {error}", err=True)
    return usable
