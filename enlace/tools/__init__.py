"""What is done with a trained model: sampling, the curves (plot.py: matplotlib, no torch), a teacher's
text as shards (generate.py), export to transformers or safetensors, and their verbs (cli.py). May import:
config, data, train, manifest, names, clitypes, errors."""
