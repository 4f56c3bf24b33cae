"""A run's state, on the server: run.json (its one writer, runs.py: status, liveness, compare-and-set) and
the heartbeats (heartbeat.py) that tell silence from slow work. Written by the trainer and the supervisor,
read by every server verb. May import: the contract, errors, manifest, the Slurm settings; stdlib and psutil
(never torch, never the server's verbs, never the trainer)."""
