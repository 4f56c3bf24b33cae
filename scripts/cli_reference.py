"""Write docs/cli.md and docs/cli-server.md: every verb and option of `enlace-remote` and of `enlace`, taken
from click itself, so the reference cannot drift from --help. `python scripts/cli_reference.py` rewrites them;
with `--check` it exits 1 when a file differs from what the code says (tests/test_docs.py runs that)."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HEADER = """# Command-line reference: {title}

After reading this page you can look up, for {what}, every verb you type and each of its options.
Generated from the code by `python scripts/cli_reference.py` (a test fails when it is stale): each verb's
`--help` first line, and every option. {other}
"""
PAGES = {
    "cli.md": (
        "enlace-remote",
        "`enlace-remote`",
        "the driver, `enlace-remote`",
        "Every verb also takes `--host` and `--accept-new-host-key` after it. The server's own command line, "
        "`enlace`, is [the other page](cli-server.md).",
    ),
    "cli-server.md": (
        "enlace",
        "`enlace`",
        "`enlace`, the trainer's and the server's command line",
        "The driver, `enlace-remote`, is [the other page](cli.md).",
    ),
}


COMMON = {"--host", "--accept-new-host-key"}  # every driver verb takes the global options after it too


def _options(cmd: click.Command) -> list[str]:
    rows = []
    for p in cmd.params:
        if isinstance(p, click.Option) and not p.hidden and not COMMON & set(p.opts):
            names = ", ".join(f"`{n}`" for n in [*p.opts, *p.secondary_opts])
            rows.append(f"- {names}: {' '.join((p.help or '').split()) or '(see --help)'}")
    return rows


def _usage(cmd: click.Command) -> str:
    args = [  # (a metavar such as [HOST] already says it is optional)
        p.human_readable_name if p.required or p.human_readable_name.startswith("[") else f"[{p.human_readable_name}]"
        for p in cmd.params
        if isinstance(p, click.Argument)
    ]
    return " ".join(args)


def _section(prog: str, name: str, cmd: click.Command) -> list[str]:
    """The verb's usage, the first paragraph of its --help, one line per option."""
    summary = inspect.cleandoc(cmd.help or "").replace("\b\n", "").split("\n\n")[0]
    head = f"### `{prog} {name} {_usage(cmd)}".rstrip() + "`"
    return [head, "", " ".join(summary.split()), *_options(cmd), ""]


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    found = []
    for name in sorted(group.commands):
        cmd = group.commands[name]
        found.append((prefix + name, cmd))
        if isinstance(cmd, click.Group):
            found += _commands(cmd, f"{prefix}{name} ")
    return found


def render(page: str) -> str:
    from enlace.cli import main as trainer
    from orchestrator.cli import main as driver

    prog, title, what, other = PAGES[page]
    group = driver if prog == "enlace-remote" else trainer
    lines = [HEADER.format(title=title, what=what, other=other)]
    lines += [f"Global options: {', '.join(f'`{o}`' for p in group.params for o in p.opts)}.", ""]
    cmds = _commands(group)
    for name, cmd in [c for c in cmds if not c[1].hidden]:
        lines += _section(prog, name, cmd)
    hidden = [name for name, cmd in cmds if cmd.hidden]
    if hidden:
        named = ", ".join(f"`{n}`" for n in hidden)
        lines += [
            f"The driver's own server verbs, hidden from --help and left out above (the driver builds their"
            f" arguments; `{prog} VERB --help` shows each one's options): {named}.",
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    stale = []
    for page in PAGES:
        target = REPO / "docs" / page
        text = render(page)
        if "--check" in sys.argv[1:]:
            if not (target.exists() and target.read_text() == text):
                stale.append(str(target))
            continue
        target.write_text(text)
        print(f"wrote {target}")
    for target in stale:
        print(f"{target} is out of date: run python scripts/cli_reference.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
