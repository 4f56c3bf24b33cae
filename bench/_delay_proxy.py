"""A ProxyCommand that adds a network's latency to loopback: `python _delay_proxy.py HOST PORT DELAY_MS`
carries stdin to the TCP port and the port's bytes to stdout, holding each chunk DELAY_MS in each direction
(a round trip costs 2 x DELAY_MS; bandwidth is not limited). For bench/login.py: a handshake pays the delay
once per round trip it needs, a command on a shared connection once."""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time


def carry(read, write, delay_s: float) -> None:
    """Chunks from read() to write(), each released delay_s after it arrived (order kept)."""
    held: queue.Queue = queue.Queue()

    def release() -> None:
        while True:
            due, chunk = held.get()
            time.sleep(max(0.0, due - time.monotonic()))
            if not chunk:
                write(b"")
                return
            write(chunk)

    t = threading.Thread(target=release, daemon=True)
    t.start()
    while True:
        chunk = read()
        held.put((time.monotonic() + delay_s, chunk))
        if not chunk:
            t.join()
            return


def main() -> None:
    host, port, delay_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    delay = delay_ms / 1000

    def to_stdout(chunk: bytes) -> None:
        if chunk:
            os.write(1, chunk)
        else:
            os._exit(0)

    def to_sock(chunk: bytes) -> None:
        if chunk:
            sock.sendall(chunk)
        else:
            sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=carry, args=(lambda: os.read(0, 65536), to_sock, delay), daemon=True).start()
    carry(lambda: sock.recv(65536), to_stdout, delay)


if __name__ == "__main__":
    main()
