"""Run configuration: the typed schema and its layered loading (schema.py), every rule a value must pass
(rules.py) — both light enough for the driver — the --set values a run's launches recorded (recorded.py), and
what a config needs of the machine it runs on (machine.py: a GPU run's bf16, the teacher checkpoint; torch
only for a GPU run). May import: the contract, errors, names, yamlio, manifest (the teacher's checkpoint),
state (recorded.py reads run.json). pyproject's [tool.importlinter] holds it."""
