"""What `enlace-remote board` shows, gathered from the hosts: every run on every host (the status rows), and
one run's curves and log, fetched incrementally as `plot` fetches them. The web side is board_http.py.

    <repo>/.enlace/board/<host>/<run>/   metrics.jsonl, run.json, train.log as last fetched (only the new
                                         bytes travel; fetch.fetch_run_files)

A run's curves are kept parsed between polls and only what metrics.jsonl gained is parsed (curves.py).

One session (one SSH connection) per host, shared by every request and used by one request at a time (a
lock per host); a host that does not answer is one row saying so. The runs table is asked of all hosts in
parallel and kept for RUNS_MAX_AGE_S, so many open pages cost the hosts no more than one.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from enlace.errors import EnlaceError
from enlace.tools.curves import Curves
from orchestrator.errors import UnreachableError
from orchestrator.transfer.fetch import fetch_run_files
from orchestrator.view.status import status_everywhere

RUNS_MAX_AGE_S = 2.0
DOWN_FOR_S = 30.0  # a host that did not answer is asked again after this long (its row says why meanwhile)
RUN_FILES = ("metrics.jsonl", "run.json", "train.log")
LOG_CHUNK = 256 * 1024  # the most log text one answer carries (the page asks again for the rest)


class Board:
    def __init__(self, repo: Path, hosts: list, session_for):
        self.repo, self.hosts = repo, {h.name: h for h in hosts}
        self._session_for = session_for
        self._locks = {name: threading.Lock() for name in self.hosts}
        self._runs: tuple[float, list[dict]] | None = None
        self._runs_lock = threading.Lock()
        self._down: dict[str, tuple[float, str]] = {}  # host → (until, why)
        self._curves: dict[tuple[str, str], Curves] = {}  # (host, run) → its curves, parsed so far

    def session(self, host: str):
        """(lock, session) for a configured host; KeyError for any other name."""
        return self._locks[host], self._session_for(self.hosts[host])

    def runs(self) -> list[dict]:
        """Every run on every host (orchestrator/view/status.py's rows), at most RUNS_MAX_AGE_S old."""

        with self._runs_lock:  # one asking at a time; the others take its answer
            if self._runs and time.monotonic() - self._runs[0] < RUNS_MAX_AGE_S:
                return self._runs[1]

            def session_for(host):
                until, why = self._down.get(host.name, (0.0, ""))
                if time.monotonic() < until:
                    raise UnreachableError(why)
                lock, session = self.session(host.name)
                return _Locked(lock, session, lambda e: self._mark_down(host.name, e))

            rows = status_everywhere(list(self.hosts.values()), session_for)
            self._runs = (time.monotonic(), rows)
            return rows

    def _mark_down(self, host: str, error: UnreachableError) -> None:
        self._down[host] = (time.monotonic() + DOWN_FOR_S, error.format_message().splitlines()[0])

    def warm(self) -> None:
        """Connect to every host and ask for the runs table now, in the background (the first page then
        finds it ready)."""
        threading.Thread(target=self.runs, daemon=True, name="board-warm").start()

    def run(self, host: str, run_name: str, log_offset: int) -> dict[str, Any]:
        """One run's curves, its run.json and its log from `log_offset`, after fetching what is new."""

        dest = self.repo / ".enlace" / "board" / host / run_name
        lock, session = self.session(host)
        error = None
        with lock:
            try:
                fetch_run_files(session, run_name, dest, RUN_FILES, shared=True)
            except EnlaceError as e:  # show what was fetched before, and why it is not newer
                error = e.format_message().splitlines()[0]
            curves = self._curves.setdefault((host, run_name), Curves())
            curves.update(_read_bytes(dest / "metrics.jsonl"))
            drawn = curves.view()
        state = _read_json(dest / "run.json")
        log, offset = _read_from(dest / "train.log", log_offset)
        return {
            "host": host,
            "run_name": run_name,
            "state": state,
            "series": drawn,
            "log": log,
            "log_offset": offset,
            "error": error,
        }


class _Locked:
    """A session whose enlace_json holds the host's lock (status_everywhere calls only that); a host that
    cannot be reached is reported to `on_down`."""

    def __init__(self, lock: threading.Lock, session, on_down):
        self.lock, self.session, self.on_down = lock, session, on_down

    def enlace_json(self, *args, **kwargs):
        with self.lock:
            try:
                return self.session.enlace_json(*args, **kwargs)
            except UnreachableError as e:
                self.on_down(e)
                raise


def _read_bytes(path: Path) -> bytes:
    """A fetched file's bytes; none before it was first fetched."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _read_from(path: Path, offset: int) -> tuple[str, int]:
    """Up to LOG_CHUNK bytes of the log from `offset` (from its last LOG_CHUNK bytes when offset is -1, the
    page's first ask), and the offset after them; cut at a line's end."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "", 0
    if offset < 0 or offset > size:
        offset = max(0, size - LOG_CHUNK)
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read(LOG_CHUNK)
    if offset + len(data) < size and b"\n" in data:
        data = data[: data.rindex(b"\n") + 1]
    return data.decode("utf-8", errors="replace"), offset + len(data)
