"""enlace-remote's run commands: preflight, launch, status, stop, logs, fetch."""

from __future__ import annotations
