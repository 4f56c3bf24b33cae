"""Shared fixtures: a throwaway project root with the shipped configs and a tiny corpus."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

# A model small enough that a step takes milliseconds on 2 cores.
TINY = {
    "model": {"seq_len": 32, "n_layer": 2, "n_head": 2, "d_model": 32, "dropout": 0.1},
    "optim": {"learning_rate": 3e-3, "min_lr": 3e-4, "warmup_steps": 2},
    "training": {"batch_size": 4, "max_steps": 20, "log_every": 1, "eval_every": 5, "eval_batches": 2},
    "checkpoint": {"every": 5, "keep": 2},
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project root: the repo's configs/ plus data/tiny/*.txt (a few hundred KB of real text)."""
    root = tmp_path / "proj"
    shutil.copytree(REPO / "configs", root / "configs")
    corpus = root / "data" / "tiny"
    corpus.mkdir(parents=True)
    import json
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for i, src in enumerate(sorted((stdlib / "json").glob("*.py"))):
        (corpus / f"{i:02d}-{src.stem}.txt").write_bytes(src.read_bytes())
    (corpus / "zz-json-doc.txt").write_text(json.__doc__ or "")
    (root / "configs" / "data" / "tiny.yaml").write_text("kind: bytes\npaths: ['data/tiny/*.txt']\nval_fraction: 0.1\n")
    return root


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
