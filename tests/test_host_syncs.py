"""A training step's host syncs: each read of a device tensor from the host (`.item()`, `.tolist()`, `.cpu()`,
`bool()`, `float()`) makes the CPU wait for the GPU instead of queuing the next kernels. Counted here on the CPU
by instrumenting those reads (the same calls sync on a GPU; no GPU is needed to count them): an fp16 step
makes one (GradScaler's own inf/NaN check), an fp32 step none, and reading the step's figures on a logging
step still gives the scale and the skip."""

from __future__ import annotations

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
