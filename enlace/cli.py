"""`enlace` — the trainer's command line (runs on the GPU server; also locally).

Thin click commands over the operations in train.py, preflight.py, verify_resume.py and data/.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from enlace import contract
from enlace.clitypes import LocalPath, fresh_option, parse_size, resume_option, root_option, set_option
from enlace.server import cli as cli_server
from enlace.server import filescli as cli_files
from enlace.slurm import cli as cli_slurm
from enlace.tools import cli as cli_tools


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}, epilog=contract.help_text()
)
@click.version_option(package_name="enlace")
@click.option(
    "--exit-with-client",
    is_flag=True,
    hidden=True,
    help="Driver use: end this command and all it started when stdin closes (the client is gone).",
)
def main(exit_with_client: bool) -> None:
    """Train small byte-level language models, resumably and (optionally) bit-exactly.

    \b
    Configs:  configs/runs/RUN.yaml names a data file (configs/data/) and a profile
              (configs/profiles/); precedence: --set > run > profile > data > defaults.
    Outputs:  runs/RUN_NAME/{config.yaml,run.json,train.log,metrics.jsonl,checkpoints/}

    \b
    Start here:
      enlace check-config smoke-cpu     # the resolved config, or what is wrong
      enlace preflight smoke-cpu        # does it fit, how long will it take
      enlace train smoke-cpu            # train (resumes from the latest checkpoint)
    """
    ctx = click.get_current_context()
    ctx.obj = {"when_client_gone": []}  # a command's clean-up before that (e.g. scancel its srun job)
    if exit_with_client:
        _exit_when_stdin_closes(ctx.obj["when_client_gone"])


def _exit_when_stdin_closes(hooks: list) -> None:
    """The driver keeps our stdin open while it lives; EOF means it died (or was killed): run `hooks`, then
    end this process group, so no preflight (or its --max-batch probes) goes on competing with the next
    one for the GPU."""
    import signal
    import threading

    def watch() -> None:
        while os.read(0, 1 << 12):
            pass
        for hook in hooks:
            hook()
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="exit-with-client").start()


@main.command("check-config")
@click.argument("run")
@set_option
@root_option
@click.option("--json", "as_json", is_flag=True, help="Print the resolved config (or the error) as JSON.")
@click.option("--command-spec", default=None, metavar="JSON", help="Check a command given on launch's command line.")
@click.option(
    "--resume-at",
    default=None,
    metavar="PATH",
    help="Also check that this checkpoint (as --resume takes it) is complete.",
)
@fresh_option
def check_config(
    run: str,
    overrides: tuple[str, ...],
    root: Path | None,
    as_json: bool,
    command_spec: str | None,
    resume_at: str | None,
    fresh: bool,
) -> None:
    """Resolve RUN's config and print it, or say exactly what is wrong (exit 2); with --json the error document
    says whether it is the config itself or what this machine lacks (`machine`: the teacher, a GPU's bf16).

    RUN is a file stem in configs/runs/ (e.g. smoke-cpu) or a path to a run YAML file. The data files are not
    read here: `enlace-remote verify RUN` checks them on the server, `enlace-remote preflight RUN` reads them."""
    from enlace.config.machine import check_environment
    from enlace.config.recorded import load_run_config, resume_problem
    from enlace.errors import ConfigError
    from enlace.train.checkpoint import resume_problem_at

    def refuse(e: ConfigError, machine: bool) -> None:
        if not as_json:
            raise e
        doc = contract.error_doc(e.message, e.exit_code, e.kind, file=e.source, key=e.key, machine=machine)
        click.echo(json.dumps(doc))
        sys.exit(e.exit_code)

    from enlace.config import command

    try:
        # a run of your own command: `command:` in the run file, or launch's `-- ARGV` (None: enlace's trainer)
        own = command.from_spec(command_spec, run) if command_spec else command.load(run, root, overrides)
        if own is not None:  # its run file and scripts (verify checks they arrived); no trainer config
            return click.echo(json.dumps(command.check_answer(own, run, root) if as_json else own.to_doc(), indent=1))
        cfg = load_run_config(run, overrides, root, fresh=fresh)
    except ConfigError as e:  # the config itself is wrong
        refuse(e, machine=False)
    try:
        check_environment(cfg)
    except ConfigError as e:  # right, but this machine lacks what it needs (the teacher, a GPU): `machine`
        refuse(e, machine=True)
    for warning in cfg.warnings:
        click.echo(f"warning: {warning}", err=True)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": True,
                    "run_name": cfg.run_name,
                    "files": cfg.files,
                    "warnings": cfg.warnings,
                    "fingerprint": cfg.fingerprint(),
                    "resume_problem": resume_problem(cfg, overrides),
                    "resume_at_problem": resume_at is not None
                    and resume_problem_at(cfg.run_dir / "checkpoints", resume_at),
                    "config": cfg.to_dict(),
                },
                indent=1,
            )
        )
    else:
        import yaml

        click.echo(f"# {cfg.files['run']} (profile {cfg.files['profile']}, data {cfg.files['data']})")
        click.echo(yaml.safe_dump(cfg.to_dict(), sort_keys=False), nl=False)


@main.command()
@click.argument("run")
@set_option
@root_option
@resume_option
@click.option(
    "--until",
    type=click.IntRange(min=1),
    default=None,
    metavar="STEP",
    help="Train up to STEP, checkpoint and stop (status 'stopped'); the LR schedule still spans "
    "training.max_steps, so --until 10 then --until 20 equals one --until 20.",
)
@click.option(
    "--runs-dir",
    type=LocalPath(file_okay=False),
    default=None,
    help="Put the run directory under this dir instead of <root>/runs.",
)
@click.option(
    "--allow-data-change",
    is_flag=True,
    help="Resume even though the data differs (by content) from the checkpoint's: not exact.",
)
@click.option(
    "--allow-teacher-change",
    is_flag=True,
    help="Distillation: resume even though the teacher checkpoint differs from the one it started with.",
)
def train(
    run: str,
    overrides: tuple[str, ...],
    root: Path | None,
    resume: str,
    until: int | None,
    runs_dir: Path | None,
    allow_data_change: bool,
    allow_teacher_change: bool,
) -> None:
    """Train RUN; resume from its latest complete checkpoint if there is one.

    SIGTERM or Ctrl-C finishes the current step, saves a checkpoint and exits 0 (a second Ctrl-C exits
    at once, the last complete checkpoint intact; a repeated SIGTERM is the same request).
    RUN is a file stem in configs/runs/ or a path."""
    from enlace.config.machine import check_environment
    from enlace.config.recorded import load_run_config
    from enlace.train.loop import train as run_training

    cfg = load_run_config(run, overrides, root, runs_dir, fresh=resume == "none")
    check_environment(cfg)
    allow = frozenset(name for name, ok in (("data", allow_data_change), ("teacher", allow_teacher_change)) if ok)
    run_training(cfg, resume=resume, until=until, allow=allow)


@main.command()
@click.argument("data")
@click.option("--out", required=True, type=LocalPath(), help="Directory to create (must not exist).")
@click.option("--dtype", type=click.Choice(["uint8", "uint16"]), default="uint8", show_default=True)
@click.option(
    "--shard-tokens", type=click.IntRange(min=1024), default=1 << 24, show_default=True, help="Tokens per shard file."
)
@click.option(
    "--val-fraction",
    type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
    default=None,
    help="Fraction held out for validation (default: the data config's val_fraction).",
)
@root_option
def prepare(data: str, out: Path, dtype: str, shard_tokens: int, val_fraction: float | None, root: Path | None) -> None:
    """Write the byte corpus of data config DATA (configs/data/DATA.yaml) as token shards in OUT.

    Use the shards with a data config of `kind: shards` and `shard_dir: OUT`. OUT appears only
    once complete."""
    from enlace.config.schema import load_data_config
    from enlace.data.paths import resolve_paths
    from enlace.data.shards import prepare_shards
    from enlace.names import find_root

    root = find_root(root)
    data_cfg = load_data_config(data, root)
    if data_cfg.kind != "bytes":
        raise click.UsageError(f"DATA {data!r} is kind {data_cfg.kind}; prepare reads a kind: bytes config")
    files = resolve_paths(data_cfg.paths, root)
    frac = val_fraction if val_fraction is not None else data_cfg.val_fraction
    meta = prepare_shards(
        files,
        out,
        shard_tokens,
        dtype,
        frac,
        progress=lambda name, n: click.echo(f"  wrote {name} ({n} tokens)", err=True),
    )
    click.echo(
        f"{out}: {len(meta['train'])} train + {len(meta['val'])} val shards, "
        f"{meta['tokens']['train']} + {meta['tokens']['val']} tokens ({dtype}) from {len(files)} files"
    )


@main.command("verify-resume")
@click.argument("run")
@click.option(
    "--steps",
    type=click.IntRange(min=2),
    default=20,
    show_default=True,
    help="N: compare N straight steps with N/2 + resume in a new process + N/2.",
)
@set_option
@root_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--keep", is_flag=True, help="Keep the temporary run dirs even when identical.")
def verify_resume_cmd(
    run: str, steps: int, overrides: tuple[str, ...], root: Path | None, as_json: bool, keep: bool
) -> None:
    """Prove that resuming RUN reproduces the uninterrupted run, bit for bit.

    Trains N steps straight, and separately N/2 steps + checkpoint + a fresh process resuming to N
    (in a temporary runs dir); compares every parameter, optimizer tensor and scaler value by bytes
    and the logged losses after N/2. Exit 0 only when identical. Use a deterministic config
    (e.g. smoke-cpu-deterministic): without it, kernels may legitimately differ run to run."""
    from enlace.config.machine import check_environment
    from enlace.config.schema import load_config
    from enlace.preflight.verify_resume import verify_resume

    cfg = load_config(run, overrides, root)
    check_environment(cfg)
    if not cfg.runtime.deterministic and not as_json:
        click.echo(f"note: {cfg.run_name} is not deterministic; a difference may be kernel noise", err=True)
    report = verify_resume(cfg, run, list(overrides), steps, keep)
    if as_json:
        click.echo(json.dumps(report, indent=1))
    elif report["ok"]:
        click.echo(
            f"identical: {report['tensors']} tensors, {report['losses_compared']} logged losses after step "
            f"{report['resumed_at']} ({steps} steps straight vs {report['resumed_at']} + resume + "
            f"{steps - report['resumed_at']})"
        )
    else:
        diff = report["first_difference"]
        what = (
            f"first differing tensor: {diff['name']} (max abs diff {diff['max_abs_diff']})"
            if diff
            else "tensors identical"
        )
        click.echo(
            f"DIFFERENT: {what}; logged losses identical: {report['losses_identical']}; "
            f"runs kept in {report['work_dir']}"
        )
    sys.exit(0 if report["ok"] else 1)


@main.command("preflight")
@click.argument("run")
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Measured optimizer steps (after 3 warm-up steps).",
)
@set_option
@root_option
@resume_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (also written to preflight.json).")
@click.option(
    "--memory-limit",
    default=None,
    metavar="SIZE",
    callback=lambda ctx, param, value: parse_size(value),  # refused naming the option (it said only the value)
    help="Treat a peak above SIZE (e.g. 2GiB) as out of memory. On CPU this is how a batch that "
    "does not fit is found; default: the machine's memory.",
)
@click.option(
    "--max-batch",
    is_flag=True,
    help="Also find the largest batch_size that fits (doubling, then aimed probes; exact below 64, within 3-6 % above).",
)
@click.option(
    "--budget-s",
    type=click.FloatRange(min=10),
    default=300.0,
    show_default=True,
    help="Preflight's own time: when its steps run (or project) past it, the verdict is too_slow (exit 10).",
)
def preflight_cmd(
    run: str,
    steps: int,
    overrides: tuple[str, ...],
    root: Path | None,
    resume: str,
    as_json: bool,
    memory_limit: int | None,
    max_batch: bool,
    budget_s: float,
) -> None:
    """Answer in a minute: does RUN's batch fit, how long will it take, does fp16 hold?

    Builds the model, optimizer and scaler exactly as `train` does and runs them on synthetic bytes
    of the configured shape (no corpus needed): 3 warm-up steps, --steps measured steps, one eval
    pass and one checkpoint save. Verdict: ok / tight (exit 0), oom (exit 5), unstable (exit 6), too_slow
    (exit 10: its steps ran or projected past --budget-s; the report says what the run would take).
    The run's time is projected from where `train --resume` would start. Writes runs/RUN_NAME/preflight.json."""
    from enlace.config.machine import check_environment
    from enlace.config.recorded import load_run_config
    from enlace.preflight.maxbatch import find_max_batch, start_probe_server
    from enlace.preflight.measure import preflight
    from enlace.preflight.report import format_report
    from enlace.train.rundir import atomic_write

    limit = memory_limit
    cfg = load_run_config(run, overrides, root, fresh=resume == "none")
    check_environment(cfg)
    quiet = os.environ.get("RANK", "0") != "0"
    say = (lambda msg: None) if quiet else (lambda msg: click.echo(f"  {msg}", err=True))
    if max_batch:
        start_probe_server(cfg)
    say(f"preflight {cfg.run_name}: building the model as train does, synthetic batches")
    report = preflight(cfg, steps, limit, say, budget_s=budget_s, resume=resume)
    if max_batch and report["verdict"] != "too_slow":
        report["max_batch"] = find_max_batch(cfg, run, list(overrides), limit, report, say)
        if report["verdict"] == "oom" and report["max_batch"]["batch_size"]:
            report["suggestion"] += f"; the largest that fits is {report['max_batch']['batch_size']}"
    if quiet:  # under torchrun rank 0 reports; a rank that failed alone says why and ends the job (torchrun)
        if report["verdict"] not in ("ok", "tight"):
            click.echo(f"rank {os.environ['RANK']}: {report['verdict']}: {report.get('suggestion', '')}", err=True)
        sys.exit(contract.VERDICT.get(report["verdict"], contract.OK))
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(cfg.run_dir / "preflight.json", json.dumps(report, indent=1) + "\n")
    click.echo(json.dumps(report, indent=1) if as_json else format_report(report))
    sys.exit(contract.VERDICT.get(report["verdict"], contract.OK))


# The driver's server verbs, the Slurm verbs and the tools live in their own modules (which import
# nothing from here): `enlace.cli:main` holds every verb however it is reached.
for module in (cli_server, cli_files, cli_slurm, cli_tools):
    for command in module.COMMANDS:
        main.add_command(command)
