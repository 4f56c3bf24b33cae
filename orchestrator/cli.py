"""enlace-remote: placeholder until the orchestrator lands."""

import sys


def main() -> None:
    print("enlace-remote: not yet implemented", file=sys.stderr)
    sys.exit(2)
