"""`python -m enlace` and the `enlace` console script."""

from enlace import cli_server  # noqa: F401  (registers the driver's server-side verbs)
from enlace.cli import main


def run() -> None:
    main()


if __name__ == "__main__":
    run()
