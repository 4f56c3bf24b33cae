"""~/.ssh/config as the ssh client reads it (`ssh -G`: Include and Match resolve as for every ssh and git call),
paramiko's parser only where there is no client (or it refused the file)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from orchestrator.sshlib import read_ssh_config


def ssh_config_file() -> Path:
    return Path(os.environ.get("ENLACE_SSH_CONFIG") or "~/.ssh/config").expanduser()


def ssh_config_lookup(alias: str) -> dict[str, Any]:
    """What the ssh config file sets for `alias`, keys lowercased, identityfile a list, hostname always
    (as paramiko's SSHConfig.lookup answers). Asked of the ssh client when there is one, so Include,
    Match and the rest resolve as for every ssh and git call, and no command pays paramiko's import
    (sshlib) to start: the settings where `ssh -G` with the file differs from `ssh -G` without it."""
    path = ssh_config_file()
    if not path.is_file():
        return {}
    mine, bare = ssh_client_settings(alias, str(path), os.devnull)
    if mine and bare:
        found = {k: v if k == "identityfile" else v[0] for k, v in mine.items() if v != bare.get(k)}
        return {**found, "hostname": mine["hostname"][0]}

    return read_ssh_config(path, alias)


def ssh_client_settings(alias: str, *configs: str) -> list[dict[str, list[str]] | None]:
    """`ssh -G` per config file, run side by side: the client's resolved settings for `alias` under
    each, key -> values in order (None where there is no ssh client or it refused the file)."""
    import subprocess

    def settings(out: str) -> dict[str, list[str]] | None:
        found: dict[str, list[str]] = {}
        for line in out.splitlines():
            key, _, value = line.partition(" ")
            found.setdefault(key, []).append(value)
        return found if "hostname" in found else None

    procs: list[subprocess.Popen] = []
    try:
        for config in configs:
            argv = ["ssh", "-G", "-F", config, "--", alias]
            pipes = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL}
            procs.append(subprocess.Popen(argv, text=True, **pipes))
    except OSError:  # no ssh client
        for proc in procs:
            proc.kill()
            proc.communicate()
        return [None] * len(configs)
    answers = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=10)
            answers.append(settings(out) if proc.returncode == 0 else None)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            answers.append(None)
    return answers
