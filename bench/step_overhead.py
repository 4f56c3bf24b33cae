"""tokens/s of enlace's training step vs a bare PyTorch loop: same model, same batches, same
process, interleaved blocks (the machine is noisy). Peak RSS of each, measured in its own
child process. Goal: ratio >= 0.98 and enlace's peak RSS no higher than the bare loop's.

    python bench/step_overhead.py [--steps 30] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from _common import fixed_batches, smoke_config
from enlace import engine
from enlace.sysinfo import mib, peak_rss_bytes


def bare_loop(cfg, model, batches):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)

    def run(steps):
        for x, y in batches[:steps]:
            _, loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss.item()

    return run


def enlace_loop(setup, batches):
    def run(steps):
        it = iter(batches[:steps])
        for step in range(steps):
            r = engine.train_step(setup, step, lambda: next(it))
        return r.loss.item()

    return run


def timed(fn, steps):
    t0 = time.perf_counter()
    fn(steps)
    return time.perf_counter() - t0


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
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.steps)

    cfg = smoke_config()
    batches = fixed_batches(cfg, args.steps)
    setup = engine.build_setup(cfg)  # one model: both loops train the same weights in turn
    bare, ours = bare_loop(cfg, setup.raw_model, batches), enlace_loop(setup, batches)
    bare(3), ours(3)  # warm-up: optimizer state is created lazily
    t_bare, t_ours = [], []
    for _ in range(args.rounds):
        t_bare.append(timed(bare, args.steps))
        t_ours.append(timed(ours, args.steps))
    tokens = args.steps * cfg.training.batch_size * cfg.model.seq_len
    tps_bare, tps_ours = tokens / statistics.median(t_bare), tokens / statistics.median(t_ours)
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
    print(f"  bare PyTorch loop : {tps_bare:9.0f} tokens/s   peak RSS {mem['bare']:7.1f} MiB")
    print(f"  enlace train_step : {tps_ours:9.0f} tokens/s   peak RSS {mem['enlace']:7.1f} MiB")
    print(f"  throughput ratio enlace/bare = {tps_ours / tps_bare:.3f}  (goal >= 0.98)")
    print(f"  peak RSS ratio   enlace/bare = {mem['enlace'] / mem['bare']:.3f}  (goal <= 1.00)")


if __name__ == "__main__":
    main()
