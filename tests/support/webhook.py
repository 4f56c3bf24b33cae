"""A webhook endpoint on 127.0.0.1 for the tests: it keeps every JSON document POSTed to it, answers each with
the next status of `answers` (then 200), or — `hang=True` — never answers at all (a dead endpoint that still
accepts connections)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Webhook:
    def __init__(self, answers: tuple[int, ...] = (), hang: bool = False):
        self.received: list[dict] = []
        self.tries = 0
        self._answers, self._hang, self._release = list(answers), hang, threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                hook.tries += 1
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if hook._hang:
                    hook._release.wait(120)
                    return
                status = hook._answers.pop(0) if hook._answers else 200
                if status == 200:
                    hook.received.append(json.loads(body))
                self.send_response(status)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True, name="webhook").start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/secret-token"

    def events(self, kind: str) -> list[dict]:
        return [d for d in self.received if d["event"] == kind]

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()
