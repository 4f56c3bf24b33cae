"""`enlace sample` and `enlace plot`: use and look at what was trained."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from enlace.clitypes import IMAGE_SUFFIXES, LocalPath, root_option
from enlace.errors import CheckpointError, for_stream
from enlace.names import find_root
from enlace.tools.plot import metrics_option


def _run_or_dir(target: str, root: Path | None) -> Path:
    """RUN (a run name under runs/) or a path to a run or checkpoint directory."""
    path = Path(target)
    if path.is_dir():
        return path
    if "/" in target:  # a path, not a run name
        raise CheckpointError(f"{target}: no such directory — name a run (RUN), or a checkpoint or run directory")
    from enlace.server.runfiles import NoSuchRun, run_dir_of

    try:
        return run_dir_of(find_root(root) / "runs", target)  # a mistyped name: the runs there are, as logs says
    except NoSuchRun as e:
        if os.environ.get("ENLACE_ROOT"):  # on a server (remote.sh sets it): the host's runs are these
            raise
        raise NoSuchRun(
            f"{e.message} (a run trained on a host, `local` too: `enlace-remote fetch {target}` brings it here)"
        ) from None


@click.command("sample")
@click.argument("target", metavar="RUN|CHECKPOINT_DIR")
@click.option("--prompt", default=None, help="Text to continue (the output starts with it).")
@click.option(
    "--prompt-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Read the prompt from a file (bytes, as they are).",
)
@click.option(
    "--bytes",
    "n_bytes",
    type=click.IntRange(1, 1_000_000),
    default=500,
    show_default=True,
    help="How many bytes to generate.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(0, 10),
    default=0.8,
    show_default=True,
    help="0 = always the most likely byte.",
)
@click.option("--top-k", type=click.IntRange(min=1), default=None, help="Draw only from the K most likely bytes.")
@click.option(
    "--seed", type=click.IntRange(0, 2**63 - 1), default=1337, show_default=True, help="Same seed, same text."
)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@root_option
@click.option("--json", "as_json", is_flag=True, help="Print the text and its figures as JSON.")
def sample_cmd(
    target: str,
    prompt: str | None,
    prompt_file: Path | None,
    n_bytes: int,
    temperature: float,
    top_k: int | None,
    seed: int,
    device: str,
    root: Path | None,
    as_json: bool,
) -> None:
    """Generate text from RUN's newest complete checkpoint (or a checkpoint dir, e.g. a fetched one).

    The checkpoint is verified against its MANIFEST and loaded with weights_only. Invalid UTF-8 (a byte
    model can stop mid-character) is shown as U+FFFD. Reports bytes/s on stderr."""
    from enlace.tools.sample import sample

    if prompt is not None and prompt_file is not None:
        raise click.UsageError("give --prompt or --prompt-file, not both")
    text = prompt_file.read_bytes() if prompt_file else (prompt or "").encode()
    rep = sample(_run_or_dir(target, root), text, n_bytes, temperature, top_k, seed, device)
    if as_json:
        click.echo(json.dumps(rep))
        return
    sys.stdout.write(for_stream(rep["text"], sys.stdout) + "\n")
    click.echo(
        f"[{rep['bytes']} bytes at {rep['bytes_per_s']} bytes/s on {rep['device']}, step {rep['step']}, seed {seed}]",
        err=True,
    )


@click.command("plot")
@click.argument("runs", nargs=-1, required=True, metavar="RUN...")
@click.option(
    "--out",
    type=LocalPath(dir_okay=False, suffixes=IMAGE_SUFFIXES),
    default=None,
    help="PNG to write (default: runs/RUN/curves.png, or runs/RUN1+RUN2.png for several).",
)
@metrics_option
@root_option
@click.option("--json", "as_json", is_flag=True, help="Print what was drawn as JSON.")
def plot_cmd(runs: tuple[str, ...], out: Path | None, metrics: list[str], root: Path | None, as_json: bool) -> None:
    """Draw RUN's training loss (raw and smoothed), val bpb, learning rate and tokens/s against step as a
    PNG; resumes (a Slurm requeue's among them) and stops are marked; several runs are overlaid. Prints
    the PNG's path."""
    from enlace.tools.plot import plot

    dirs = [_run_or_dir(r, root) for r in runs]
    if out is None:
        name = "curves.png" if len(dirs) == 1 else "+".join(d.name for d in dirs) + ".png"
        out = dirs[0] / name if len(dirs) == 1 else dirs[0].parent / name
    drawn = plot(dirs, out, metrics)
    click.echo(json.dumps(drawn) if as_json else str(out))


@click.command("generate")
@click.argument("teacher", metavar="RUN|CHECKPOINT_DIR")
@click.option("--bytes", "n_bytes", type=click.IntRange(1024, 10**10), required=True, help="How many bytes in all.")
@click.option("--out", type=LocalPath(), required=True, help="Shard directory to create (must not exist).")
@click.option("--temperature", type=click.FloatRange(0, 10), default=1.0, show_default=True)
@click.option(
    "--seed", type=click.IntRange(0, 2**63 - 1), default=1337, show_default=True, help="Same seed, same bytes."
)
@click.option(
    "--streams",
    type=click.IntRange(1, 4096),
    default=64,
    show_default=True,
    help="Texts drawn side by side (one batch); each is --bytes / --streams long.",
)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@root_option
@click.option("--json", "as_json", is_flag=True, help="The summary as one JSON document (the driver's).")
def generate_cmd(
    teacher: str,
    n_bytes: int,
    out: Path,
    temperature: float,
    seed: int,
    streams: int,
    device: str,
    root: Path | None,
    as_json: bool,
) -> None:
    """Write TEACHER's own text as token shards (`kind: shards`, shard_dir: OUT): sequence-level
    distillation data. The checkpoint is verified and loaded weights_only; progress (bytes, rate, ETA) on
    stderr; the text is written to OUT.partial/ as it is drawn, so a stopped generate run again with the
    same arguments continues where it was; OUT appears only once complete."""
    from enlace.tools.generate import generate_shards
    from enlace.train.engine import pick_device
    from enlace.train.trained import find_checkpoint

    dev = pick_device(device)
    ckpt = find_checkpoint(_run_or_dir(teacher, root))
    say = lambda line: click.echo(line, err=True)
    meta = generate_shards(ckpt, out, n_bytes, streams, temperature, seed, dev, say)
    summary = (
        f"{out}: {len(meta['train'])} train + {len(meta['val'])} val shards, {meta['tokens']['train']} + "
        f"{meta['tokens']['val']} tokens from {teacher}"
    )
    click.echo(json.dumps({"ok": True, "out": str(out), "summary": summary, **meta}) if as_json else summary)


@click.command("export")
@click.argument("target", metavar="RUN|CHECKPOINT_DIR")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["hf", "safetensors"]),
    default="hf",
    show_default=True,
    help="hf: a directory transformers loads as GPT-2 (config, weights, byte tokenizer, model card); "
    "safetensors: the model's own tensors and a JSON of its config.",
)
@click.option("--out", type=LocalPath(), default=None, help="Directory to create (must not exist).")
@click.option(
    "--in-run",
    is_flag=True,
    help="Instead of --out: into the run's own directory, exports/FORMAT-step-N-ID (ID: the start of the "
    "checkpoint's MANIFEST sha256; what `enlace-remote export` fetches home; gc never removes a run directory). "
    "An export of the same checkpoint already there is kept.",
)
@click.option("--json", "as_json", is_flag=True, help="The export's name, files and checkpoint as JSON.")
@root_option
def export_cmd(target: str, fmt: str, out: Path | None, in_run: bool, as_json: bool, root: Path | None) -> None:
    """Export RUN's newest complete checkpoint (or CHECKPOINT_DIR), verified against its MANIFEST and loaded
    weights_only, for use outside enlace: Hugging Face transformers (`--format hf`, the default) or plain
    safetensors. OUT appears only once complete.

    \b
    enlace export smoke-cpu --out exports/smoke-cpu
    # then, with transformers: AutoModelForCausalLM.from_pretrained("exports/smoke-cpu")"""
    from enlace.manifest import export_name
    from enlace.tools.export import export
    from enlace.train.trained import find_checkpoint

    if (out is None) == (not in_run):
        raise click.UsageError("say where the export goes: --out DIR, or --in-run (the run's exports/)")
    ckpt = find_checkpoint(_run_or_dir(target, root))
    run_dir = ckpt.parent.parent
    run_json = run_dir / "run.json"
    state = json.loads(run_json.read_text()) if run_json.is_file() else {}
    if in_run:  # the checkpoint's identity too: a new line (--resume none) has a step-N of its own
        out = run_dir / "exports" / export_name(fmt, ckpt)
    if in_run and (out / "MANIFEST").is_file():  # made before from the same checkpoint: complete, kept
        files = sorted(p.name for p in out.iterdir() if p.name != "MANIFEST")
    else:
        files = export(ckpt, fmt, out, state)
    if as_json:
        click.echo(json.dumps({"ok": True, "out": str(out), "name": out.name, "files": files, "checkpoint": ckpt.name}))
    else:
        click.echo(f"{out}: {', '.join(files)} (from {run_dir.name}/{ckpt.parent.name}/{ckpt.name})")


COMMANDS = (sample_cmd, plot_cmd, generate_cmd, export_cmd)
