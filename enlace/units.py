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
