"""Two fetches of one run at once (two terminals; `plot` or the board beside a `fetch`): a second `fetch` into
the folder is refused in one line, where it swept the first one's staging away under it (a traceback, 4 times in
6 tries); fetching run files alone (plot, the board) stages in a folder of its own and leaves a fetch's be."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from support.canned import CannedWire, canned_session

from enlace.contract import FRAME
from enlace.errors import AlreadyRunning


def test_a_second_fetch_into_one_folder_is_refused_in_one_line(tmp_path):
    from orchestrator.transfer.fetch import fetch
    from orchestrator.transfer.outputs import one_fetch

    dest = tmp_path / "runs" / "r"
    with one_fetch(str(dest)):  # the first fetch, under way
        with pytest.raises(AlreadyRunning, match=f"another fetch into {dest} is under way") as refused:
            fetch(object(), "r", dest, False)  # (refused before its session is used)
        assert refused.value.exit_code == 7
        assert dest.is_dir()
    assert not dest.exists()  # made for the first one alone, which fetched nothing: not left behind


def test_run_files_fetched_beside_a_fetch_leave_its_staging_be(tmp_path):
    from orchestrator.transfer.fetch import fetch_run_files

    root = tmp_path / "runs" / "r"
    staged = root / ".partial-fetch" / "checkpoints" / "step-000010" / "model.pt"  # a fetch's, under way
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"half a checkpoint")
    dead = subprocess.Popen(["true"])  # a process that is gone: its pid
    dead.wait()
    (root / f".partial-fetch-{dead.pid}-1").mkdir()  # a plot's, killed by SIGKILL: it stayed for good
    (root / f".partial-fetch-{os.getpid()}-1").mkdir()  # a live one's (this process's other thread)
    bodies = {"metrics.jsonl": b'{"step": 1}\n', "run.json": b'{"status": "running"}\n'}
    offer = {"files": {n: len(b) for n, b in bodies.items()}, "checkpoints": [], "run_dir": "/srv/runs/r"}
    wire = json.dumps(offer).encode() + b"\n" + b"".join(FRAME.pack(0, len(b)) + b for b in bodies.values())
    assert fetch_run_files(canned_session(CannedWire(wire)), "r", root, tuple(bodies)) == list(bodies)
    assert {n: (root / n).read_bytes() for n in bodies} == bodies
    assert staged.read_bytes() == b"half a checkpoint"  # left as it was (it was its staging too, then removed)
    left = sorted(p.name for p in root.iterdir() if p.name.startswith(".partial-fetch"))
    assert left == [".partial-fetch", f".partial-fetch-{os.getpid()}-1"]


def test_without_flock_a_lock_is_taken_as_held_alone(tmp_path, monkeypatch):
    """Windows has no fcntl: the driver's advisory lock (orchestrator/ssh/portable.py) is then none at all, and
    a fetch goes on rather than fail; with flock, a second holder of the file is refused."""
    from orchestrator.ssh import portable

    with open(tmp_path / "lock", "a") as first, open(tmp_path / "lock", "a") as second:
        assert portable.held_alone(first) and not portable.held_alone(second)
        monkeypatch.setattr(portable, "fcntl", None)
        assert portable.held_alone(second)
