"""Before a run: how fast, how much memory, does fp16 diverge (measure.py), the largest batch that fits
(maxbatch.py), the report table (report.py, light: the driver prints it), and the exact-resume proof
(verify_resume.py). May import: config, data, train, manifest, sysinfo, errors."""
