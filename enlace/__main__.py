"""`python -m enlace` and the `enlace` console script."""

import errno
import json
import sys

import click

from enlace import contract
from enlace.cli import main
from enlace.errors import BadOut

# what a path that cannot be made or written says (--out /proc/x, --runs-dir on a read-only disk): its owner's fix
PATH_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.EEXIST}


def _said(e: OSError) -> BadOut:
    if e.filename is None or e.errno not in PATH_ERRNOS:
        raise e
    return BadOut(f"{e.filename}: {e.strerror} — name a path this machine lets you create and write")


def run() -> None:
    """User errors print one line (no traceback) and exit with their code; with --json the same error is
    also the one JSON document on stdout, so the driver never has to parse stderr."""
    try:
        result = main(standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except SystemExit as e:
        code = e.code
    except (click.ClickException, OSError) as e:
        e = _said(e) if isinstance(e, OSError) else e
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
