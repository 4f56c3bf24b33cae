"""enlace — the trainer half: typed configs, data streams, model, training loop, checkpoints."""

__version__ = "0.1.0"
