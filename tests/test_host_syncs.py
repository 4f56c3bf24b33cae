"""A training step's host syncs: each read of a device tensor from the host (`.item()`, `.tolist()`, `.cpu()`,
`bool()`, `float()`) makes the CPU wait for the GPU instead of queuing the next kernels. Counted here on the CPU
by instrumenting those reads (the same calls sync on a GPU; no GPU is needed to count them): an fp16 step
makes one (GradScaler's own inf/NaN check), an fp32 step none, and reading the step's figures on a logging
step still gives the scale and the skip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.configs import write_run

from enlace.config.schema import load_config
from enlace.train import engine

READS = ("item", "tolist", "cpu", "__bool__", "__float__")


class HostReads:
    """Counts host reads of tensors, leaving out the optimizer's `step` counters: torch keeps those on the CPU
    for its non-fused AdamW (reading one makes no GPU wait), and every parameter's is read each step."""

    def __init__(self, monkeypatch):
        self.count, self.cpu_resident = 0, set()
        for name in READS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                if id(tensor) not in self.cpu_resident:
                    self.count += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)

    def leave_out_step_counters(self, optimizer) -> None:
        self.cpu_resident = {id(state["step"]) for state in optimizer.state.values() if "step" in state}


@pytest.fixture
def host_reads(monkeypatch) -> HostReads:
    return HostReads(monkeypatch)


@pytest.mark.parametrize("precision, at_most", [("fp16", 1), ("fp32", 0)])
def test_a_step_reads_the_device_at_most_once(project, host_reads, precision, at_most):
    write_run(project, "syncs", runtime={"device": "cpu", "precision": precision})
    setup = engine.build_setup(load_config("syncs", [], root=project))
    x = torch.randint(0, 256, (2, 8))
    engine.train_step(setup, 0, lambda: (x, x))  # the first step builds the optimizer's state
    host_reads.leave_out_step_counters(setup.optimizer)
    before = host_reads.count
    for step in range(1, 4):
        engine.train_step(setup, step, lambda: (x, x))
    assert (host_reads.count - before) / 3 <= at_most


def test_a_skipped_fp16_step_is_still_said_when_its_figures_are_read(project):
    """A scale so large that the gradients overflow: the step is skipped and the scale halved, as GradScaler
    decides; the figures are read from the device only when asked for."""
    write_run(project, "skip", runtime={"device": "cpu", "precision": "fp16", "fp16_init_scale": 1e30})
    setup = engine.build_setup(load_config("skip", [], root=project))
    x = torch.randint(0, 256, (2, 8))
    result = engine.train_step(setup, 0, lambda: (x, x))
    assert result.skipped and result.scale == pytest.approx(0.5e30)
    assert result.scale == setup.scaler.get_scale()
    write_run(project, "plain", runtime={"device": "cpu", "precision": "fp32"})
    plain = engine.train_step(engine.build_setup(load_config("plain", [], root=project)), 0, lambda: (x, x))
    assert not plain.skipped and plain.scale == 1.0


def _ddp_rank(rank: int, store: str, root: str, deterministic: bool, out: str) -> None:
    """One of two gloo ranks: three fp16 steps after the first, each with the loop's stop flag, reads counted."""
    import torch.distributed as torch_dist

    from enlace.train.dist import Dist

    torch_dist.init_process_group("gloo", store=torch_dist.FileStore(store, 2), rank=rank, world_size=2)
    cfg = load_config("ddp-syncs", [f"runtime.deterministic={str(deterministic).lower()}"], root=Path(root))
    dist = Dist(rank=rank, world=2)
    setup = engine.build_setup(cfg, dist)
    x = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(rank))
    engine.train_step(setup, 0, lambda: (x, x))
    with pytest.MonkeyPatch.context() as mp:
        reads = HostReads(mp)
        reads.leave_out_step_counters(setup.optimizer)
        flag_reads = 0
        for step in range(1, 4):
            engine.train_step(setup, step, lambda: (x, x))
            before = reads.count
            dist.any_rank(False)
            flag_reads += reads.count - before
    Path(out, f"rank{rank}").write_text(f"{reads.count - flag_reads} {flag_reads}")
    torch_dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("deterministic", [False, True], ids=["ddp-reducer", "fixed-layout-average"])
def test_a_ddp_step_reads_the_device_at_most_once(project, tmp_path, deterministic):
    """Two real gloo ranks: DDP's reducer (no_sync, buckets) or deterministic mode's own gradient average adds no
    host read to an fp16 step (one: GradScaler's check). The stop flag is read once a step, counted apart: that
    it is a CPU tensor on a card too (so its read makes no GPU wait) only a stand-in nccl group can show, in
    test_gpu_path.py; here every tensor is on the CPU."""
    import torch.multiprocessing as mp

    write_run(project, "ddp-syncs", runtime={"device": "cpu", "precision": "fp16"})
    args = (str(tmp_path / "store"), str(project), deterministic, str(tmp_path))
    mp.spawn(_ddp_rank, args=args, nprocs=2, join=True)
    for rank in (0, 1):
        step_reads, flag_reads = map(int, (tmp_path / f"rank{rank}").read_text().split())
        assert step_reads / 3 <= 1 and flag_reads == 3, (rank, step_reads, flag_reads)
