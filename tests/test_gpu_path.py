"""The GPU path's decisions, tested on the CPU. No GPU is here: where a line needs CUDA, the test stands in
for the device (monkeypatched torch.cuda or torch.distributed, said in each test) and checks the decision
that leads to the CUDA call — the device a tensor is put on, the verdict an OutOfMemoryError becomes, the
RNG state a checkpoint restores, the precision a card is refused."""

from __future__ import annotations

import sys

import pytest
import torch
from support import REPO
from support.cli import enlace
from support.configs import DETERMINISTIC, write_run

from enlace.config.machine import check_environment
from enlace.config.schema import load_config
from enlace.errors import ConfigError
from enlace.preflight import maxbatch
from enlace.preflight.measure import preflight
from enlace.train import determinism, engine
from enlace.train.dist import Dist


def test_the_stop_flag_goes_through_gloo_beside_nccl(monkeypatch):
    """The stop flag is all-reduced every step. Under nccl a flag on the GPU crashed when made on the CPU
    (finding 1) and, made on the GPU, its read-back waited for every queued kernel (a host sync a step): it is
    a CPU tensor in a gloo group made beside nccl at the first flag, once per process group: a Dist made after the
    process group exists (preflight's in-process --max-batch probes) shares it, and a new process group gets its
    own. Stands in for a GPU: nccl cannot run here, so the process group calls are recorded, not run."""
    import enlace.train.dist as dist_module

    groups, made, reduced = [], [], []
    monkeypatch.setattr(dist_module.torch_dist, "is_initialized", lambda: bool(groups))
    monkeypatch.setattr(dist_module.torch_dist, "init_process_group", groups.append)
    monkeypatch.setattr(dist_module.torch_dist, "get_backend", lambda: groups[0])
    monkeypatch.setattr(dist_module.torch_dist, "new_group", lambda backend: made.append(backend) or len(made))
    monkeypatch.setattr(dist_module.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist_module.torch_dist, "all_reduce", lambda t, op, group: reduced.append((t.device, group)))
    monkeypatch.setattr(dist_module.torch_dist, "destroy_process_group", groups.clear)
    monkeypatch.setattr(dist_module, "_flag_group", [])
    first = Dist(rank=1, world=2, local_rank=1)
    first.init("cuda")
    first.any_rank(True)
    first.any_rank(False)
    probe = Dist(rank=1, world=2, local_rank=1)
    probe.init("cuda")  # the process group exists: this Dist joins no new one, and shares its flag group
    probe.any_rank(False)
    assert groups == ["nccl"] and made == ["gloo"]
    cpu = torch.device("cpu")
    assert reduced == [(cpu, 1), (cpu, 1), (cpu, 1)]
    probe.close()  # the process group and its flag group go; the next one makes its own
    again = Dist(rank=1, world=2, local_rank=1)
    again.init("cuda")
    again.any_rank(False)
    assert made == ["gloo", "gloo"] and reduced[-1] == (cpu, 2)
    again.close()
    groups.append("gloo")  # a CPU run: gloo already moves CPU tensors, the default group carries the flag
    Dist(rank=1, world=2, local_rank=1).any_rank(False)
    assert made == ["gloo", "gloo"] and reduced[-1] == (cpu, None)


def _oom_in_backward(setup, step, next_batch, phase):
    """train_step as on a card that is full: forward runs, backward raises CUDA's OutOfMemoryError."""
    phase("forward")
    next_batch()
    phase("backward")
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 5.79 GiB total capacity)")


def test_an_out_of_memory_error_from_backward_is_the_oom_verdict(project, monkeypatch):
    """Finding 2: only `.item` ran inside the memory watch, so an OutOfMemoryError raised by forward or backward
    on CUDA escaped preflight (and --max-batch's in-process probe). Stands in for a full GPU."""
    write_run(project, "fit")
    monkeypatch.setattr(engine, "train_step", _oom_in_backward)
    report = preflight(load_config("fit", root=project), steps=2)
    assert report["verdict"] == "oom" and report["oom_phase"] == "backward", report
    assert "Tried to allocate" in report["oom_detail"]
    monkeypatch.setattr(maxbatch, "_probes_fork", lambda cfg: False)  # probes run in-process, as on CUDA
    cfg = load_config("fit", root=project)
    assert maxbatch.probe(cfg, "fit", ["training.batch_size=64"], None)["verdict"] == "oom"


def test_a_users_cublas_workspace_config_that_is_not_deterministic_is_refused(project, monkeypatch):
    """Finding 3: setdefault kept a user's :0:0, under which deterministic cuBLAS raises at the first GEMM."""
    write_run(project, "det", **DETERMINISTIC)
    out = enlace(project, "train", "det", check=False, env={"CUBLAS_WORKSPACE_CONFIG": ":0:0"}, fresh=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "CUBLAS_WORKSPACE_CONFIG: ':0:0' does not make cuBLAS deterministic" in out.stderr, out.stderr
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert determinism.ensure_cublas_workspace() == ":4096:8"


def test_bf16_on_a_card_below_ampere_is_refused(project, monkeypatch):
    """Finding 4: is_bf16_supported() is True on an RTX 2060 (7.5) through emulation. Stands in for that card."""
    write_run(project, "half", runtime={"precision": "bf16", "device": "auto"})
    cfg = load_config("half", root=project)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 2060")
    with pytest.raises(ConfigError, match=r"compute capability 7\.5\) is emulated") as e:
        check_environment(cfg)
    assert "runtime.precision" in e.value.message and "fp16" in e.value.message
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    check_environment(cfg)  # an Ampere card: fine


def test_bf16_is_judged_on_the_runs_own_card(project, monkeypatch):
    """A torchrun rank runs on cuda:LOCAL_RANK: the check read the current card (0) instead. Stands in for a
    machine with an Ampere card 0 and a Turing card 1 (recorded calls, no GPU)."""
    write_run(project, "half", runtime={"precision": "bf16", "device": "auto"})
    cfg = load_config("half", root=project)
    cards = {0: (8, 6), 1: (7, 5)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cards[device or 0])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"card {device or 0}")
    check_environment(cfg)  # rank 0's card: Ampere
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ConfigError, match=r"bf16 on card 1 \(compute capability 7\.5\)"):
        check_environment(cfg)


def test_a_checkpoint_from_an_8_gpu_node_resumes_where_1_gpu_is_visible(monkeypatch):
    """Finding 5: checkpoints held get_rng_state_all() (8 states on an 8-GPU node) and set_rng_state_all
    indexed devices a 1-GPU task does not have. Stands in for CUDA: the RNG calls are recorded."""
    state = determinism.rng_state()
    states = [torch.full((16,), i, dtype=torch.uint8) for i in range(8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: pytest.fail("indexes every saved device"))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device="cuda": restored.append(s))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CUDA run: its RNG is restored
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    determinism.set_rng_state({**state, "cuda": states})  # an older checkpoint: one state per visible device
    determinism.set_rng_state({**state, "cuda": [states[3]]})  # this format: the process's own device only
    assert [int(s[0]) for s in restored] == [0, 3]
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": states[5])
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("saves every device's state"))
    assert determinism.rng_state()["cuda"] == [states[5]]


def test_verify_resume_runs_one_trainer_at_a_time_on_a_gpu_and_gpu_check_keeps_dropout(project):
    """Finding 7: two trainers and two CUDA contexts at once on a 6 GiB card; and gpu_check's resume forced
    dropout 0, so the CUDA RNG restore was never exercised."""
    from enlace.preflight.verify_resume import side_by_side

    write_run(project, "gpu", runtime={"device": "cuda"})
    write_run(project, "cpu", runtime={"device": "cpu"})
    assert side_by_side(load_config("cpu", root=project))
    assert not side_by_side(load_config("gpu", root=project))
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import gpu_sections
    finally:
        sys.path.remove(str(REPO / "bench"))
    for device in ("cuda", "cpu"):
        assert not any("dropout" in o for o in gpu_sections.runs_for(device)[2])


def test_no_sync_finds_ddp_inside_torch_compile(tmp_path):
    """train_step skips DDP's all-reduce on all but the last micro-step with `no_sync`; under compile the model
    it holds is torch.compile's wrapper around the DDP, which an isinstance check missed (every micro-step
    all-reduced). A one-process gloo group and an uncompiled wrapper (nothing runs): the decision is shown."""
    import torch.distributed as torch_dist

    from enlace.train.engine import ddp_of

    store = torch_dist.FileStore(str(tmp_path / "store"), 1)
    torch_dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
        assert ddp_of(ddp) is ddp
        assert ddp_of(torch.compile(ddp)) is ddp
        assert ddp_of(torch.nn.Linear(2, 2)) is None
    finally:
        torch_dist.destroy_process_group()


def test_max_batch_aims_at_the_memory_the_run_may_use_not_the_cards_total(monkeypatch):
    """--max-batch aims each probe where the fitted peaks extrapolate to the memory cap. On a shared card the
    cap is what this run may use (free plus its own), not the card's total: aimed at 80 GiB when 40 are usable,
    probes overshoot and bisect back. Stands in for a GPU: a probe's peak is 1000 MiB + 10 MiB a sample, and it
    fits within 40,000 MiB (the real probes run the trainer; preflight's own tests cover them on the CPU)."""
    from enlace.preflight import maxbatch

    def fake_probe(cfg, run, overrides, memory_limit):
        b = int(overrides[-1].split("=")[1])
        peak = 1000 + 10 * b
        return {"verdict": "ok" if peak <= 40_000 else "oom", "memory": {"kind": "cuda", "peak_reserved_mib": peak}}

    monkeypatch.setattr(maxbatch, "probe", fake_probe)
    cfg = type("Cfg", (), {"training": type("T", (), {"batch_size": 64})()})()

    def search(memory: dict) -> dict:
        measured = {"verdict": "ok", "memory": {"kind": "cuda", "peak_reserved_mib": 1640, **memory}}
        return maxbatch.find_max_batch(cfg, "r", [], None, measured, lambda _: None, cap=8192)

    usable = search({"total_mib": 80_000, "usable_mib": 40_000})
    total = search({"total_mib": 80_000})  # what the aim saw before: the card's total
    assert usable["batch_size"] == total["batch_size"] == 3840  # the largest multiple of the resolution that fits
    assert usable["probes"] < total["probes"]
