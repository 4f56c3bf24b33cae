"""How the two halves write amounts for people: one format each, so the log, the status table and the
preflight report agree. Standard library only (the driver imports it)."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    """12m05s, 3h07m; "-" for unknown. One format for the log's ETA and the driver's status table."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def hours(seconds: float) -> str:
    """2h 05m for a projected run's length (and its seconds below 10 minutes): preflight's report."""
    minutes = round(seconds / 60)
    text = f"{minutes // 60}h {minutes % 60:02d}m"
    return f"{text} ({seconds:.0f} s)" if seconds < 600 else text
