"""`profile: auto`: the profile that fits the card a run lands on, chosen where the run starts (check-config,
verify, preflight and train on the server; the driver, without torch or a GPU, reads it as the CPU's):

    no CUDA device                  cpu       fp32
    compute capability 7.x (Turing) rtx2060   fp16 with a GradScaler: no native bf16 (emulated: slow GEMMs)
    8.x (Ampere: A100, A10, 30xx)   ampere    bf16, compiled, TF32 and fused AdamW (not deterministic)
    9.x and newer (Hopper: H100)    hopper    bf16, compiled, TF32 and fused AdamW (not deterministic)

The first visible device is the run's: the server's queue gives a run only its own GPUs
(CUDA_VISIBLE_DEVICES). torch is imported only for `auto`, and only here.
"""

from __future__ import annotations

AUTO = "auto"


def pick(capability: tuple[int, int] | None, name: str = "") -> tuple[str, str]:
    """(the profile for a card of `capability`, why it was chosen)."""
    if capability is None:
        return "cpu", "no CUDA device here: the CPU's profile"
    major, minor = capability
    card = f"{name + ', ' if name else ''}compute capability {major}.{minor}"
    if major >= 9:
        return "hopper", f"{card}: bf16 and compile"
    if major >= 8:
        return "ampere", f"{card}: bf16 and compile"
    return "rtx2060", f"{card}: no native bf16, fp16 with a GradScaler"


def card() -> tuple[tuple[int, int] | None, str]:
    """The first visible CUDA device's compute capability and name; (None, "") without torch or a device."""
    try:
        import torch
    except ImportError:  # the driver's own install: no torch, no GPU
        return None, ""
    if not torch.cuda.is_available():
        return None, ""
    return torch.cuda.get_device_capability(0), torch.cuda.get_device_name(0)
