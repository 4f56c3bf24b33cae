"""tokens/s of enlace's training step, in the same process, steps interleaved (the machine is noisy):

1. vs a bare PyTorch loop over the same model and the same batches (the step's own overhead);
   peak RSS of each and the steps' growth of it, medians of 5 child processes. Goal: ratio >= 0.98, RSS no higher.
2. vs a nanoGPT-style script written here (its own model class of the same shape, a memmapped
   train.bin of the same smoke-corpus bytes, random offsets per step, AdamW, clipping, cosine lr),
   enlace reading the same bytes through its data stream: a regression in enlace's model, data
   path or step shows here even when (1) does not. Goal: ratio >= 0.95.
3. what enlace's step adds in absolute terms: per-step time of both loops on a model so small (and on one
   thread) that the step is all overhead; in µs, what a regression of the step itself would move.

The two loops take turns step by step (A B B A ...), each step timed; a ratio is the median, over the
pairs of neighbouring steps, of time(baseline step) / time(enlace step). Timed in blocks of steps
instead, unchanged code read differently from run to run: the host stalls single steps now and then,
and a block's time carries every stall in it; a stall moves one pair of steps here, and the median
drops it (the figures of both ways: docs/benchmarks.md).

    python bench/step_overhead.py [--steps 360]
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
from enlace.sysinfo import mib, peak_rss_bytes, reset_peak_rss
from enlace.train import engine


def plain_update(loss, model, opt) -> None:
    """backward, clip to 1.0, AdamW step, free the grads: what both plain loops do after the forward."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def bare_loop(model, batches):
    """Step i: the forward on batches[i % len], then plain_update. Its own AdamW (the same weights)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)

    def step(i):
        x, y = batches[i % len(batches)]
        _, loss = model(x, y)
        plain_update(loss, model, opt)

    return step


def enlace_loop(setup, next_batch):
    """Step i: engine.train_step, the trainer's own, with batches from next_batch(i)."""

    def step(i):
        engine.train_step(setup, i, lambda: next_batch(i))

    return step


def both_loops(setup, batches):
    """The bare loop and enlace's over the same model, step i of each on batches[i % len]."""
    return bare_loop(setup.raw_model, batches), enlace_loop(setup, lambda i: batches[i % len(batches)])


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
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def nano_loop(cfg, train_bin: Path):
    """nanoGPT's train.py shape: get_batch from a memmap at random offsets, lr set every step."""
    m, t, o = cfg.model, cfg.training, cfg.optim
    model = NanoGPT(256, m.seq_len, m.d_model, m.n_layer, m.n_head)
    params = list(model.parameters())  # nanoGPT's configure_optimizers: decay matrices, not norms
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=o.learning_rate, betas=(0.9, 0.95))

    def get_batch():
        data = np.memmap(train_bin, dtype=np.uint8, mode="r")  # re-opened per batch, as nanoGPT does
        ix = torch.randint(len(data) - m.seq_len - 1, (t.batch_size,))
        x = torch.stack([torch.from_numpy(data[i : i + m.seq_len].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + m.seq_len].astype(np.int64)) for i in ix])
        return x, y

    def step(it):
        lr = o.min_lr + 0.5 * (o.learning_rate - o.min_lr) * (1 + math.cos(math.pi * min(it / t.max_steps, 1)))
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = get_batch()
        loss = model(x, y)
        plain_update(loss, model, opt)

    return step


def interleaved(base, ours, steps: int) -> tuple[float, float, float, float]:
    """Throughput of `ours` over `base`: both run `steps` steps, taking turns in the order A B B A
    (neither always goes first), each step timed. Returns the median over neighbouring pairs of
    time(base) / time(ours), the median seconds per step of each, and sum(base) / sum(ours): the
    ratio with every stall in it, where a cost enlace paid only on some steps would show."""
    t_base, t_ours = [], []
    for i in range(steps):
        turns = ((base, t_base), (ours, t_ours)) if i % 4 in (0, 3) else ((ours, t_ours), (base, t_base))
        for fn, acc in turns:
            t0 = time.perf_counter()
            fn(i)
            acc.append(time.perf_counter() - t0)
    ratio = statistics.median(b / o for b, o in zip(t_base, t_ours))
    return ratio, statistics.median(t_base), statistics.median(t_ours), sum(t_base) / sum(t_ours)


def child(mode: str, steps: int) -> None:
    cfg = smoke_config()
    batches = fixed_batches(cfg, steps)
    setup = engine.build_setup(cfg)
    step = both_loops(setup, batches)[mode == "enlace"]
    reset_peak_rss()
    before = peak_rss_bytes()  # just reset: the current RSS, torch and the model loaded
    for i in range(steps):
        step(i)
    print(json.dumps({"peak_rss_mib": mib(peak_rss_bytes()), "steps_mib": mib(peak_rss_bytes() - before)}))


def rss_medians(modes, runs: int) -> dict[str, dict[str, float]]:
    """Each mode's peak RSS and the steps' own growth of it (MiB), the medians of `runs` child processes
    taking turns: one child's figures moved by 1 % and 5 % between runs of the same code."""
    seen: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(runs):
        for m in modes:
            cmd = [sys.executable, __file__, "--child", m]
            seen[m].append(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout))
    return {m: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for m, rows in seen.items()}


def warm(*loops) -> None:
    """Three steps of each first: optimizer state is created lazily."""
    for i in range(3):
        for step in loops:
            step(i)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=360, help="steps of each loop, in (1) and (2)")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(args.child, 30)
    # Subnormal floats flush to zero, in every loop, set before torch starts its worker threads (they
    # inherit it): unflushed, the nanoGPT-style loop drifted slower over the run while enlace's did not,
    # and (2) read the baseline's drift, which could hide a regression (docs/benchmarks.md).
    torch.set_flush_denormal(True)

    cfg = smoke_config()
    batches = fixed_batches(cfg, 30)
    setup = engine.build_setup(cfg)  # one model: both loops train the same weights in turn
    bare, ours = both_loops(setup, batches)
    warm(bare, ours)
    ratio, t_bare, t_ours, totals = interleaved(bare, ours, args.steps)
    tokens = cfg.training.batch_size * cfg.model.seq_len  # per step
    mem = rss_medians(("bare", "enlace"), runs=5)
    print(f"smoke-cpu model, {torch.get_num_threads()} threads, {args.steps} steps of each loop, interleaved")
    print("  (tokens/s: each loop's median step; the ratio: the median over neighbouring pairs of steps)")
    print(
        f"  bare PyTorch loop : {tokens / t_bare:9.0f} tokens/s   peak RSS {mem['bare']['peak_rss_mib']:6.1f} MiB, the steps' own {mem['bare']['steps_mib']:5.1f} MiB"
    )
    print(
        f"  enlace train_step : {tokens / t_ours:9.0f} tokens/s   peak RSS {mem['enlace']['peak_rss_mib']:6.1f} MiB, the steps' own {mem['enlace']['steps_mib']:5.1f} MiB"
    )
    print(f"  throughput ratio enlace/bare = {ratio:.3f}  (goal >= 0.98; of the summed step times {totals:.3f})")
    peak, own = (mem["enlace"][k] / mem["bare"][k] for k in ("peak_rss_mib", "steps_mib"))
    print(
        f"  peak RSS ratio   enlace/bare = {peak:.3f}, of the steps' own growth {own:.3f}  (goal <= 1.00; medians of 5)"
    )
    against_nanogpt_style(cfg, args.steps, tokens)
    added_per_step()


def against_nanogpt_style(cfg, steps: int, tokens: int) -> None:
    from enlace.data.paths import resolve_paths
    from enlace.data.streams import build_stream

    files = resolve_paths(cfg.data.paths, cfg.root)
    with tempfile.TemporaryDirectory() as tmp:
        train_bin = Path(tmp) / "train.bin"  # the same bytes, concatenated as nanoGPT's prepare.py would
        with open(train_bin, "wb") as out:
            for f in files:
                out.write(f.read_bytes())
        nano = nano_loop(cfg, train_bin)
        torch.manual_seed(cfg.runtime.seed)
        setup = engine.build_setup(cfg)
        stream = build_stream(cfg, "train", cfg.training.batch_size)
        ours = enlace_loop(setup, lambda i: stream.next_batch())
        warm(nano, ours)
        ratio, t_nano, t_ours, totals = interleaved(nano, ours, steps)
    print(f"same bytes ({sum(f.stat().st_size for f in files)} B: the smoke corpus, {len(files)} files):")
    print(f"  nanoGPT-style loop : {tokens / t_nano:9.0f} tokens/s")
    print(f"  enlace stream+step : {tokens / t_ours:9.0f} tokens/s")
    print(
        f"  throughput ratio enlace/nanoGPT-style = {ratio:.3f}  (goal >= 0.95; of the summed step times {totals:.3f})"
    )


def added_per_step(steps: int = 4000) -> None:
    tiny = smoke_config(
        "model.d_model=8", "model.n_layer=1", "model.n_head=1", "model.seq_len=8", "training.batch_size=1"
    )
    batches = fixed_batches(tiny, 200)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        setup = engine.build_setup(tiny)
        bare, ours = both_loops(setup, batches)
        warm(bare, ours)
        _, t_bare, t_ours, _ = interleaved(bare, ours, steps)
    finally:
        torch.set_num_threads(threads)
    print(f"what enlace's step adds (a {setup.settings['params']}-parameter model, 1 thread, {steps} steps of each):")
    print(
        f"  bare {t_bare * 1e6:.0f} us/step, enlace {t_ours * 1e6:.0f} us/step: {(t_ours - t_bare) * 1e6:+.0f} us per step"
    )


if __name__ == "__main__":
    main()
