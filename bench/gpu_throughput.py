"""gpu_check's throughput section: enlace against nanoGPT's loop on the same card, shapes and bytes.

Three rates, one after the other in one process, each over the same number of steps after a warm-up:
  enlace_step   engine.train_step on the run's data stream, drawn ahead as the trainer draws it
  enlace_train  the whole training loop (`train()`: logging, heartbeat, stop flag), from its metrics.jsonl
  nanogpt       nanoGPT's train.py loop: get_batch from a memmapped train.bin (pinned, non_blocking), autocast,
                GradScaler(enabled=fp16), torch.compile, fused AdamW on CUDA, TF32, clip 1.0 — over nanoGPT's
                own model (`--nanogpt DIR`, a checkout's model.py) or, without one, the nanoGPT-style model of
                bench/step_overhead.py (same layout: fused qkv, SDPA, 4x GELU MLP, tied embeddings)
MFU as nanoGPT estimates it: (6 N + 12 L H Q T) flops a token over the card's dense bf16 peak (None for
cards not in PEAK_FLOPS and on the CPU). On CUDA the run takes its card's settings: bf16 where native,
compiled; the batch is 4x the run's (a step of 8 x 512 tokens is all launch overhead on an H100).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from gpu_sections import WARMUP, bf16_native, config, sync, train_steps

PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "L4": 121e12}


def throughput(run: str, overrides: list[str], steps: int, device: torch.device, small: bool, nanogpt) -> dict:
    cuda = device.type == "cuda"
    settings = ["runtime.deterministic=false"]
    if cuda:
        precision = "bf16" if bf16_native(device) else "fp16"
        settings += [f"runtime.precision={precision}", "runtime.compile=true"]
    settings.append(f"training.batch_size={config(run, overrides).training.batch_size * (4 if cuda else 1)}")
    cfg = config(run, [*overrides, *settings])
    m, t = cfg.model, cfg.training
    tokens_per_step = t.batch_size * m.seq_len
    steps = max(steps, 50 if cuda else WARMUP + 5)  # on a card: ten of the loop's log intervals
    flops = 6 * cfg_params(cfg) + 12 * m.n_layer * m.n_head * (m.d_model // m.n_head) * m.seq_len
    peak = next((f for name, f in PEAK_FLOPS.items() if cuda and name in torch.cuda.get_device_name(device)), None)

    def figure(tokens_per_s: float) -> dict:
        mfu = round(tokens_per_s * flops / peak, 4) if peak else None
        return {"tokens_per_s": round(tokens_per_s, 1), "mfu": mfu}

    out: dict = {"run": run, "batch_size": t.batch_size, "seq_len": m.seq_len, "precision": cfg.runtime.precision}
    out["compile"], out["steps"] = cfg.runtime.compile, steps
    for name, measure in (
        ("enlace_step", lambda: train_steps(cfg, steps)[1]),
        ("enlace_train", lambda: train_loop_rate(run, [*overrides, *settings], steps)),
        ("nanogpt", lambda: nanogpt_rate(cfg, steps, device, nanogpt)),
    ):
        try:
            out[name] = figure(measure())
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    base = out["nanogpt"].get("tokens_per_s")
    for name in ("enlace_step", "enlace_train"):
        if base and "tokens_per_s" in out[name]:
            out[name]["over_nanogpt"] = round(out[name]["tokens_per_s"] / base, 3)
    out["baseline"] = "nanoGPT's model.py" if nanogpt else "the nanoGPT-style model of bench/step_overhead.py"
    out["tokens_per_step"] = tokens_per_step
    return out


def cfg_params(cfg) -> int:
    """Parameters of the run's model, without the position embedding (nanoGPT's count for its MFU)."""
    from enlace.train.model import ByteGPT

    with torch.device("meta"):
        model = ByteGPT(cfg.model)
    return sum(p.numel() for n, p in model.named_parameters() if "pos" not in n)


def train_loop_rate(run: str, overrides: list[str], steps: int) -> float:
    """The trainer's own loop, logging every 5 steps: the median tokens/s of its log intervals, the first
    interval (compile, the first step's allocations) left out."""
    from enlace.train.loop import train

    with tempfile.TemporaryDirectory(prefix="gpu-throughput-") as tmp:
        sets = [
            f"training.max_steps={steps}",
            f"optim.warmup_steps={min(steps, 5)}",
            "training.eval_every=0",
            "checkpoint.every=0",
            "training.log_every=5",
        ]
        run_cfg = config(run, [*overrides, *sets])
        run_cfg.runs_root = Path(tmp)
        with contextlib.redirect_stdout(io.StringIO()):
            train(run_cfg, resume="none")
        lines = (run_cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    rates = [r["tokens_per_s"] for r in map(json.loads, lines) if r.get("kind") == "train" and r["step"] > 5]
    return statistics.median(rates)


def nanogpt_rate(cfg, steps: int, device: torch.device, checkout: Path | None) -> float:
    m, t, o = cfg.model, cfg.training, cfg.optim
    model = nanogpt_model(cfg, checkout).to(device)
    cuda = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=o.learning_rate, betas=(o.beta1, o.beta2), fused=cuda)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.runtime.precision)
    ctx = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)
    run_model = torch.compile(model) if cfg.runtime.compile else model
    with tempfile.TemporaryDirectory(prefix="gpu-nanogpt-") as tmp:
        train_bin = Path(tmp, "train.bin")
        train_bin.write_bytes(b"".join(Path(f).read_bytes() for f in corpus_files(cfg)))

        def get_batch():  # nanoGPT's: a fresh memmap per batch, random offsets, pinned and non_blocking
            data = np.memmap(train_bin, dtype=np.uint8, mode="r")
            ix = torch.randint(len(data) - m.seq_len - 1, (t.batch_size,))
            x = torch.stack([torch.from_numpy(data[i : i + m.seq_len].astype(np.int64)) for i in ix])
            y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + m.seq_len].astype(np.int64)) for i in ix])
            if cuda:
                return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
            return x, y

        x, y = get_batch()
        t0 = time.perf_counter()
        for it in range(steps):
            if it == WARMUP:
                sync(device)
                t0 = time.perf_counter()
            lr = o.min_lr + 0.5 * (o.learning_rate - o.min_lr) * (1 + math.cos(math.pi * it / steps))
            for group in opt.param_groups:
                group["lr"] = lr
            with ctx:
                out = run_model(x, y)
                loss = out[1] if isinstance(out, tuple) else out  # nanoGPT's GPT returns (logits, loss)
            x, y = get_batch()  # the next batch while the card runs the forward, as nanoGPT does
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
        sync(device)
    return (steps - WARMUP) * t.batch_size * m.seq_len / (time.perf_counter() - t0)


def nanogpt_model(cfg, checkout: Path | None) -> torch.nn.Module:
    m = cfg.model
    if checkout is None:
        from step_overhead import NanoGPT

        return NanoGPT(256, m.seq_len, m.d_model, m.n_layer, m.n_head)
    spec = importlib.util.spec_from_file_location("nanogpt_model", checkout / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["nanogpt_model"] = module  # its dataclass needs its module registered
    spec.loader.exec_module(module)
    conf = module.GPTConfig(
        block_size=m.seq_len,
        vocab_size=256,
        n_layer=m.n_layer,
        n_head=m.n_head,
        n_embd=m.d_model,
        dropout=m.dropout,
        bias=False,
    )
    return module.GPT(conf)


def corpus_files(cfg) -> list[Path]:
    from enlace.data.paths import resolve_paths

    return resolve_paths(cfg.data.paths, cfg.root)
