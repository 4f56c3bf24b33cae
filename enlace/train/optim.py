"""Optimizer and learning-rate schedule (a pure function of the step: the schedule's whole state)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim.adam import adam

from enlace.config.schema import OptimConfig


def lr_at(step: int, o: OptimConfig, max_steps: int) -> float:
    """Linear warmup to learning_rate over warmup_steps, then cosine decay to min_lr at max_steps."""
    if step < o.warmup_steps:
        return o.learning_rate * (step + 1) / o.warmup_steps
    span = max(1, max_steps - o.warmup_steps)
    progress = min(1.0, (step - o.warmup_steps) / span)
    return o.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (o.learning_rate - o.min_lr)


class AdamW:
    """torch.optim.AdamW's arithmetic and state_dict format, without torch.optim.Optimizer's machinery.

    `step` calls `torch.optim.adam.adam` (the function torch.optim.AdamW.step calls) with the same
    arguments; the parameter groups and the per-parameter state (step, exp_avg, exp_avg_sq) are kept as
    torch keeps them, so a checkpoint's optimizer.pt loads into either class. Why not torch.optim.AdamW itself:
    every torch.optim.Optimizer imports torch._dynamo when built and when stepped, which costs each
    trainer, preflight and rank as much start-up CPU as torch's own import. tests/test_optim.py holds
    this class to torch.optim.AdamW's bytes, step by step, through GradScaler and through state_dict.

    Supported: what enlace asks of it: floats for lr and betas, no amsgrad, no capturable, no closure.
    `foreach`/`fused` None lets torch pick per device, as torch.optim.AdamW does. GradScaler unscales the
    gradients before `step()` (no `_step_supports_amp_scaling`), as for torch's non-fused AdamW."""

    def __init__(
        self,
        groups: list[dict[str, Any]],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        foreach: bool | None = None,
        fused: bool | None = None,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": 1e-2,
            "amsgrad": False,
            "maximize": False,
            "foreach": foreach,
            "capturable": False,
            "differentiable": False,
            "fused": fused,
            "decoupled_weight_decay": True,
        }
        self.param_groups: list[dict[str, Any]] = []
        for given in groups:
            group = {"params": list(given["params"]), **{k: v for k, v in given.items() if k != "params"}}
            for key, value in defaults.items():
                group.setdefault(key, value)
            self.param_groups.append(group)
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def _new_state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, torch.Tensor]:
        on_device = group["fused"] or group["capturable"]  # where torch keeps `step` (a float32 scalar)
        return {
            "step": torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu"),
            "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
        }

    @torch.no_grad()
    def step(self) -> None:
        """One AdamW update of every parameter that has a gradient (state created at its first)."""
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if p not in self.state:
                    self.state[p] = self._new_state(p, group)
            states = [self.state[p] for p in params]
            beta1, beta2 = group["betas"]
            adam(
                params,
                [p.grad for p in params],
                [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states],
                [],
                [s["step"] for s in states],
                amsgrad=False,
                has_complex=any(torch.is_complex(p) for p in params),
                beta1=beta1,
                beta2=beta2,
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=False,
                foreach=group["foreach"],
                capturable=False,
                differentiable=False,
                fused=group["fused"],
                grad_scale=None,
                found_inf=None,
                decoupled_weight_decay=True,
            )

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every gradient (the only way enlace clears them: set_to_none)."""
        if not set_to_none:
            raise ValueError("AdamW.zero_grad keeps no zeroed gradients; call it with set_to_none=True")
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout: parameters numbered in group order; the groups' settings beside them."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)]: s for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Take a state_dict of this class or of torch.optim.AdamW over the same parameter layout: the
        saved groups' settings replace these, state tensors move to their parameter's device and dtype
        (`step` stays where torch keeps it)."""
        saved_groups = saved["param_groups"]
        if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("loaded optimizer state has a different parameter-group layout than this model's")
        state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        groups = []
        for group, saved_group in zip(self.param_groups, saved_groups, strict=True):
            on_device = saved_group.get("fused") or saved_group.get("capturable")
            for p, i in zip(group["params"], saved_group["params"], strict=True):
                if i in saved["state"]:
                    state[p] = {k: _placed(p, k, v, on_device) for k, v in saved["state"][i].items()}
            groups.append({"params": group["params"], **{k: v for k, v in saved_group.items() if k != "params"}})
        self.param_groups, self.state = groups, state


def _placed(p: torch.Tensor, key: str, value: torch.Tensor, on_device: bool) -> torch.Tensor:
    """torch.optim's rule for a loaded state tensor."""
    if key == "step":
        return value.to(dtype=torch.float32, device=p.device) if on_device else value
    return value.to(dtype=p.dtype, device=p.device) if p.is_floating_point() else value.to(device=p.device)


def implementation(deterministic: bool, device_type: str) -> dict[str, bool]:
    """Which of torch's AdamW implementations a new run steps with (a resumed one keeps its checkpoint's: the
    saved groups' settings win, as in torch.optim).

    Deterministic mode: foreach, the multi-tensor kernels — elementwise like the single-tensor loop (no atomics,
    no reduction), so deterministic, and bit for bit the loop's on the CPU (tests/test_optim.py), with one kernel
    launch per op and group instead of per parameter (≈20 against ≈400 per step for smoke-2060). Not fused:
    its one-kernel arithmetic is a different implementation from the CPU's, and deterministic runs are the
    ones compared across machines. Otherwise on CUDA: fused, one kernel per group. Otherwise torch's own
    default for the device."""
    if deterministic:
        return {"foreach": True, "fused": False}
    if device_type == "cuda":
        return {"foreach": False, "fused": True}
    return {}


def build_optimizer(model: torch.nn.Module, o: OptimConfig, deterministic: bool, device_type: str = "cpu") -> AdamW:
    """AdamW with decoupled weight decay on matrices (dim >= 2) only; not on norms or biases; the implementation
    `implementation()` picks."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    chosen = implementation(deterministic, device_type)
    return AdamW(groups, lr=o.learning_rate, betas=(o.beta1, o.beta2), eps=o.eps, **chosen)
