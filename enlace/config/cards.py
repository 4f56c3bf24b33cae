"""`profile: auto`: the profile that fits the card a run lands on, chosen where the run starts (check-config,
verify, preflight and train on the server; the driver's machine reads as whatever card it has, or none):

    no NVIDIA card                  cpu       fp32
    compute capability 7.x (Turing) rtx2060   fp16 with a GradScaler: no native bf16 (emulated: slow GEMMs)
    8.x (Ampere: A100, A10, 30xx)   ampere    bf16, compiled, TF32 and fused AdamW (not deterministic)
    9.x and newer (Hopper: H100)    hopper    bf16, compiled, TF32 and fused AdamW (not deterministic)

The card is the run's first visible one (CUDA_VISIBLE_DEVICES: the server's queue gives a run only its own
GPUs), as `nvidia-smi` reports it: no torch here, since the driver loads configs too and never imports it.
Stdlib only.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from enlace.errors import ConfigError

AUTO = "auto"
NATIVE_BF16 = (8, 0)  # compute capability from which bf16 runs in hardware (below: emulated, slow GEMMs)
QUERY = ["--query-gpu=index,uuid,compute_cap,name", "--format=csv,noheader"]


def pick(capability: tuple[int, int] | None, name: str = "") -> tuple[str, str]:
    """(the profile for a card of `capability`, why it was chosen)."""
    if capability is None:
        return "cpu", "no NVIDIA card here: the CPU's profile"
    major, minor = capability
    card = f"{name + ', ' if name else ''}compute capability {major}.{minor}"
    if major >= 9:
        return "hopper", f"{card}: bf16 and compile"
    if capability >= NATIVE_BF16:
        return "ampere", f"{card}: bf16 and compile"
    return "rtx2060", f"{card}: no native bf16, fp16 with a GradScaler"


def card() -> tuple[tuple[int, int] | None, str]:
    """The run's first visible card's compute capability and name; (None, "") without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, ""
    fix = "name a profile instead (profile: ampere, hopper, rtx2060 or cpu)"
    try:
        out = subprocess.run([exe, *QUERY], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError("profile", AUTO, f"nvidia-smi did not answer ({e.__class__.__name__})", fix) from None
    rows = [[part.strip() for part in line.split(",", 3)] for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not rows or any(len(r) < 4 for r in rows):
        said = (out.stderr or out.stdout).strip().splitlines()
        why = f"nvidia-smi cannot tell the card's compute capability ({said[-1] if said else 'no answer'})"
        raise ConfigError("profile", AUTO, why + " — a driver older than 510 does not", fix)
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = (hidden or "").split(",")[0].strip()
    if hidden is not None and visible in ("", "-1"):  # set to hide every card: torch sees none, the run is a CPU run
        return None, ""
    # the first visible card by index or UUID; one nvidia-smi does not list (a MIG instance's id) is on card 0's kind
    chosen = next((r for r in rows if visible in (r[0], r[1])), rows[0]) if visible else rows[0]
    try:
        major, minor = (int(x) for x in chosen[2].split("."))
    except ValueError:
        raise ConfigError("profile", AUTO, f"nvidia-smi gave compute capability {chosen[2]!r}", fix) from None
    return (major, minor), chosen[3]
