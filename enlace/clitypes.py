"""click parameter types both command lines use (torch-free: the driver imports them)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import click

from enlace.contract import (
    BACKOFF_S,
    CPU_SLOTS,
    GPU_FREE_BELOW,
    MAX_GRACE_S,
    RESTARTS,
    RUN_NAME_RE,
    RUN_NAME_RULE,
)


class LocalPath(click.Path):
    """A path option's value: never empty (`--dest ''` read as `.`, and fetch wrote a run's files into the
    repository's root); `suffixes`: what it must end in (a plot's image: matplotlib refused `.txt` in a traceback)."""

    def __init__(self, *, suffixes: tuple[str, ...] = (), **kwargs):
        super().__init__(path_type=Path, **kwargs)
        self.suffixes = suffixes

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path: name one (`.` for the current directory)", param, ctx)
        if self.suffixes and Path(value).suffix.lower() not in self.suffixes:
            self.fail(f"{value}: name a file ending in {', '.join(self.suffixes)}", param, ctx)
        return super().convert(value, param, ctx)


# what `plot --out` writes: matplotlib's formats (its savefig takes the format from the suffix)
IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".eps", ".ps", ".svgz")


class Seconds(click.ParamType):
    """A duration in seconds: finite, above 0, at most a day (the longest grace a stop waits: no option's
    duration is longer; nan, inf and negatives are refused)."""

    name = "SECONDS"

    def convert(self, value, param, ctx) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or not 0 < seconds <= MAX_GRACE_S:
            self.fail(f"{value!r}: give a number of seconds above 0 and at most {MAX_GRACE_S:.0f} (a day)", param, ctx)
        return seconds


def _check_overrides(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """Each --set is SECTION.KEY=VALUE; a run_name given here is checked now, before any I/O (every other key
    is checked by the config loader, where the run's config is loaded)."""
    for value in values:
        key, eq, new = value.partition("=")
        if not eq or not key.strip():
            raise click.BadParameter(
                f"{value!r}: expected SECTION.KEY=VALUE, e.g. training.max_steps=50 (for your own command: args.NAME=VALUE)"
            )
        if key.strip() == "run_name" and not RUN_NAME_RE.fullmatch(new):
            raise click.BadParameter(f"run_name={new!r} is not a valid name: {RUN_NAME_RULE}")
    return values


def set_option_saying(help_text: str):
    """`--set SECTION.KEY=VALUE` (repeatable, each item checked as it is parsed), with a verb's own help."""
    return click.option(
        "--set", "overrides", multiple=True, callback=_check_overrides, metavar="SECTION.KEY=VALUE", help=help_text
    )


set_option = set_option_saying(
    "Override one config value (highest precedence), e.g. --set training.max_steps=50; a launch records it "
    "in the run's run.json (a later launch of the run applies it again), and a line's first start in its "
    "config.yaml. A run file of your own command takes args.NAME=V (--NAME=V appended), env.NAME=V and "
    "run_name=NAME. Repeatable."
)
root_option = click.option(
    "--root",
    type=LocalPath(file_okay=False),
    default=None,
    help="Project root holding configs/ and runs/ (default: the nearest one above the current directory).",
)

fresh_option = click.option(
    "--fresh",
    is_flag=True,
    help="Leave out the --set items the run's launches recorded in run.json, as a launch with --resume none does.",
)


def _check_resume(ctx, param, value: str) -> str:
    if not value.strip():  # it passed verify as "a complete checkpoint", then the trainer refused it
        raise click.BadParameter("an empty value: latest, none, or a checkpoint's path (checkpoints/step-N)")
    return value


def resume_option_saying(help_text: str):
    """--resume latest|none|PATH, with what it does in this command."""
    return click.option(
        "--resume",
        default="latest",
        show_default=True,
        metavar="latest|none|PATH",
        callback=_check_resume,
        help=help_text,
    )


resume_option = resume_option_saying(
    "Checkpoint to resume from: the run's newest complete one, none (start afresh), or a dir."
)


def gc_options(fn):
    """`gc`'s options, the same on both command lines (enlace-remote gc passes them to enlace gc)."""
    fn = click.option("--dry-run", is_flag=True, help="Only say what would be removed.")(fn)
    return click.option(
        "--keep",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="Also keep this many of the most recently synced trees.",
    )(fn)


def supervisor_options(backoff: bool = True):
    """--restarts, --stall-timeout (and --backoff): the supervisor's policy (enlace/server/supervise.py), the same
    on `enlace-remote launch` and on the server's `enlace start` / `enlace supervise`."""

    def add(fn):
        if backoff:
            fn = click.option(
                "--backoff",
                type=click.FloatRange(0, 3600),
                default=BACKOFF_S,
                show_default=True,
                help="Seconds before the first restart; each next one waits 3x longer.",
            )(fn)
        fn = click.option(
            "--stall-timeout",
            type=Seconds(),
            default=None,
            metavar="S",
            help="Seconds without a sign of life (a step, an eval batch, a checkpoint) that count as hung, once the "
            "run has trained; default: 10x the run's longest silence so far, at least 300.",
        )(fn)
        return click.option(
            "--restarts",
            type=click.IntRange(0, 100),
            default=RESTARTS,
            show_default=True,
            help="Restarts from the newest checkpoint after a crash or a stall (never after a stop or a config "
            "error; not for a multi-host --hosts run).",
        )(fn)

    return add


def queue_options(fn):
    """The server queue's settings (hosts.yaml's cpu_slots and gpu_free_below), as start and supervise take them."""
    fn = click.option(
        "--gpu-free-below",
        type=click.FloatRange(0, 1, min_open=True),
        default=GPU_FREE_BELOW,
        show_default=True,
        help="A GPU whose other processes hold less than this fraction of its memory is free.",
    )(fn)
    return click.option(
        "--cpu-slots",
        type=click.IntRange(min=1),
        default=CPU_SLOTS,
        show_default=True,
        help="How many CPU runs may run at once on this server.",
    )(fn)


class WebhookUrl(click.ParamType):
    """An http(s) URL without control characters or spaces (it travels in an argv and is POSTed to as is)."""

    name = "URL"

    def convert(self, value, param, ctx) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        try:
            parts.port  # noqa: B018 (a port that is not a number raises here, not in the supervisor)
        except ValueError:
            self.fail(f"{value[:60]!r}: its port is not a number", param, ctx)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or any(c.isspace() or ord(c) < 32 for c in value)
        ):
            self.fail(
                f"{value[:60]!r} is not an http(s) URL — e.g. https://hooks.slack.com/services/T0/B0/XYZ", param, ctx
            )
        return value


def run_end_options(fn):
    """The sweep a run is part of, and the host's name as the driver knows it (for the end's message), as start
    and supervise take them. Whom to tell is start's --notify alone: the supervisor gets the URL in its
    environment (ENLACE_NOTIFY_URL), never on a command line other accounts can read."""
    fn = click.option(
        "--sweep-share", type=click.IntRange(min=1), default=1, help="How many runs of the sweep this host has."
    )(fn)
    fn = click.option(
        "--sweep", default=None, help="The sweep this run is part of (its end is told once all its runs here ended)."
    )(fn)
    return click.option("--host-name", default="", help="The host's name as the driver knows it (for the message).")(fn)


def shown_url(url: str) -> str:
    """A webhook URL as a message may show it: its scheme and host, not its path (a webhook's secret)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # not a port: left out, never raised from here
        port = ""
    return f"{parts.scheme}://{parts.hostname}{port}/…"


def notify_option(help_text: str = "POST a JSON note here when the run ends."):
    """--notify URL (a webhook; enlace/server/notify.py), as launch, sweep and the server's start take it."""
    return click.option("--notify", type=WebhookUrl(), default=None, help=help_text)


def grace_option(fn):
    """--grace for stop (the driver's, a sweep's, the server's): by default sized from the run's own checkpoint
    save, which the trainer records (enlace.server.lifecycle.default_grace)."""
    return click.option(
        "--grace",
        type=Seconds(),
        default=None,
        metavar="S",
        help="Seconds to wait for the run's checkpoint before reporting it still running (with --kill: SIGKILL it); "
        "default: 3x the seconds its last checkpoint save took plus 60 (a command: at least its supervise.grace plus "
        "30), at least 120.",
    )(fn)


def stop_request(run_name: str, grace: float | None, kill: bool) -> tuple[list[str], float]:
    """The server's `stop` argv for a driver, and how long to wait for its answer (the server sizes an unset
    grace itself, at most MAX_GRACE_S; a dead connection is found by ssh's keepalives, not by this)."""
    args = ["stop", run_name, "--json", *(["--grace", str(grace)] if grace is not None else []), *(["--kill"] * kill)]
    return args, (grace if grace is not None else MAX_GRACE_S) + 60


def parse_size(text: str | None) -> int | None:
    """'2GiB', '512MiB', '1.5G', '1000000' → bytes."""
    if text is None:
        return None
    units = {
        "": 1,
        "k": 2**10,
        "kib": 2**10,
        "m": 2**20,
        "mib": 2**20,
        "g": 2**30,
        "gib": 2**30,
        "t": 2**40,
        "tib": 2**40,
        "kb": 10**3,
        "mb": 10**6,
        "gb": 10**9,
    }
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    value = float(m.group(1)) if m else 0.0
    if not m or unit not in units or value <= 0:
        raise click.BadParameter(f"{text!r} is not a size; write e.g. 2GiB, 512MiB or a number of bytes")
    return int(value * units[unit])
