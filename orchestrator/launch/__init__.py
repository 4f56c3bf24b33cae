"""Launch as an ordered pipeline of stages (pipeline.py) over a backend: ship (ship.py: sync, data push,
verify), preflight, decide, start, wait, follow (stages.py), on a plain SSH host or a Slurm one
(slurm.py); which run a verb means without RUN (choose.py). May import: ssh, hosts, transfer, view."""
