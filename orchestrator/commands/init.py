"""`enlace-remote init`: start using enlace-remote in a repository of your own (a nanoGPT fork, an HF script):
one run file, configs/runs/NAME.yaml, and nothing else in your tree (docs/own-script.md)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import click

from orchestrator.commands.common import AfterDashCommand

RUN_FILE = """\
# enlace-remote runs your own command (docs/own-script.md). `python` is the host's python (hosts.yaml python:);
# {{run_dir}} is the run's directory on the server (runs/{name}/), where outputs: and fetch look.
command: {command}
# data: ["data/**/*.bin"]          # what it reads, under data/: verify checks it, `enlace-remote data push {name}` sends it
# outputs: ["out/**/*"]             # under {{run_dir}}: what `enlace-remote fetch {name}` brings back, sha256-verified
# resume: {{args: ["--init_from=resume"], when: "{{run_dir}}/out/ckpt.pt"}}   # added on a restart once that exists
# supervise: {{restarts: 3, grace: 30}}   # restarts after a crash; a stop's SIGTERM, then SIGKILL after grace s
# device: cuda                      # what it waits for in the host's queue (cpu, cuda, auto)
# nproc: 1                          # > 1: torchrun with that many processes
# env: {{SEED: "0"}}                  # its environment; `--set env.SEED=1,2` on sweep (or launch) changes it
{name_line}# the run's name (status, logs, stop, fetch use it)
# `--set args.NAME=V` on launch or sweep appends --NAME=V to the command (docs/sweeps.md)
"""


@click.command(cls=AfterDashCommand)
@click.argument("name")
@click.option("--force", is_flag=True, help="Replace configs/runs/NAME.yaml if it exists.")
@click.pass_context
def init(ctx: click.Context, name: str, force: bool) -> None:
    """Write configs/runs/NAME.yaml for your own script, in this git repository (and nothing else): the
    command after `--` (default: python train.py), with the other keys commented out to fill in.

    \b
    enlace-remote init shakespeare -- python train.py config/train_shakespeare_char.py --out_dir={run_dir}/out
    git add configs/runs/shakespeare.yaml && git commit -m "an enlace run"
    enlace-remote --host gpu1 launch shakespeare -f"""
    from enlace.config import command
    from enlace.names import validate_run_name
    from orchestrator.errors import UsageError
    from orchestrator.launch.own import ignore_rule
    from orchestrator.transfer.gitsync import repo_root

    validate_run_name(name, "NAME")
    repo = repo_root(Path.cwd())
    argv = ctx.meta.get("after_dash") or ["python", "train.py"]
    # what launch would refuse (a single `{`) is refused now, before anything is written
    own = command.parse({"command": argv}, f"init {name} -- COMMAND", default_name=name)
    _check_scripts(repo, [s for s in own.scripts() if not (repo / s).is_file() and not any(c.isspace() for c in s)])
    path = repo / "configs" / "runs" / f"{name}.yaml"
    if path.exists() and not force:
        raise UsageError(f"{path.relative_to(repo)} exists — edit it, or pass --force to write it anew")
    command = "[" + ", ".join(_yaml_word(a) for a in argv) + "]"
    path.parent.mkdir(parents=True, exist_ok=True)
    name_line = f"# run_name: {name}".ljust(36)  # its comment in the column of the others'
    path.write_text(RUN_FILE.format(name=name, command=command, name_line=name_line))
    click.echo(f"wrote {path.relative_to(repo)}: {shlex.join(argv)}", err=True)
    rule = ignore_rule(repo, str(path.relative_to(repo)))
    if rule:  # `git add` would refuse it (a bare `runs/` matches configs/runs/ too)
        pattern = rule.split(":", 2)[-1]
        fix = (
            f"anchor it to the root (/{pattern})"  # the usual one: a bare runs/ meant enlace's own runs/ only
            if pattern.strip("/") == "runs"
            else "remove or narrow that rule (git re-includes no file under an ignored folder)"
        )
        click.echo(
            f"warning: git ignores {path.relative_to(repo)} ({rule}: the rule that matches it), so `git add` refuses "
            f"it and sync would not send it — {fix}, then:",
            err=True,
        )
    # paths from here (git add takes them so from a subdirectory), the command's scripts too (they ship with it)
    added = shlex.join(os.path.relpath(p) for p in [path, *(repo / s for s in own.scripts() if (repo / s).is_file())])
    click.echo(
        f"next: git add {added} && git commit -m 'enlace run {name}', then enlace-remote --host HOST launch {name}",
        err=True,
    )


def _check_scripts(repo: Path, absent: list[str]) -> None:
    """The command's scripts not in the repository: it runs in the repository's root, so `init NAME -- python
    hello.py` from scripts/ wrote a run file that never verified (refused, naming the path from the root); one
    nowhere is said (an earlier step of the command may make it)."""
    from orchestrator.errors import UsageError

    for script in absent:
        if (Path.cwd() / script).is_file():
            rooted = (Path.cwd() / script).resolve().relative_to(repo.resolve())
            raise UsageError(
                f"{script}: the command runs in the repository's root ({repo}), where this file is {rooted} — "
                "give that path after `--`"
            )
        click.echo(f"note: {script} is not in this repository (the command runs in its root, {repo})", err=True)


def _yaml_word(word: str) -> str:
    """One argv word as YAML flow-sequence text: as it is where YAML reads it back as that very string, else
    quoted (JSON's quoting is YAML's): -1, on, .inf, a:b, {run_dir}... stay strings."""
    import json

    import yaml

    try:
        plain = yaml.safe_load(f"[{word}]") == [word]
    except yaml.YAMLError:
        plain = False
    return word if plain else json.dumps(word)


COMMANDS = (init,)
