"""`enlace plot`: a run's curves as one PNG (matplotlib, Agg: no display needed).

Panels: training loss (raw and an EMA), val bpb at each eval (a script's val loss, where it logs no val
bpb), learning rate, tokens/s — all against
step; a panel no run logged anything for is left out, said on stderr. Where the run started again (a resume, also after a Slurm requeue) or stopped, a dotted vertical
line marks the step. Several runs are overlaid in one colour each, with a legend. The title names the run(s),
commit and parameter count. The data: metrics.jsonl (one record per logged step, eval, start and
end) and run.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from enlace.contract import ACTIVE
from enlace.errors import EnlaceError
from enlace.tools.curves import Curves

PANELS = {  # metric → (record kind, field, y label)
    "loss": ("train", "loss", "train loss (nats/byte)"),
    "val_bpb": ("eval", "val_bpb", "val bits/byte"),
    "val_loss": ("eval", "val_loss", "val loss"),  # a script of your own logs it (enlace.job)
    "lr": ("train", "lr", "learning rate"),
    "tokens_per_s": ("train", "tokens_per_s", "tokens/s"),
}
DEFAULT_METRICS = "loss,val_bpb,lr,tokens_per_s"  # val_bpb draws a script's val loss where no run has val bpb
EMA = 0.6  # per logged point, debiased (as TensorBoard's smoothing): follows a short run without lagging


def metrics_option(fn):
    """--metrics, the same on `enlace plot` and `enlace-remote plot`: the panels, checked (one line names a
    wrong one and the choices)."""
    import click

    def check(ctx, param, text: str) -> list[str]:
        chosen = [m.strip() for m in text.split(",") if m.strip()]
        bad = [m for m in chosen if m not in PANELS]
        if bad or not chosen:
            raise click.BadParameter(f"{', '.join(bad) or 'none'}: choose from {', '.join(PANELS)}")
        return chosen

    return click.option(
        "--metrics",
        default=DEFAULT_METRICS,
        show_default=True,
        callback=check,
        help=f"Comma-separated panels, from: {', '.join(PANELS)}.",
    )(fn)


def read_run(run_dir: Path) -> dict[str, Any]:
    """Series and markers of one run directory (local: plot draws here, never on the server)."""
    path = run_dir / "metrics.jsonl"
    try:  # run.json as fetched (plot reads files; run state itself is enlace/state/runs.py's, on the server)
        state = json.loads((run_dir / "run.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        state = {}
    if not path.is_file():
        status, phase = state.get("status"), state.get("phase")
        said = f"{status} ({phase})" if phase else status
        if status in ACTIVE:
            why = f"its run.json says {said}: no step logged yet"
        else:
            why = f"its run.json says {said}, and it logged no step" if status else "no step logged yet"
        raise EnlaceError(f"{run_dir}: no metrics.jsonl — {why}")
    curves = Curves()  # the run as it stands: what a start trained again is drawn once, as the board draws it
    curves.update(path.read_bytes())  # a line cut by a crash is skipped: the rest still plots
    kinds = {"train": curves.train, "eval": curves.evals}
    series = {m: kinds[kind].pairs(field) for m, (kind, field, _) in PANELS.items()}
    starts = [r for r in curves.events if r.get("kind") == "start"]
    markers = [(r["step"], "resume" if r.get("resumed_from") else "start") for r in starts if r["step"] > 0]
    markers += [
        (r["step"], r["status"]) for r in curves.events if r.get("kind") == "summary" and r.get("status") == "stopped"
    ]
    params = next((r.get("params") for r in reversed(starts) if r.get("params")), None)
    at: dict[int, str] = {}  # one label per step, in the order it happened: "stopped, resume" (they overlapped)
    for step, what in sorted(markers, key=lambda m: (m[0], m[1] != "stopped")):
        at[step] = f"{at[step]}, {what}" if step in at else what
    return {
        "name": run_dir.name,
        "series": series,
        "markers": sorted(at.items()),
        "commit": state.get("commit"),
        "params": params,
        "status": state.get("status"),
    }


def ema(values: list[float], alpha: float = EMA) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values, start=1):
        acc = alpha * acc + (1 - alpha) * v
        out.append(acc / (1 - alpha**i))  # debiased: the first points are not pulled towards 0
    return out


def plot(run_dirs: list[Path], out: Path, metrics: list[str], title: str | None = None) -> dict[str, Any]:
    """Draw `metrics` of every run into `out` (PNG); returns what was drawn (for tests and --json). `title`: what
    the runs are together (a sweep's name); else their names, the first two and a count past three (the legend
    names each: six sweep points' names ran off both edges)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [read_run(d) for d in run_dirs]
    own = not any(r["series"]["val_bpb"] for r in runs) and any(r["series"]["val_loss"] for r in runs)
    if own:  # scripts of your own: their val loss, and a loss whose unit enlace does not know
        metrics = [("val_loss" if m == "val_bpb" else m) for m in metrics]
    # a panel no run has a point for is left out, said (a script's sweep drew empty lr and tokens/s panels)
    empty = [m for m in metrics if not any(r["series"][m] for r in runs)]
    if empty and len(empty) < len(metrics):
        metrics = [m for m in metrics if m not in empty]
        click.echo(f"left out, as no run logged them: {', '.join(PANELS[m][2] for m in empty)}", err=True)
    fig, axes = plt.subplots(len(metrics), 1, figsize=(9, 2.6 * len(metrics)), sharex=True, squeeze=False)
    drawn: dict[str, Any] = {"runs": [], "out": str(out), "metrics": metrics}
    for i, run in enumerate(runs):
        colour = f"C{i}"
        for ax, metric in zip(axes[:, 0], metrics):
            pts = run["series"][metric]
            if not pts:
                continue
            steps, values = zip(*pts)
            if metric == "loss":
                ax.plot(steps, values, color=colour, alpha=0.25, linewidth=0.8)
                ax.plot(steps, ema(list(values)), color=colour, label=run["name"])
            else:
                ax.plot(
                    steps,
                    values,
                    color=colour,
                    marker="o" if PANELS[metric][0] == "eval" else None,
                    markersize=3,
                    label=run["name"],
                )
            for step, what in run["markers"]:
                ax.axvline(step, color=colour, linestyle=":", linewidth=1)
                if metric == metrics[0]:
                    ax.annotate(
                        what,
                        (step, 1),
                        xycoords=("data", "axes fraction"),
                        fontsize=7,
                        color=colour,
                        rotation=90,
                        va="top",
                        ha="right",
                    )
        drawn["runs"].append(
            {"name": run["name"], "markers": run["markers"], "points": {m: len(run["series"][m]) for m in metrics}}
        )
    for ax, metric in zip(axes[:, 0], metrics):
        ax.set_ylabel("train loss" if own and metric == "loss" else PANELS[metric][2], fontsize=8)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("step")
    names = [r["name"] for r in runs]
    title = title or (", ".join(names) if len(names) <= 3 else f"{names[0]}, {names[1]} and {len(names) - 2} more")
    drawn["title"] = title
    first = runs[0]
    details = [
        f"commit {first['commit'][:12]}" if first.get("commit") else "",
        f"{first['params'] / 1e6:.2f}M params" if first.get("params") else "",
    ]
    fig.suptitle(f"{title} — {' · '.join(d for d in details if d)}", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return drawn
