"""The server's entry points before its Python exists: remote.sh (the driver inlines its own copy in every SSH
command) and verify_tree.py (the arrival checklist); here, the package's key and tar, for the server half the
driver installs beside a repository of the user's own. May import: the standard library only (remote.sh and
verify_tree.py run before the tree is known to import)."""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).with_name("remote.sh")
PACKAGE = Path(__file__).resolve().parents[1]  # the enlace package these files belong to


def package_files() -> list[Path]:
    """The package's files, as they ship (no bytecode)."""
    return sorted(p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


@functools.cache
def package_key() -> str:
    """16 hex digits of the package's bytes: the server half's name on a server (server/KEY), so a server always
    runs the very enlace its driver is, and a new version installs beside the old."""
    h = hashlib.sha256()
    for path in package_files():
        h.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def package_tar() -> bytes:
    """The package as an uncompressed tar of enlace/... (what remote.sh's server-install unpacks)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in package_files():
            tar.add(path, arcname=f"enlace/{path.relative_to(PACKAGE).as_posix()}", recursive=False)
    return buf.getvalue()


def is_enlace_checkout(repo: Path) -> bool:
    """Whether a repository is enlace's own checkout (its tree carries enlace/), not one of the user's own."""
    return (repo / "enlace" / "__init__.py").is_file()
