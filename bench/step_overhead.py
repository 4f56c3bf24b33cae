"""tokens/s of enlace's training step, in the same process, interleaved blocks (the machine is noisy):

1. vs a bare PyTorch loop over the same model and the same batches (the step's own overhead);
   peak RSS of each, measured in its own child process. Goal: ratio >= 0.98, RSS no higher.
2. vs a nanoGPT-style script written here (its own model class of the same shape, a memmapped
   train.bin of the same smoke-corpus bytes, random offsets per step, AdamW, clipping, cosine lr),
   enlace reading the same bytes through its data stream: a regression in enlace's model, data
   path or step shows here even when (1) does not. Goal: ratio >= 0.95 (it was ≈1.0).

3. what enlace's step adds in absolute terms: per-step time of both loops on a model so small (and on one
   thread) that the step is all overhead. The ratio in (1) moves by several % between runs on this
   machine; this figure, in µs, is what a regression of the step itself would move.

    python bench/step_overhead.py [--steps 30] [--rounds 12]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import fixed_batches, smoke_config
from enlace import engine
from enlace.sysinfo import mib, peak_rss_bytes


def plain_update(loss, model, opt) -> None:
    """backward, clip to 1.0, AdamW step, free the grads: what both plain loops do after the forward."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def bare_loop(cfg, model, batches):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)

    def run(steps):
        for x, y in batches[:steps]:
            _, loss = model(x, y)
            plain_update(loss, model, opt)
        return loss.item()

    return run


def enlace_loop(setup, batches):
    def run(steps):
        it = iter(batches[:steps])
        for step in range(steps):
            r = engine.train_step(setup, step, lambda: next(it))
        return r.loss.item()

    return run


class NanoBlock(nn.Module):
    """Pre-LayerNorm block, nanoGPT's layout: fused c_attn, flash (SDPA) attention, 4x GELU MLP."""

    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d: int, n_layer: int, n_head: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)
        self.h = nn.ModuleList(NanoBlock(d, n_head) for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def nano_loop(cfg, train_bin: Path):
    """nanoGPT's train.py shape: get_batch from a memmap at random offsets, lr set every step."""
    m, t, o = cfg.model, cfg.training, cfg.optim
    model = NanoGPT(256, m.seq_len, m.d_model, m.n_layer, m.n_head)
    opt = torch.optim.AdamW(model.parameters(), lr=o.learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
    state = {"it": 0}

    def get_batch():
        data = np.memmap(train_bin, dtype=np.uint8, mode="r")  # re-opened per batch, as nanoGPT does
        ix = torch.randint(len(data) - m.seq_len - 1, (t.batch_size,))
        x = torch.stack([torch.from_numpy(data[i : i + m.seq_len].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + m.seq_len].astype(np.int64)) for i in ix])
        return x, y

    def run(steps):
        for _ in range(steps):
            it = state["it"] = state["it"] + 1
            lr = o.min_lr + 0.5 * (o.learning_rate - o.min_lr) * (1 + math.cos(math.pi * min(it / t.max_steps, 1)))
            for group in opt.param_groups:
                group["lr"] = lr
            x, y = get_batch()
            loss = model(x, y)
            plain_update(loss, model, opt)
        return loss.item()

    return run


def enlace_stream_loop(setup, stream):
    state = {"step": 0}

    def run(steps):
        for _ in range(steps):
            r = engine.train_step(setup, state["step"], stream.next_batch)
            state["step"] += 1
        return r.loss.item()

    return run


def timed(fn, steps):
    t0 = time.perf_counter()
    fn(steps)
    return time.perf_counter() - t0


def paired_ratio(a, b, steps: int, rounds: int) -> tuple[float, float, float]:
    """Throughput of b over a: the median, over rounds, of time(a) / time(b) for one block of `steps` each,
    run back to back, alternating which goes first. On this shared machine the same loop's block time
    drifted by 30 % within a run; a pair's two blocks see the same load. Also the median seconds of each."""
    t_a, t_b = [], []
    for r in range(rounds):
        for fn, acc in ((a, t_a), (b, t_b)) if r % 2 == 0 else ((b, t_b), (a, t_a)):
            acc.append(timed(fn, steps))
    ratio = statistics.median(x / y for x, y in zip(t_a, t_b))
    return ratio, statistics.median(t_a), statistics.median(t_b)


def child(mode: str, steps: int) -> None:
    cfg = smoke_config()
    batches = fixed_batches(cfg, steps)
    setup = engine.build_setup(cfg)
    fn = enlace_loop(setup, batches) if mode == "enlace" else bare_loop(cfg, setup.raw_model, batches)
    fn(steps)
    print(json.dumps({"peak_rss_mib": mib(peak_rss_bytes())}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=12)  # 4 rounds swung 0.93-1.02 on the loaded machine
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.steps)

    cfg = smoke_config()
    batches = fixed_batches(cfg, args.steps)
    setup = engine.build_setup(cfg)  # one model: both loops train the same weights in turn
    bare, ours = bare_loop(cfg, setup.raw_model, batches), enlace_loop(setup, batches)
    bare(3), ours(3)  # warm-up: optimizer state is created lazily
    ratio, t_bare, t_ours = paired_ratio(bare, ours, args.steps, args.rounds)
    tokens = args.steps * cfg.training.batch_size * cfg.model.seq_len
    mem = {
        m: json.loads(
            subprocess.run(
                [sys.executable, __file__, "--child", m, "--steps", str(args.steps)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )["peak_rss_mib"]
        for m in ("bare", "enlace")
    }
    print(f"smoke-cpu model, {torch.get_num_threads()} threads, {args.steps} steps x {args.rounds} rounds")
    print("  (tokens/s: each loop's median block; the ratio: the median of the paired blocks' ratios)")
    print(f"  bare PyTorch loop : {tokens / t_bare:9.0f} tokens/s   peak RSS {mem['bare']:7.1f} MiB")
    print(f"  enlace train_step : {tokens / t_ours:9.0f} tokens/s   peak RSS {mem['enlace']:7.1f} MiB")
    print(f"  throughput ratio enlace/bare = {ratio:.3f}  (goal >= 0.98; median of {args.rounds} paired blocks)")
    print(f"  peak RSS ratio   enlace/bare = {mem['enlace'] / mem['bare']:.3f}  (goal <= 1.00)")
    against_nanogpt_style(cfg, args.steps, args.rounds, tokens)
    added_per_step()


def against_nanogpt_style(cfg, steps: int, rounds: int, tokens: int) -> None:
    from enlace.data import build_stream
    from enlace.data.bytestream import resolve_paths

    files = resolve_paths(cfg.data.paths, cfg.root)
    with tempfile.TemporaryDirectory() as tmp:
        train_bin = Path(tmp) / "train.bin"  # the same bytes, concatenated as nanoGPT's prepare.py would
        with open(train_bin, "wb") as out:
            for f in files:
                out.write(f.read_bytes())
        nano = nano_loop(cfg, train_bin)
        torch.manual_seed(cfg.runtime.seed)
        setup = engine.build_setup(cfg)
        ours = enlace_stream_loop(setup, build_stream(cfg, "train", cfg.training.batch_size))
        nano(3), ours(3)
        ratio, t_nano, t_ours = paired_ratio(nano, ours, steps, rounds)
    print(f"same bytes ({sum(f.stat().st_size for f in files)} B: the smoke corpus, {len(files)} files):")
    print(f"  nanoGPT-style loop : {tokens / t_nano:9.0f} tokens/s")
    print(f"  enlace stream+step : {tokens / t_ours:9.0f} tokens/s")
    print(f"  throughput ratio enlace/nanoGPT-style = {ratio:.3f}  (goal >= 0.95; median of {rounds} paired blocks)")


def added_per_step(steps: int = 200, rounds: int = 20) -> None:
    tiny = smoke_config(
        "model.d_model=8", "model.n_layer=1", "model.n_head=1", "model.seq_len=8", "training.batch_size=1"
    )
    batches = fixed_batches(tiny, steps)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        setup = engine.build_setup(tiny)
        bare, ours = bare_loop(tiny, setup.raw_model, batches), enlace_loop(setup, batches)
        bare(5), ours(5)
        _, t_bare, t_ours = paired_ratio(bare, ours, steps, rounds)
    finally:
        torch.set_num_threads(threads)
    added_us = (t_ours - t_bare) / steps * 1e6
    print(
        f"what enlace's step adds (a {setup.settings['params']}-parameter model, 1 thread, {rounds} x {steps} steps):"
    )
    print(
        f"  bare {t_bare / steps * 1e6:.0f} us/step, enlace {t_ours / steps * 1e6:.0f} us/step: {added_us:+.0f} us per step"
    )


if __name__ == "__main__":
    main()
