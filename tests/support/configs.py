"""The tiny corpus and the run configs the tests train: small enough that a step takes milliseconds."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import yaml

# A model small enough that a step takes milliseconds on 2 cores.
TINY = {
    "model": {"seq_len": 32, "n_layer": 2, "n_head": 2, "d_model": 32, "dropout": 0.1},
    "optim": {"learning_rate": 3e-3, "min_lr": 3e-4, "warmup_steps": 2},
    "training": {"batch_size": 4, "max_steps": 20, "log_every": 1, "eval_every": 5, "eval_batches": 2},
    "checkpoint": {"every": 5, "keep": 2},
}

DETERMINISTIC = {"runtime": {"deterministic": True}}  # the tests that compare bytes start from this


def write_tiny_corpus(corpus: Path) -> None:
    """data/tiny: the stdlib's json package sources as text files (a few hundred KB of real text)."""
    corpus.mkdir(parents=True, exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for i, src in enumerate(sorted((stdlib / "json").glob("*.py"))):
        (corpus / f"{i:02d}-{src.stem}.txt").write_bytes(src.read_bytes())
    (corpus / "zz-json-doc.txt").write_text(json.__doc__ or "")


def write_run(root: Path, name: str, base: dict | None = None, **sections) -> Path:
    """configs/runs/<name>.yaml from TINY (or `base`), with sections merged over it."""
    doc: dict = {"data": "tiny", "profile": "cpu"}
    for key, value in (base if base is not None else TINY).items():
        doc[key] = dict(value) if isinstance(value, dict) else value
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key].update(value)
        else:
            doc[key] = value
    path = root / "configs" / "runs" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
