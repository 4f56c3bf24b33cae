"""What the tests and benches share, in one place: the real sshd (sshd.py), a Slurm cluster
(slurmcluster.py), a user repo copied from this checkout (repocopy.py), the tiny corpus and run
configs (configs.py), running `enlace` and `enlace-remote` as a user would (cli.py, remote.py) and
finding or killing the processes a test started (procs.py), the sizes of the writes that reach a file
(writes.py). Tests import it as `support` (pytest's
pythonpath is tests/), benches as `tests.support`."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
