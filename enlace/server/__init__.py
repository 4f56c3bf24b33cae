"""The server's side of the wire: a run's lifecycle (lifecycle.py: start, wait, stop), its files as the verbs
read them (runfiles.py), the supervisor that heals a run (supervise.py), fetch's and data push's serving
halves (fetchserve.py, datarecv.py, datainuse.py), cleanup of trees and venvs, and the verbs the driver calls
(cli.py). May import: the run state (enlace/state/), config, data, manifest, hashing, the Slurm settings,
the contract, errors, names, clitypes, sysinfo; never the trainer (torch only in the verbs' subprocesses)."""
