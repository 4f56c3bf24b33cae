"""The `enlace-remote` verbs, thin click commands over the packages beside this one: run.py (launch,
preflight, status, stop, logs, fetch, ...), tools.py (sample, plot, gc, shell, generate, export, board),
data.py (data push, data ls), and what they share (common.py: the Remote, shared options). May import:
every driver package; those imports sit inside the commands (each verb loads only what it uses, so the
driver starts fast)."""
