"""`enlace sample`: text from a trained checkpoint.

    checkpoint (verified against its MANIFEST, loaded weights_only) → ByteGPT in eval mode →
    bytes, one at a time: logits of the last position / temperature → top-k → a draw from a seeded
    generator → appended; the context is cropped to the model's seq_len (no KV cache: these models
    are small, and the cropped forward is the one train uses).

The same checkpoint, prompt, temperature, top-k and seed give the same bytes. Output is decoded as
UTF-8 with invalid sequences replaced: a byte model may stop mid-character.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from enlace.train.engine import pick_device
from enlace.train.model import ByteGPT
from enlace.train.trained import find_checkpoint, load_model


@torch.no_grad()
def generate_streams(
    model: ByteGPT,
    prompt: bytes,
    streams: int,
    n_bytes: int,
    temperature: float,
    top_k: int | None,
    seed: int,
    contexts: list[bytes] | None = None,
) -> list[bytes]:
    """`streams` continuations of `prompt` (a newline when empty) — or of each stream's own context, all of
    one length — `n_bytes` new bytes each, drawn side by side in one batch. temperature 0 picks the most
    likely byte."""
    device = next(model.parameters()).device
    seq_len = model.cfg.seq_len
    g = torch.Generator(device=device).manual_seed(seed)
    if contexts:
        idx = torch.tensor([list(c) for c in contexts], dtype=torch.long, device=device)  # (S, T)
    else:
        idx = torch.tensor(list(prompt or b"\n"), dtype=torch.long, device=device)[None, :].repeat(streams, 1)
    out = torch.empty((streams, n_bytes), dtype=torch.long, device=device)
    for i in range(n_bytes):
        logits, _ = model(idx[:, -seq_len:])
        logits = logits[:, -1, :].float()  # (S, vocab)
        if temperature <= 0:
            nxt = torch.argmax(logits, dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=g)  # (S, 1)
        out[:, i] = nxt[:, 0]
        idx = torch.cat([idx, nxt], dim=1)[:, -seq_len:]
    return [bytes(row.tolist()) for row in out.cpu()]


def generate(model: ByteGPT, prompt: bytes, n_bytes: int, temperature: float, top_k: int | None, seed: int) -> bytes:
    return generate_streams(model, prompt, 1, n_bytes, temperature, top_k, seed)[0]


def sample(
    target: Path, prompt: bytes, n_bytes: int, temperature: float, top_k: int | None, seed: int, device: str = "auto"
) -> dict[str, Any]:
    dev = pick_device(device)
    ckpt = find_checkpoint(target)
    model, trainer = load_model(ckpt, dev)
    t0 = time.perf_counter()
    new = generate(model, prompt, n_bytes, temperature, top_k, seed)
    seconds = time.perf_counter() - t0
    text = (prompt + new).decode("utf-8", errors="replace")
    return {
        "checkpoint": str(ckpt),
        "step": trainer["step"],
        "seed": seed,
        "temperature": temperature,
        "top_k": top_k,
        "bytes": n_bytes,
        "bytes_per_s": round(n_bytes / seconds, 1) if seconds else None,
        "device": str(dev),
        "text": text,
    }
