"""A run's curves from its metrics.jsonl, as `plot` and the board draw them: the run as it stands (a start
from step S drops what an earlier attempt logged after S), parsed once and extended as the file grows, and
thinned to what the board's chart can draw. Standard library only: the driver imports it.

A run of a million steps logs a million train records. Parsed afresh on every poll (every 2 s per open
page) and sent whole, that was seconds of CPU per poll, megabytes per answer, and a page whose chart threw
(chromium's Math.min(...points) throws on a long array; figures in docs/benchmarks.md). So `Curves` keeps
what it parsed, columns of numbers, and takes only the bytes added since; the file is parsed again from
its start only when it no longer begins with the bytes already parsed (rewritten). `view` sends at most
MAX_POINTS points a curve: per bucket of consecutive records the lowest and the highest value (a spike
stays visible), and always the first and the last record.
"""

from __future__ import annotations

import hashlib
import json
import math
from array import array
from bisect import bisect_right
from typing import Any

MAX_POINTS = 1000  # per curve: about two per unit of the page's 440-unit-wide chart


class _Columns:
    """Records of one kind: their steps (non-decreasing, as the run stands) and one column per field
    (NaN where a record had no finite number)."""

    def __init__(self, fields: tuple[str, ...]):
        self.fields = fields
        self.steps = array("q")
        self.values = [array("d") for _ in fields]
        self._size, self._chosen = 0, {}  # _thin's bucket length, and its choice per full bucket (by start)

    def append(self, step: int, rec: dict) -> None:
        self.steps.append(step)
        for column, name in zip(self.values, self.fields):
            v = rec.get(name)
            number = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            column.append(float(v) if number else math.nan)  # NaN, inf: no JSON number the page can read

    def cut_after(self, step: int) -> None:
        """Drop the records after `step` (a start at `step` trains them again)."""
        keep = bisect_right(self.steps, step)
        del self.steps[keep:]
        for column in self.values:
            del column[keep:]
        self._size, self._chosen = 0, {}

    def pairs(self, field: str) -> list[tuple[int, float]]:
        """(step, value) of every record with a number for `field`, unthinned (what plot draws)."""
        column = self.values[self.fields.index(field)]
        return [(step, v) for step, v in zip(self.steps, column) if not math.isnan(v)]

    def points(self, max_points: int) -> list[list]:
        """[step, *fields] per kept record (None for a missing number): at most max_points of them, chosen
        by the first field (_thin)."""
        rows = self._thin(max_points)
        return [[self.steps[i], *(None if math.isnan(c[i]) else c[i] for c in self.values)] for i in rows]

    def _thin(self, max_points: int) -> list[int]:
        """Indices to keep: all when they fit, else per bucket of consecutive records the lowest and the
        highest first field (a missing number never chosen over a present one), plus the first and the last
        record. Buckets are a power of two long, so a full one never changes until the run doubles: its
        choice is kept (_chosen) and a poll looks only at the last, growing bucket."""
        n, key = len(self.steps), self.values[0]
        if n <= max_points:
            return list(range(n))
        size = 1 << math.ceil(math.log2(n / max(1, (max_points - 2) // 2)))
        if size != self._size:
            self._chosen, self._size = {}, size

        def low(i: int) -> float:
            return math.inf if math.isnan(key[i]) else key[i]

        def high(i: int) -> float:
            return -math.inf if math.isnan(key[i]) else key[i]

        keep = {0, n - 1}
        for start in range(0, n, size):
            chosen = self._chosen.get(start)
            if chosen is None:
                span = range(start, min(start + size, n))
                chosen = (min(span, key=low), max(span, key=high))
                if len(span) == size:
                    self._chosen[start] = chosen
            keep.update(chosen)
        return sorted(keep)


class Curves:
    """metrics.jsonl as curves, as the run stands: a start from step S drops what an earlier attempt logged
    after S (the steps it trains again). Feed it the file's bytes with `update`; read it with `view`."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.consumed = 0  # bytes of the file parsed: whole lines only
        self._digest = hashlib.sha256().digest()  # of those bytes
        self.train = _Columns(("loss", "lr", "tokens_per_s"))  # a train point: [step, *these]
        self.evals = _Columns(("val_bpb", "val_loss"))  # val_loss: what a script of your own logs (enlace.job)
        self.events: list[dict] = []  # every other record (start, summary, requeue), whole: few, and plot's markers

    def update(self, data: bytes) -> None:
        """Take the file as it is now: only its new whole lines are parsed, unless it no longer begins
        with what was parsed before (then all of it). A last line without its newline waits (it is being
        written)."""
        view = memoryview(data)
        h = hashlib.sha256(view[: self.consumed])
        if len(data) < self.consumed or h.digest() != self._digest:
            self._reset()
            h = hashlib.sha256()
        end = data.rfind(b"\n") + 1
        if end > self.consumed:
            for line in bytes(view[self.consumed : end]).splitlines():
                self._take(line)
            h.update(view[self.consumed : end])
            self.consumed = end
        self._digest = h.digest()

    def _take(self, line: bytes) -> None:
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return  # a damaged line: the rest still draws
        if not isinstance(rec, dict):
            return
        kind, step = rec.get("kind"), rec.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2**63:
            return  # not a step this file's writer logs
        if kind == "train":
            self.train.append(step, rec)
        elif kind == "eval":
            self.evals.append(step, rec)
        else:
            self.events.append(rec)
            if kind == "start":
                self.train.cut_after(step)
                self.evals.cut_after(step)

    def view(self, max_points: int = MAX_POINTS) -> dict[str, Any]:
        """train: [step, loss, lr, tokens_per_s]; eval: [step, val_bpb, val_loss]; starts: the steps runs resumed
        at."""
        return {
            "train": self.train.points(max_points),
            "eval": self.evals.points(max_points),
            "starts": [e["step"] for e in self.events if e.get("kind") == "start" and e["step"]],
        }
