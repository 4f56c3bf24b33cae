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


def loss_figure(value: float | None, places: int = 4) -> str:
    """A loss as a table shows it: `places` decimals where they keep its digits, else scientific notation (a
    val loss of 3e-11 read 0.0000, tied with others in a ranked table; a diverged one 26 digits); "-" for none."""
    if value is None:
        return "-"
    tiny = value != 0 and abs(value) < 10 ** -(places - 2)  # below 0.01 four decimals keep two digits or fewer
    return f"{value:.{places - 1}e}" if tiny or abs(value) >= 1e6 else f"{value:.{places}f}"


DETAIL_WIDTH = 100  # a table's detail line (a run's error, a skipped checkpoint) is cut here


def one_line(text: str, width: int | None, more: str = "") -> str:
    """`text` (an error, a traceback's end) as one line for a table's detail row: its whitespace runs made one
    space, cut at `width` characters with `more` (where to read the rest) after the cut; None: never cut."""
    text = " ".join(text.split())
    if width is None or len(text) <= width:
        return text
    cut = text.rfind(" ", 0, width - 1)  # between words: "at step 1…" read as a step the run never had (10)
    return text[: cut if cut > width // 2 else width - 1] + f"…{more}"
