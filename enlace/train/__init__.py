"""The trainer: the model and its optimizer, one training step and its state (engine.py), the loop read
top to bottom (loop.py, begin.py, saving.py), complete-only checkpoints, determinism, torch.distributed,
distillation, the run directory's writes and the optional metric sinks. May import: config, data, the run
state (enlace/state/: run.json, heartbeats), manifest, hashing, units, the contract, errors, sysinfo; never
the server's verbs nor the driver."""
