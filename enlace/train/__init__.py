"""The trainer: the model and its optimizer, one training step and its state (engine.py), the loop read
top to bottom (loop.py), complete-only checkpoints, determinism, torch.distributed, distillation, the
run directory's writes and the optional metric sinks. May import: config, data, the server's run state
(server/runs.py), the contract, errors, sysinfo."""
