"""enlace's AdamW against torch.optim.AdamW: the same bytes step by step, through GradScaler and through
state_dict in both directions; and the reason it exists (no torch._dynamo import) held in a fresh process."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch
from support import REPO

from enlace.config.schema import ModelConfig, OptimConfig
from enlace.train.model import ByteGPT
from enlace.train.optim import AdamW, build_optimizer

OPTIM = OptimConfig(learning_rate=3e-3, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8)


def _model() -> ByteGPT:
    torch.manual_seed(0)
    return ByteGPT(ModelConfig(seq_len=16, n_layer=1, n_head=2, d_model=16, dropout=0.0))


def _torch_adamw(model: torch.nn.Module, deterministic: bool) -> torch.optim.AdamW:
    """What build_optimizer built before enlace kept its own optimizer state."""
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": OPTIM.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    pinned = {"foreach": True, "fused": False} if deterministic else {}
    return torch.optim.AdamW(groups, lr=OPTIM.learning_rate, betas=(OPTIM.beta1, OPTIM.beta2), eps=OPTIM.eps, **pinned)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, 256, (4, 17), generator=g)
    return x[:, :-1], x[:, 1:]


def _step(model, opt, scaler, step: int, poison: bool = False) -> None:
    """train_step's order: scaled backward, unscale, clip, scaler step, update, zero_grad."""
    for group in opt.param_groups:
        group["lr"] = OPTIM.learning_rate * (step + 1) / 5
    _, loss = model(*_batch(step))
    scaler.scale(loss).backward()
    if poison:  # an overflowed fp16 step: the scaler must skip it in both
        next(model.parameters()).grad.view(-1)[0] = float("inf")
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _weights(model: torch.nn.Module) -> bytes:
    return _saved(model.state_dict())


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("scaled", [False, True])
def test_each_step_and_the_state_dict_are_torch_adamws_bytes(deterministic, scaled):
    ours_model, theirs_model = _model(), _model()
    ours = build_optimizer(ours_model, OPTIM, deterministic)
    theirs = _torch_adamw(theirs_model, deterministic)
    scalers = [torch.amp.GradScaler("cpu", enabled=scaled, init_scale=2.0**10) for _ in range(2)]
    for step in range(6):
        poison = scaled and step == 2
        _step(ours_model, ours, scalers[0], step, poison)
        _step(theirs_model, theirs, scalers[1], step, poison)
        assert _weights(ours_model) == _weights(theirs_model), f"weights differ after step {step}"
        assert _saved(ours.state_dict()) == _saved(theirs.state_dict()), f"state differs after step {step}"
    assert scalers[0].state_dict() == scalers[1].state_dict()
    if scaled:  # the poisoned step was skipped: 5 updates, not 6
        assert ours.state_dict()["state"][0]["step"].item() == 5.0


@pytest.mark.parametrize("direction", ["torch into enlace", "enlace into torch"])
def test_a_state_dict_moves_between_the_two_and_training_goes_on_identically(direction):
    """Checkpoints written before enlace kept its own optimizer state still resume, bit for bit."""
    first_model = _model()
    first = (
        _torch_adamw(first_model, True)
        if direction == "torch into enlace"
        else build_optimizer(first_model, OPTIM, True)
    )
    off = torch.amp.GradScaler("cpu", enabled=False)
    for step in range(3):
        _step(first_model, first, off, step)
    saved = torch.load(
        io.BytesIO(_saved({"model": first_model.state_dict(), "opt": first.state_dict()})), weights_only=True
    )

    second_model = _model()
    second_model.load_state_dict(saved["model"])
    second = (
        build_optimizer(second_model, OPTIM, True)
        if direction == "torch into enlace"
        else _torch_adamw(second_model, True)
    )
    second.load_state_dict(saved["opt"])
    assert _saved(second.state_dict()) == _saved(first.state_dict())
    for step in range(3, 6):
        _step(first_model, first, off, step)
        _step(second_model, second, off, step)
    assert _weights(second_model) == _weights(first_model)
    assert _saved(second.state_dict()) == _saved(first.state_dict())


def test_deterministic_runs_step_with_foreach_bit_for_bit_the_single_tensor_loop():
    """The implementation each run takes (optim.implementation), and the reason deterministic mode may take
    foreach: on the CPU its bytes are the single-tensor loop's, step by step. Fused is CUDA's, for the runs
    that are not deterministic (no CUDA here: the choice is checked, not stepped)."""
    from enlace.train.optim import implementation

    assert implementation(True, "cuda") == implementation(True, "cpu") == {"foreach": True, "fused": False}
    assert implementation(False, "cuda") == {"foreach": False, "fused": True}
    assert implementation(False, "cpu") == {}
    models = [_model(), _model()]
    opts = [build_optimizer(m, OPTIM, True) for m in models]
    for group in opts[1].param_groups:  # the same groups, stepped by the single-tensor loop
        group["foreach"] = False
    off = torch.amp.GradScaler("cpu", enabled=False)
    for step in range(6):
        for model, opt in zip(models, opts):
            _step(model, opt, off, step)
        assert _weights(models[0]) == _weights(models[1]), f"foreach and the loop differ after step {step}"


def test_a_state_dict_for_another_parameter_layout_is_refused():
    opt = build_optimizer(_model(), OPTIM, True)
    other = AdamW([{"params": [torch.zeros(2, requires_grad=True)]}], lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    with pytest.raises(ValueError, match="parameter-group layout"):
        opt.load_state_dict(other.state_dict())


def test_building_and_stepping_it_leaves_torch_dynamo_unimported():
    """The reason the class exists: torch.optim.Optimizer imports torch._dynamo in every process that
    builds one. Shown on a fresh interpreter, where nothing else has imported it."""
    code = (
        "import sys, torch\n"
        "from enlace.config.schema import OptimConfig\n"
        "from enlace.train.optim import build_optimizer\n"
        "m = torch.nn.Linear(4, 4)\n"
        "opt = build_optimizer(m, OptimConfig(), True)\n"
        "m(torch.ones(2, 4)).sum().backward(); opt.step(); opt.zero_grad(); opt.state_dict()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
