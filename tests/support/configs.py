"""The tiny corpus and the run configs the tests train: small enough that a step takes milliseconds."""

from __future__ import annotations

import json
import sysconfig
import textwrap
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


# A script of the user's own (enlace.job, no torch): its values from --lr and SEED, a val loss made of them
# (|lr - 0.01| + SEED/100), an output file; with --hold=1 it runs until stopped.
TOY_SCRIPT = textwrap.dedent(
    """\
    import argparse, os, time
    from enlace import job
    p = argparse.ArgumentParser(); p.add_argument("--lr", type=float, default=0.1); p.add_argument("--hold", type=int)
    a = p.parse_args()
    seed = int(os.environ["SEED"])
    print(f"lr={a.lr} seed={seed}", flush=True)
    job.log(1, loss=1.0)
    while a.hold and not job.stop_requested():
        time.sleep(0.05)
    val = round(abs(a.lr - 0.01) + seed / 100, 6)
    job.log(1, kind="eval", val_loss=val)
    (job.run_dir() / "out").mkdir(exist_ok=True)
    (job.run_dir() / "out" / "val.txt").write_text(f"{val}\\n")
    """
)


def write_toy(repo: Path, seed: str = "0", device: str = "cpu") -> None:
    """scripts/toy.py and its run file configs/runs/toy.yaml (outputs: out/*; `device`: what it queues for),
    committed."""
    from .repocopy import commit_all

    (repo / "scripts" / "toy.py").write_text(TOY_SCRIPT)
    run = {"command": ["python", "scripts/toy.py"], "outputs": ["out/*"], "env": {"SEED": seed}, "device": device}
    (repo / "configs" / "runs" / "toy.yaml").write_text(json.dumps(run) + "\n")
    commit_all(repo, "a script of our own")
