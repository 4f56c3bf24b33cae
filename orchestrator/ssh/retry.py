"""The driver's one retry policy for transient faults (a refused or timed-out connect, a dropped session, a
stalled read): wait 0.5, 1, 2, 4, 8, then 10 s between tries, and give up once `window_s` seconds have passed
without progress (or when `give_up` says a try must not be repeated). SSH commands, fetch's and data push's
conversations and `logs -f` all retry through it; each says on stderr what it is doing in its own words.

Why not tenacity: the policy is these twenty lines, and each caller needs two hooks tenacity would have to be
bent for (progress that resets the window, and a give-up that depends on the host having answered)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from orchestrator.errors import Transient

T = TypeVar("T")
BACKOFF_S = (0.5, 1, 2, 4, 8, 10)
WINDOW_S = 90.0  # how long a command, a fetch or a push keeps retrying without progress


def backoff(attempt: int) -> float:
    return BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]


def retrying(
    once: Callable[[], T],
    say: Callable[[Transient, float], None],
    window_s: float = WINDOW_S,
    give_up: Callable[[Transient, int], bool] = lambda e, attempt: False,
    progressed: Callable[[], bool] = lambda: False,
) -> T:
    """once(), again after each Transient it raises, until it returns. `say(error, delay)` before each wait;
    `give_up(error, attempt)` ends it at once; `progressed()` (asked after a failed try) restarts the window
    and the backoff: a try that moved the work forward is not a failure to count."""
    attempt, since = 0, time.monotonic()
    while True:
        try:
            return once()
        except Transient as e:
            if progressed():
                attempt, since = 0, time.monotonic()
            if give_up(e, attempt) or time.monotonic() - since > window_s:
                raise
            delay = backoff(attempt)
            attempt += 1
            say(e, delay)
            time.sleep(delay)
