"""A sweep's points: the grid of `--set KEY=V1,V2,...` values, and the run name of each point, which a person
can read (`lr-sweep-lr1e-3-nl4`: the sweep's name, then each swept key's initials and its value)."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from enlace.contract import RUN_NAME_RE
from orchestrator.errors import UsageError

UNSAFE = re.compile(r"[^A-Za-z0-9.-]")
MAX_POINTS = 256  # a grid larger than this is almost surely a typo (a list pasted twice)


@dataclass(frozen=True)
class Point:
    run_name: str
    values: dict[str, str]  # the swept keys' values of this point, as --set gives them

    def sets(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.values.items()]


def parse_sets(items: tuple[str, ...]) -> tuple[dict[str, list[str]], list[str]]:
    """`--set` items into the swept keys (several comma-separated values) and the fixed ones (one value)."""
    swept: dict[str, list[str]] = {}
    fixed: list[str] = []
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise UsageError(f"--set {item!r}: expected KEY=V1,V2,... (e.g. --set optim.learning_rate=1e-3,3e-3)")
        values = [v.strip() for v in value.split(",")]
        if len(values) > 1 and any(not v for v in values):  # one value may be empty (env.X=): a fixed one
            raise UsageError(f"--set {item!r}: an empty value between commas — write KEY=V1,V2")
        twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if twice is not None:
            raise UsageError(f"--set {item!r}: {twice!r} is given twice — each value once (two runs alike)")
        if key == "run_name":
            raise UsageError(
                "--set run_name: a sweep names each run after its values (NAME-<key><value>...) — `--name` names "
                "the sweep"
            )
        if key in swept or any(f.partition("=")[0] == key for f in fixed):
            raise UsageError(f"--set {key}: given twice — give its values once, comma-separated")
        if len(values) > 1:
            swept[key] = values
        else:
            fixed.append(f"{key}={values[0]}")
    if not swept:
        raise UsageError(
            "a sweep needs at least one --set KEY=V1,V2 with two or more values (a grid of one is a launch)"
        )
    return swept, fixed


def points(sweep: str, swept: dict[str, list[str]]) -> list[Point]:
    """One point per combination of the swept values, in the order given (the last key varies fastest)."""
    combos = list(itertools.product(*swept.values()))
    if len(combos) > MAX_POINTS:
        raise UsageError(f"the grid has {len(combos)} points (more than {MAX_POINTS}) — sweep fewer values at once")
    tags = _tags(list(swept))
    out = []
    for combo in combos:
        name = "-".join([sweep, *(f"{tags[k]}{UNSAFE.sub('_', v)}" for k, v in zip(swept, combo))])
        out.append(Point(name, dict(zip(swept, combo))))
    names = [p.run_name for p in out]
    if len({n.lower() for n in names}) < len(names) or not all(RUN_NAME_RE.fullmatch(n) for n in names):
        # a name too long for a run name, or two values that read the same once made safe (or on a disk that
        # ignores case: 1e-3, 1E-3): numbers, all of them
        out = [Point(f"{sweep}-{i:03d}", p.values) for i, p in enumerate(out)]
    return out


def _tags(keys: list[str]) -> dict[str, str]:
    """Each key's initials (optim.learning_rate → lr, args.n-layer → nl), its last part when that is one word
    (args.lr → lr, env.SEED → SEED), or its last part where two keys share initials."""
    words = {k: [w for w in re.split(r"[_-]", k.rsplit(".", 1)[-1]) if w] for k in keys}
    initials = {k: "".join(w[0] for w in ws) if len(ws) > 1 else k.rsplit(".", 1)[-1] for k, ws in words.items()}
    clash = {t for t in initials.values() if list(initials.values()).count(t) > 1}
    return {k: (k.rsplit(".", 1)[-1] if t in clash else t) for k, t in initials.items()}
