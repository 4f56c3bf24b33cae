"""Operations on a host that go beyond shipping code: verify, preflight, launch, status, stop."""

from __future__ import annotations

import click

from orchestrator.errors import VerifyError
from orchestrator.session import Session


def verify(session: Session, sha: str, run: str, for_launch: bool = False) -> dict:
    """The server-side checklist for RUN in trees/SHA; prints it, raises VerifyError naming what is missing."""
    args = [sha, session.host.python, run] + (["--for-launch"] if for_launch else [])
    doc = session.call_json("verify", *args, ok_codes=(0, 3))
    if "checks" not in doc:
        raise VerifyError(f"verify on {session.host.name}: {doc.get('error', 'failed')}")
    for c in doc["checks"]:
        mark = "ok " if c["ok"] else "FAIL"
        click.echo(f"  [{mark}] {c['name']}" + (f" — {c['detail']}" if c["detail"] else ""), err=True)
    if not doc["ok"]:
        failed = "; ".join(f"{c['name']}: {c['detail']}" for c in doc["checks"] if not c["ok"])
        raise VerifyError(f"verify {run} on {session.host.name} failed: {failed}")
    click.echo(f"verify: {run} ready on {session.host.name} at {sha[:12]}", err=True)
    return doc
