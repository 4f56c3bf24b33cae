"""The server's side of the wire: a run's state (runs.py, the only writer of run.json), its files as the
verbs read them (runfiles.py), the supervisor that heals a run (supervise.py), fetch's and data push's
serving halves (fetchserve.py, datarecv.py), cleanup of trees and venvs, and the verbs the driver calls
(cli.py). May import: the contract, errors, slurm settings; torch only in train verbs' subprocesses."""
