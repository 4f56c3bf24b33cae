"""`python -m enlace` and the `enlace` console script."""

import json
import sys

import click

from enlace import contract
from enlace.cli import main
from enlace.errors import path_given


def run() -> None:
    """User errors print one line (no traceback) and exit with their code; with --json the same error is
    also the one JSON document on stdout, so the driver never has to parse stderr."""
    try:
        result = main(standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except SystemExit as e:
        code = e.code
    except (click.ClickException, OSError) as caught:  # an OSError: only where it is about a path given here
        e = path_given(caught, sys.argv[1:]) if isinstance(caught, OSError) else caught
        if e is None:
            raise
        if "--json" in sys.argv[1:]:
            doc = contract.error_doc(e.format_message(), e.exit_code, getattr(e, "kind", None))
            print(json.dumps(doc), flush=True)
        e.show()
        code = e.exit_code
    except click.Abort:
        click.echo("Aborted.", err=True)
        code = 130
    contract.leave(code)


if __name__ == "__main__":
    run()
