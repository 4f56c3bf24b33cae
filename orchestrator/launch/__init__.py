"""Launch as an ordered pipeline of stages (pipeline.py) over a backend: ship (ship.py: sync, data push,
verify), preflight, decide, start, wait, follow (stages.py), on a plain SSH host or a Slurm one
(slurm.py); which run a verb means without RUN (choose.py). May import: view, transfer, ssh, hosts, errors,
and enlace's shared modules (contract, names, hashing, yamlio, the preflight report, the Slurm settings)."""
