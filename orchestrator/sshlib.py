"""paramiko, imported the one way the driver imports it."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path


def load_paramiko():
    """The paramiko module, imported without `invoke`. paramiko's config module imports invoke when it
    loads, only to run ssh_config's `Match exec` lines: a cost on every remote command (its SSH connection
    is paramiko's). Blocked for that one import (a None entry in
    sys.modules makes `import invoke` fail, which paramiko records); `read_ssh_config` brings invoke back
    for a file that may use `Match exec`."""
    if "paramiko" not in sys.modules and "invoke" not in sys.modules:
        sys.modules["invoke"] = None
        try:
            import paramiko
        finally:
            del sys.modules["invoke"]
    import logging  # loaded by paramiko

    import paramiko

    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # its tracebacks precede our own clean error
    return paramiko


def read_ssh_config(path: Path, alias: str) -> dict:
    """paramiko's reading of an ssh config file for `alias` (where there is no ssh client to ask)."""
    paramiko = load_paramiko()
    text = path.read_text(errors="replace")
    if paramiko.config.invoke is None and "exec" in text.lower():
        with contextlib.suppress(ImportError):  # older paramiko has it as an extra: then its own error names it
            import invoke  # paramiko runs `Match exec` commands with it

            paramiko.config.invoke = invoke
    return dict(paramiko.SSHConfig.from_text(text).lookup(alias))
