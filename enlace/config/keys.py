"""Which key a wrong one meant: other trainers' names for ours (nanoGPT, HF), the closest valid key, and the
check of a file's top-level keys. Config errors name the fix, not just the fault."""

from __future__ import annotations

import difflib
import typing
from typing import Any

from enlace.errors import ConfigError

# the names other trainers use (nanoGPT, HF) for a key of ours: spelling alone led `lr` to 'min_lr'
OTHER_NAMES = {
    "lr": "learning_rate",
    "wd": "weight_decay",
    "clip": "grad_clip",
    "max_grad_norm": "grad_clip",
    "max_iters": "max_steps",
    "gradient_accumulation_steps": "grad_accum",
    "block_size": "seq_len",
    "n_embd": "d_model",
    "steps": "max_steps",
}


def closest(key: str, valid: typing.Iterable[str]) -> str:
    valid = list(valid)
    if OTHER_NAMES.get(key) in valid:
        return f"did you mean {OTHER_NAMES[key]!r}?"
    match = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f"did you mean {match[0]!r}?" if match else f"valid keys: {', '.join(sorted(valid))}"


def check_top(
    layer: dict[str, Any],
    allowed: typing.Sequence[str],
    source: str,
    elsewhere: typing.Sequence[str] = (),
    homes: dict[str, str] | None = None,
) -> None:
    """Every key of `layer` is `allowed`. Else the fix: a section's key written here (`homes`: name → its
    "section.name") says where it goes; a near miss of one of `elsewhere` (a run file of your own command's
    keys) says so; else the closest allowed key."""
    for k in layer:
        if k in allowed:
            continue
        key, homes = str(k), homes or {}
        home = homes.get(OTHER_NAMES.get(key, key)) or homes.get(key.removesuffix("s"))  # devices → runtime.device
        own = difflib.get_close_matches(key, elsewhere, n=1, cutoff=0.75)
        if home:
            section, _, name = home.partition(".")
            fix = f"did you mean {home!r}? (it goes under its section: `{section}: {{{name}: …}}`)"
        elif own and not difflib.get_close_matches(key, allowed, n=1, cutoff=0.75):
            fix = f"did you mean {own[0]!r}? (a run file of your own command: docs/own-script.md)"
        else:
            fix = closest(key, allowed)
        raise ConfigError(source, key, "unknown key", fix)
