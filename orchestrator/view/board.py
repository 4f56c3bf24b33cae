"""What `enlace-remote board` shows, gathered from the hosts: every run on every host (the status rows), and
one run's curves and log, fetched incrementally as `plot` fetches them. The web side is board_http.py.

    <repo>/.enlace/board/<host>/<run>/   metrics.jsonl, run.json, train.log as last fetched (only the new
                                         bytes travel; fetch.fetch_run_files)

A run's curves are kept parsed between polls and only what metrics.jsonl gained is parsed (curves.py).

One session (one SSH connection) per host, used by one read at a time (a lock per host). Every read of a
host runs in the board's own threads, and a request waits for it at most READ_DEADLINE_S: a host that is down
or slow never holds a page. Its runs keep their last-known rows, marked stale with their age (a host never
read is one row saying it is not answering); a run's page shows what was fetched before, saying so. Each
host's runs are read at most once per RUNS_MAX_AGE_S, however many pages ask, and a read under way is
joined, not repeated.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enlace.contract import ErrorKind
from enlace.errors import EnlaceError
from enlace.tools.curves import Curves
from orchestrator.hosts.resolve import driver_dir
from orchestrator.sweep import record, table
from orchestrator.transfer.fetch import fetch_run_files

RUNS_MAX_AGE_S = 2.0
READ_DEADLINE_S = 3.0  # the longest a request waits on a host; past it, the last-known state, marked stale
DOWN_FOR_S = 10.0  # a host that did not answer is asked again after this long (its rows say why meanwhile)
RUN_FILES = ("metrics.jsonl", "run.json", "train.log")
LOG_CHUNK = 256 * 1024  # the most log text one answer carries (the page asks again for the rest)


@dataclass
class _HostState:
    """What the board knows of one host's runs: the last rows it gave, when, and the read under way."""

    rows: list[dict] | None = None
    at: float = 0.0  # monotonic time of the last answer
    error: str = ""  # why the last read failed ("" when it answered)
    failed_at: float = 0.0
    pending: Future | None = None
    guard: threading.Lock = field(default_factory=threading.Lock)


class Board:
    def __init__(self, repo: Path, hosts: list, session_for):
        self.repo, self.hosts = repo, {h.name: h for h in hosts}
        self._copies = driver_dir(repo) / "board"  # each run's files as last fetched: <host>/<run>/
        self._session_for = session_for
        self._locks = {name: threading.Lock() for name in self.hosts}
        self._state = {name: _HostState() for name in self.hosts}
        self._pool = ThreadPoolExecutor(max_workers=max(2, 2 * len(self.hosts)), thread_name_prefix="board-read")
        self._fetches: dict[tuple[str, str], Future] = {}
        self._fetches_guard = threading.Lock()
        self._curves: dict[tuple[str, str], Curves] = {}  # (host, run) → its curves, parsed so far
        self._curves_guard = threading.Lock()

    def session(self, host: str):
        """(lock, session) for a configured host; KeyError for any other name."""
        return self._locks[host], self._session_for(self.hosts[host])

    # -- every run on every host --------------------------------------------------------------------
    def runs(self) -> list[dict]:
        """Every run on every host (orchestrator/view/status.py's rows), each host's at most RUNS_MAX_AGE_S old
        when it answers within READ_DEADLINE_S, else its last-known rows marked stale."""
        pending = {name: f for name in self.hosts if (f := self._refresh(name)) is not None}
        _, late = wait_for(pending.values(), timeout=READ_DEADLINE_S)
        return [row for name in self.hosts for row in self._rows_of(name, pending.get(name) in late)]

    def _refresh(self, name: str) -> Future | None:
        """The read of `name`'s runs under way, started when its rows are older than RUNS_MAX_AGE_S (not while
        the host is marked down)."""
        st, now = self._state[name], time.monotonic()
        with st.guard:
            fresh = st.rows is not None and not st.error and now - st.at < RUNS_MAX_AGE_S
            down = st.error and now - st.failed_at < DOWN_FOR_S
            if st.pending is None and not fresh and not down:
                st.pending = self._pool.submit(self._read_runs, name)
            return st.pending

    def _read_runs(self, name: str) -> None:
        st = self._state[name]
        rows, error = None, "no answer"
        try:
            lock, session = self.session(name)
            with lock:
                rows = [{"host": name, **r} for r in session.enlace_json("latest", "runs")]
            error = ""
        except EnlaceError as e:
            error = e.format_message().splitlines()[0].removeprefix(f"on {name}: ")
            if getattr(e, "kind", None) == ErrorKind.NOT_SYNCED:
                rows, error = [], ""
        except Exception as e:  # an answer of another shape: said on its rows, never a host stuck as fresh
            error = f"an unreadable answer ({type(e).__name__})"
        finally:
            with st.guard:
                if error:
                    st.error, st.failed_at = error, time.monotonic()
                else:
                    st.rows, st.at, st.error = rows, time.monotonic(), ""
                st.pending = None

    def _rows_of(self, name: str, late: bool) -> list[dict]:
        """The host's rows for a page; `late`: its read did not answer within the deadline."""
        st, now = self._state[name], time.monotonic()
        with st.guard:
            rows, error, at = st.rows, st.error, st.at
        if rows is None:  # never answered
            why = f"unreachable: {error}" if error else "not answering yet"
            return [{"host": name, "host_error": why}]
        if not rows:
            return [{"host": name, "host_error": "no runs" if not error else f"unreachable: {error}"}]
        if not (error or late):
            return rows
        why = error or "not answering"
        age = now - at
        return [{**r, "stale_s": age, "stale": f"{name} {why}: as it was {age:.0f} s ago"} for r in rows]

    def warm(self) -> None:
        """Connect to every host and ask for the runs table now, in the background (the first page then
        finds it ready)."""
        for name in self.hosts:
            self._refresh(name)

    # -- sweeps -------------------------------------------------------------------------------------
    def sweeps(self) -> list[dict]:
        """The sweeps launched from this repo, newest first: name, run file, how many runs."""
        found = []
        for name in record.names(self.repo):
            try:
                found.append(record.load(self.repo, name))
            except (EnlaceError, TypeError, ValueError):  # a record it cannot read: left out, the page still shows
                continue
        found.sort(key=lambda s: -s.created)
        return [{"name": s.name, "run_file": s.run_file, "runs": len(s.points)} for s in found]

    def sweep(self, name: str) -> dict[str, Any]:
        """One sweep: its keys, its runs ranked by its metric (the best marked) from the hosts' rows, its progress."""
        sweep = record.load(self.repo, name)
        rows = table.rows_of(sweep, {(r["host"], r["run_name"]): r for r in self.runs() if "run_name" in r})
        return {
            "name": sweep.name,
            "run_file": sweep.run_file,
            "keys": sweep.keys,
            "metric": rows[0]["metric"],  # what rows_of ranked them by
            "progress": table.progress(rows),
            "rows": rows,
        }

    # -- one run ------------------------------------------------------------------------------------
    def run(self, host: str, run_name: str, log_offset: int) -> dict[str, Any]:
        """One run's curves, its run.json and its log from `log_offset`, after fetching what is new (for at
        most READ_DEADLINE_S: past it, what was fetched before, saying so)."""

        dest = self._copies / host / run_name
        self.session(host)  # KeyError for an unknown host, before any thread
        st = self._state[host]
        with st.guard:  # a host known to be down gets no new fetch (it would hold a worker for the retry window)
            down = st.error and time.monotonic() - st.failed_at < DOWN_FOR_S
        with self._fetches_guard:
            fetch = self._fetches.get((host, run_name))
            if (fetch is None or fetch.done()) and not down:
                fetch = self._fetches[(host, run_name)] = self._pool.submit(self._fetch, host, run_name, dest)
        done, _ = wait_for([fetch], timeout=READ_DEADLINE_S) if fetch is not None else (set(), set())
        error = fetch.result() if done and not down else f"{host} is not answering: showing what was fetched before"
        with self._curves_guard:
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

    def _fetch(self, host: str, run_name: str, dest: Path) -> str | None:
        """Fetch the run's files (only the new bytes); None, or why they are not newer."""
        lock, session = self.session(host)
        with lock:
            try:
                fetch_run_files(session, run_name, dest, RUN_FILES, shared=True)
            except EnlaceError as e:  # show what was fetched before, and why it is not newer
                return e.format_message().splitlines()[0]
            except Exception as e:  # never a failed request: the page shows what it has, and why not newer
                return f"fetch failed ({type(e).__name__}): showing what was fetched before"
        return None


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
