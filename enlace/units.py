"""How the two halves write amounts for people: one format each, so the log, the status table and the
preflight report agree. Standard library only (the driver imports it)."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    """12m05s, 3h07m; "-" for unknown. One format for the log's ETA, the driver's status table and preflight's
    projected run length."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )


DETAIL_WIDTH = 100  # a table's detail line (a run's error, a skipped checkpoint) is cut here


def one_line(text: str, width: int | None, more: str = "") -> str:
    """`text` (an error, a traceback's end) as one line for a table's detail row: its whitespace runs made one
    space, cut at `width` characters with `more` (where to read the rest) after the cut; None: never cut."""
    text = " ".join(text.split())
    return text if width is None or len(text) <= width else text[: width - 1] + f"…{more}"
