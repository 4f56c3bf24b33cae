"""Slurm: a host's settings, the job script and sbatch/scontrol/scancel (settings.py, light: the driver
prints scripts with it), the batch step that runs a job and requeues it (job.py), and the Slurm verbs
(cli.py). May import: the contract, errors, names, clitypes, the run state (enlace/state/), server (the
supervisor, in job.py)."""
