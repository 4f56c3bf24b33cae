"""A sweep's record on this machine, .enlace/sweeps/NAME.json in the repo it was launched from: its run file,
the fixed --set items, and each point (run name, host, values). `status --sweep`, `stop --sweep`, `fetch
--sweep`, `plot --sweep` and the board read it; .enlace/sweeps/last names the newest (bare `--sweep`)."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from enlace.contract import RUN_NAME_RE
from enlace.errors import AlreadyRunning
from orchestrator.errors import UsageError
from orchestrator.hosts.resolve import driver_dir
from orchestrator.ssh.portable import held_alone

NAME_RULE = "a sweep name is 1-40 characters of [A-Za-z0-9._-] starting with a letter or digit"


@dataclass
class Sweep:
    name: str
    run_file: str
    fixed: list[str]  # the --set items every point has
    keys: list[str]  # the swept keys, in the grid's order
    points: list[dict]  # {"run_name", "host", "values": {key: value}}
    notify: str | None = None  # whom its ends are told, as shown: scheme and host only
    created: float = field(default_factory=time.time)

    def hosts(self) -> list[str]:
        return list(dict.fromkeys(p["host"] for p in self.points))


def _dir(repo: Path) -> Path:
    return repo / ".enlace" / "sweeps"


def check_name(name: str) -> str:
    if not (RUN_NAME_RE.fullmatch(name) and len(name) <= 40):
        raise UsageError(f"sweep name {name!r}: {NAME_RULE}")
    return name


@contextlib.contextmanager
def launching(repo: Path, name: str):
    """One `sweep` command of a name at a time from this repo: a second at once (another terminal) is refused; both
    were taken, and the record kept one grid while the other's runs said they were the sweep's."""
    d = _dir(repo)
    driver_dir(repo)
    d.mkdir(exist_ok=True)
    with open(d / f".{name}.lock", "a") as lock:
        if not held_alone(lock):
            raise AlreadyRunning(
                f"sweep {name}: another `enlace-remote sweep` of that name is under way from this repo — let it end"
                f" (then the same command with --name {name} starts the points it did not), or give another --name"
            )
        yield


def save(repo: Path, sweep: Sweep, last: bool = True) -> None:
    """Write the record (and, with `last`, make it the one a bare --sweep means), each file replaced whole."""
    d = _dir(repo)
    driver_dir(repo)
    d.mkdir(exist_ok=True)
    files = [(d / f"{sweep.name}.json", json.dumps(asdict(sweep), indent=1) + "\n")]
    for path, text in files + ([(d / "last", sweep.name)] if last else []):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)


def note_launch(repo: Path, host: str, run_name: str, overrides) -> None:
    """A sweep's point launched again on its own with --set items of its swept keys (`launch RUN_NAME --set
    KEY=V`): its values in the record follow, so that the table says what the run ran with."""
    sets = dict(item.partition("=")[::2] for item in overrides)
    for name in names(repo):
        try:
            sweep = load(repo, name)
        except UsageError:
            continue  # a record this enlace cannot read: status --sweep says so
        point = next((p for p in sweep.points if p["run_name"] == run_name and p["host"] == host), None)
        if point is not None and sets.keys() & point["values"].keys():
            point["values"] = {k: sets.get(k, v) for k, v in point["values"].items()}
            save(repo, sweep, last=False)


def point_values(repo: Path, host: str, run_name: str) -> dict[str, str]:
    """The swept values of `run_name` on `host` when it is a point of a sweep launched from here ({} if not):
    what it is in its sweep's table, kept by a `launch RUN_NAME --resume none` (which trained the file's)."""
    for name in names(repo):
        with contextlib.suppress(UsageError):  # a record this enlace cannot read: status --sweep says so
            point = next((p for p in load(repo, name).points if (p["run_name"], p["host"]) == (run_name, host)), None)
            if point is not None:
                return dict(point["values"])
    return {}


def exists(repo: Path, name: str) -> bool:
    return (_dir(repo) / f"{name}.json").is_file()


def names(repo: Path) -> list[str]:
    return sorted(p.stem for p in _dir(repo).glob("*.json"))


def load(repo: Path, name: str | None) -> Sweep:
    """The sweep `name`, or the newest launched from this repo (None or ""), said on a bad name with the ones
    there are."""
    d = _dir(repo)
    if not name:
        last = d / "last"
        if not last.is_file():
            raise UsageError(
                "no sweep was launched from this repo yet — start one with `enlace-remote sweep RUN --set KEY=V1,V2`"
            )
        name = last.read_text().strip()
    check_name(name)
    path = d / f"{name}.json"
    if not path.is_file():
        have = names(repo)
        raise UsageError(f"no sweep {name!r} launched from this repo — sweeps: {', '.join(have) or 'none'}")
    try:
        return Sweep(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        raise UsageError(
            f"{path}: not a sweep record this enlace can read — remove it, or launch the sweep anew"
        ) from None
