"""Distillation: a student trained from a frozen teacher checkpoint, as one more term of its loss.

    loss = (1 - alpha) · CE(student, targets) + alpha · T² · KL(teacher_T ‖ student_T)

`distill.teacher` is a run name on this machine (its newest complete checkpoint, under <root>/runs/)
or a checkpoint dir. The teacher's model config comes from its checkpoint (any depth or width; same
vocab; seq_len at least the student's). It is loaded once (verified, weights_only), frozen, in eval
mode, on the student's device, and runs under the student's autocast. Its identity — the sha256 of
its MANIFEST — goes into every checkpoint; resuming with another teacher is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from enlace.config.machine import check_fit, teacher_checkpoint
from enlace.manifest import identity
from enlace.train.trained import load_model

if TYPE_CHECKING:
    import torch

    from enlace.config.schema import Config


def load_teacher(cfg: Config, device: torch.device) -> tuple[torch.nn.Module, dict]:
    """The frozen teacher on `device`, and {checkpoint, identity, params} for the log and checkpoints."""
    ckpt = teacher_checkpoint(cfg)
    model, _ = load_model(ckpt, device)
    check_fit(cfg, model.cfg.vocab_size, model.cfg.seq_len)
    for p in model.parameters():
        p.requires_grad_(False)
    return model, {"checkpoint": str(ckpt), "identity": identity(ckpt), "params": model.num_params()}


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T² · KL(teacher_T ‖ student_T), mean over tokens. Logits (B, T, V); computed in fp32."""
    import torch.nn.functional as F

    v = student_logits.size(-1)
    s = F.log_softmax(student_logits.float().view(-1, v) / temperature, dim=-1)
    t = F.log_softmax(teacher_logits.float().view(-1, v) / temperature, dim=-1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean") * temperature**2
