"""Distillation on the smoke corpus: does the teacher help, and what does its forward cost?

    teacher  = smoke-cpu, trained here as shipped (500 steps)
    student  = distill-cpu (two of smoke-cpu's three layers), its own 250 steps, with and without the
               teacher (alpha 0.5, T 2) — same seed, same data, same schedule

Prints both students' final val bpb and the difference, and the distilled student's median step
time over the plain student's (the teacher's forward, as a ratio). Run: .venv/bin/python bench/distill.py
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from enlace.config.schema import load_config  # noqa: E402
from enlace.train.loop import train  # noqa: E402


def run(name: str, overrides: list[str], runs_root: Path, root: Path) -> dict:
    cfg = load_config(name, overrides, root=root)
    cfg.runs_root = runs_root
    with contextlib.redirect_stdout(io.StringIO()):
        summary = train(cfg, resume="none")
    evals = [line for line in (runs_root / cfg.run_name / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
    return {"val_bpb": json.loads(evals[-1])["val_bpb"], "median_step_s": summary["median_step_s"]}


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="enlace-bench-distill-") as tmp:
        root = Path(tmp) / "proj"
        (root / "runs").mkdir(parents=True)
        (root / "configs").symlink_to(REPO / "configs")
        teacher = run("smoke-cpu", [], root / "runs", root)
        print(f"teacher smoke-cpu: val bpb {teacher['val_bpb']:.4f}", flush=True)
        plain = run("distill-cpu", ["distill.teacher=", "run_name=student-plain"], root / "runs", root)
        distilled = run("distill-cpu", ["run_name=student-distilled"], root / "runs", root)
    print(f"student without teacher: val bpb {plain['val_bpb']:.4f}")
    print(
        f"student with teacher:    val bpb {distilled['val_bpb']:.4f}  (difference {distilled['val_bpb'] - plain['val_bpb']:+.4f})"
    )
    print(
        f"step time with / without the teacher's forward: {distilled['median_step_s'] / plain['median_step_s']:.2f}x "
        f"({distilled['median_step_s'] * 1000:.0f} vs {plain['median_step_s'] * 1000:.0f} ms)"
    )


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()  # (--help ran the whole benchmark: minutes of training)
