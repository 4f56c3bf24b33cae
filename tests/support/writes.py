"""How large files reach the disk: the size of each write() to a regular file, recorded by a monkeypatched
os.write (what the tests of writing in pieces read)."""

from __future__ import annotations

import os
import stat


def file_write_sizes(monkeypatch) -> list[int]:
    """From now until `monkeypatch.undo()`: the list each os.write to a regular file appends its size to."""
    real_write, sizes = os.write, []

    def write(fd, data):
        if stat.S_ISREG(os.fstat(fd).st_mode):
            sizes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    return sizes
