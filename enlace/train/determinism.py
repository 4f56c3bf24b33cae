"""The one place that seeds RNGs and switches deterministic execution on.

On CUDA, deterministic mode needs CUBLAS_WORKSPACE_CONFIG set before cuBLAS initialises, cuDNN
pinned, TF32 off and torch's deterministic algorithms. On CPU it pins intra-op threads to 1:
with 2 threads, separate processes on a loaded machine differ between runs, 1 thread was bitwise
reproducible (docs/benchmarks.md). The thread count is recorded in every checkpoint because it
changes the bits.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from enlace.config.schema import RuntimeConfig
from enlace.errors import ConfigError

CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")  # the values cuBLAS is deterministic with (CUDA docs)


def ensure_cublas_workspace() -> str:
    """CUBLAS_WORKSPACE_CONFIG for deterministic cuBLAS, set before the process's first GEMM (PyTorch reads
    it then): every entry point that may run deterministic work calls this first. A value of the user's
    own that cuBLAS is not deterministic with is refused in one line (never silently kept)."""
    value = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if value is None:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = value = CUBLAS_DETERMINISTIC[0]
    elif value not in CUBLAS_DETERMINISTIC:
        raise ConfigError(
            "environment",
            "CUBLAS_WORKSPACE_CONFIG",
            f"{value!r} does not make cuBLAS deterministic",
            f"unset it, or set {' or '.join(CUBLAS_DETERMINISTIC)}",
        )
    return value


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def configure(rt: RuntimeConfig, device: torch.device) -> dict:
    """Seed, set threads and (if asked) deterministic kernels. Returns what was set, for the log."""
    if rt.deterministic:
        ensure_cublas_workspace()
    threads = rt.threads or (1 if rt.deterministic and device.type == "cpu" else 0)
    if threads:
        torch.set_num_threads(threads)
    _use_deterministic_algorithms(rt.deterministic)
    torch.backends.cudnn.deterministic = rt.deterministic
    torch.backends.cudnn.benchmark = not rt.deterministic
    torch.backends.cuda.matmul.allow_tf32 = not rt.deterministic
    torch.backends.cudnn.allow_tf32 = not rt.deterministic
    seed_everything(rt.seed)
    return {"deterministic": rt.deterministic, "threads": torch.get_num_threads(), "seed": rt.seed}


def _use_deterministic_algorithms(mode: bool) -> None:
    """torch.use_deterministic_algorithms, without its import of torch._inductor (seconds of CPU at every
    trainer start) to set a flag only torch.compile reads: deterministic runs refuse compile
    (config_rules), and a non-deterministic one leaves the default, off."""
    if torch.are_deterministic_algorithms_enabled() == mode:
        return
    set_flag = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_flag is None:  # a torch without the private setter: the public call, import and all
        torch.use_deterministic_algorithms(mode)
    else:
        set_flag(mode, warn_only=False)


def rng_state() -> dict:
    """Every RNG the trainer can touch, in a form `torch.load(weights_only=True)` accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        # this process's own device only: a checkpoint resumes where fewer GPUs are visible
        "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_initialized() else [],
    }


def set_rng_state(state: dict) -> None:
    random.setstate(_as_python_state(state["python"]))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and torch.cuda.is_initialized():  # a CUDA run's own RNG only:
        # asking a CPU host for its current CUDA device initialises CUDA, and crashes where there is none
        torch.cuda.set_rng_state(own_cuda_state(state["cuda"], torch.cuda.current_device()))


def own_cuda_state(states: list, device: int):
    """This device's CUDA RNG state from a checkpoint's list: one entry (this process's device, as saved
    now), or one per device that was visible (older checkpoints: get_rng_state_all) — then the entry of
    the device this process runs on, which is its local rank's."""
    return states[device] if len(states) > 1 and device < len(states) else states[0]


def _as_python_state(s):
    """random.setstate wants tuples; a round trip through torch.save may hand back lists."""
    return (s[0], tuple(s[1]), s[2])
