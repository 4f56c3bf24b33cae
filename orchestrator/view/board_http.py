"""The board's web server: the page (orchestrator/view/board.html, one file with its script and style, no CDN)
and its JSON, on 127.0.0.1 only, every request carrying the board's token (in the URL the page is opened
with, as Jupyter does; the page sends it back in a header) and a Host header naming the address it serves
(127.0.0.1 or localhost, its port), and an Origin, when sent, of the same: a second line against DNS
rebinding. Read-only: nothing here changes a run.

    GET /?token=T                          the page
    GET /api/runs                          every run on every host (rows as `status --all --json` has them)
    GET /api/run?host=H&run=R&log=N        one run's curves, run.json and its log from byte N (-1: its tail)
    GET /api/sweeps                        the sweeps launched from this repo (orchestrator/sweep/record.py)
    GET /api/sweep?name=S                  one sweep's runs, ranked by its metric, and its progress
"""

from __future__ import annotations

import hmac
import json
import secrets
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlsplit

from enlace.contract import RUN_NAME_RE
from enlace.errors import EnlaceError
from orchestrator.errors import UsageError
from orchestrator.view.board import Board

TOKEN_HEADER = "X-Enlace-Token"


class BoardServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, board: Board, port: int = 0, token: str | None = None):
        self.board, self.token = board, token or secrets.token_urlsafe(24)
        self.page = resources.files("orchestrator.view").joinpath("board.html").read_bytes()
        try:
            super().__init__(("127.0.0.1", port), Handler)
        except OSError as e:  # in use (a board left running, a forwarded port), or not ours to take: one line
            raise UsageError(
                f"cannot serve the board on 127.0.0.1:{port}: {e.strerror} — pick another --port (0: any free one)"
            ) from None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/?token={self.token}"


class Handler(BaseHTTPRequestHandler):
    server: BoardServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:
        pass  # the terminal shows the board's URL, not every request

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")  # the token never leaves in a Referer
        self.end_headers()
        self.wfile.write(body)

    def _json(self, doc, status: int = HTTPStatus.OK) -> None:
        self._send(status, json.dumps(doc).encode(), "application/json")

    def _authorized(self, query: dict) -> bool:
        given = self.headers.get(TOKEN_HEADER) or (query.get("token") or [""])[0]
        return hmac.compare_digest(given.encode(), self.server.token.encode())

    def _addressed_to_us(self) -> bool:
        """Host (and Origin, when sent) name this server: a page on another site that rebinds its name to
        127.0.0.1 sends its own name."""
        port = self.server.server_address[1]
        ours = {f"127.0.0.1:{port}", f"localhost:{port}"}
        origin = self.headers.get("Origin")
        return self.headers.get("Host", "") in ours and (origin is None or origin.removeprefix("http://") in ours)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if not self._addressed_to_us():
            self._send(
                HTTPStatus.FORBIDDEN,
                b"403: this board answers only at the address it printed (http://127.0.0.1:PORT/)\n",
                "text/plain",
            )
            return
        if not self._authorized(query):
            self._send(
                HTTPStatus.FORBIDDEN,
                b"403: this board needs its token: open the URL enlace-remote board printed\n",
                "text/plain",
            )
            return
        if url.path == "/":
            self._send(HTTPStatus.OK, self.server.page, "text/html; charset=utf-8")
        elif url.path == "/api/runs":
            self._json({"hosts": list(self.server.board.hosts), "rows": self.server.board.runs()})
        elif url.path == "/api/run":
            host, run = (query.get("host") or [""])[0], (query.get("run") or [""])[0]
            if host not in self.server.board.hosts or not RUN_NAME_RE.fullmatch(run):
                self._json({"error": f"no such host or run: {host!r} {run!r}"}, HTTPStatus.NOT_FOUND)
                return
            try:
                offset = int((query.get("log") or ["-1"])[0])
            except ValueError:
                offset = -1
            self._json(self.server.board.run(host, run, offset))
        elif url.path == "/api/sweeps":
            self._json({"sweeps": self.server.board.sweeps()})
        elif url.path == "/api/sweep":
            try:
                self._json(self.server.board.sweep((query.get("name") or [""])[0]))
            except EnlaceError as e:
                self._json({"error": e.format_message()}, HTTPStatus.NOT_FOUND)
        else:
            self._json({"error": f"no page {url.path}"}, HTTPStatus.NOT_FOUND)
