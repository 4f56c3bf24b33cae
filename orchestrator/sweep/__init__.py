"""Sweeps as one object: a grid of --set values (grid.py), the sweep's record here in .enlace/sweeps/ (record.py),
its runs ranked in one table (table.py). Launching a sweep is orchestrator/launch/sweep.py's. May import:
errors, and enlace's contract, names and units."""
