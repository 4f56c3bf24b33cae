"""Values that are each well-typed but wrong, alone or together: refused at load time (so check-config
catches what train would hit), each with the file that set the key, the key and the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from enlace.config.schema import Config
from enlace.errors import ConfigError

MAX_TRAIN_BYTES = 2**44  # 16 TiB for weights, gradients, AdamW state and activations: no single device
SEED_LIMIT = 2**64


def estimate_train_bytes(cfg: Config) -> tuple[int, int]:
    """(parameters, bytes) of a training step, roughly: fp32 weights + grads + two AdamW moments (16 B per
    parameter) and activations (≈ 16 values of d_model per token per layer, plus the attention matrix)."""
    m, t = cfg.model, cfg.training
    params = m.vocab_size * m.d_model + m.seq_len * m.d_model + m.n_layer * 12 * m.d_model**2
    tokens = t.batch_size * m.seq_len
    activations = 4 * m.n_layer * (16 * tokens * m.d_model + t.batch_size * m.n_head * m.seq_len**2)
    return params, 16 * params + activations


def check_combinations(cfg: Config) -> None:
    """Raise ConfigError for the first bad value; add warnings for valid but probably unmeant ones."""
    src = cfg.origin
    rt, m, t, o, d = cfg.runtime, cfg.model, cfg.training, cfg.optim, cfg.data

    def refuse(key: str, problem: str, fix: str = "") -> None:
        raise ConfigError(src(key), key, problem, fix)

    if rt.deterministic and rt.compile:
        refuse(
            "runtime.compile" if "runtime.compile" in cfg.origins else "runtime.deterministic",
            "deterministic: true cannot be combined with compile: true",
            "torch.compile's autotuning picks different kernels between runs, which brings back the variance "
            "deterministic mode removes; set compile: false (or deterministic: false)",
        )
    at_least_one = [
        "model.seq_len",
        "model.n_layer",
        "model.n_head",
        "model.d_model",
        "model.vocab_size",
        "training.batch_size",
        "training.grad_accum",
        "training.max_steps",
        "training.log_every",
        "training.eval_batches",
        "checkpoint.keep",
    ]
    not_negative = [
        "training.eval_every",
        "checkpoint.every",
        "training.eval_batch_size",
        "runtime.threads",
        "optim.warmup_steps",
        "optim.grad_clip",
        "optim.weight_decay",
        "optim.min_lr",
    ]
    for key in at_least_one:
        if _value(cfg, key) < 1:
            refuse(key, f"must be at least 1, got {_value(cfg, key)}")
    for key in not_negative:
        if _value(cfg, key) < 0:
            refuse(key, f"must not be negative, got {_value(cfg, key)}")
    if o.learning_rate <= 0:
        refuse("optim.learning_rate", f"must be above 0, got {o.learning_rate}", "typical: 1e-4 to 3e-3")
    for key in ("optim.beta1", "optim.beta2"):
        if not 0.0 <= _value(cfg, key) < 1.0:
            refuse(
                key, f"must be in [0, 1), got {_value(cfg, key)}", "AdamW's betas are decay rates; typical 0.9 / 0.95"
            )
    if o.eps <= 0:
        refuse("optim.eps", f"must be above 0, got {o.eps}", "typical: 1e-8")
    if m.d_model % m.n_head:
        refuse(
            "model.n_head",
            f"d_model {m.d_model} is not divisible by n_head {m.n_head}",
            "pick n_head that divides d_model",
        )
    if not 0.0 <= m.dropout < 1.0:
        refuse("model.dropout", f"must be in [0, 1), got {m.dropout}")
    if o.min_lr > o.learning_rate:
        refuse(
            "optim.min_lr",
            f"{o.min_lr} is above learning_rate {o.learning_rate}",
            "min_lr is the floor of the cosine decay",
        )
    if o.warmup_steps > t.max_steps:
        refuse("optim.warmup_steps", f"{o.warmup_steps} is more than max_steps {t.max_steps}", "shorten the warmup")
    if not 0 <= rt.seed < SEED_LIMIT:
        refuse("runtime.seed", f"{rt.seed} is outside 0 … 2**64-1", "use a non-negative 64-bit integer")
    if rt.precision == "fp16" and rt.fp16_init_scale <= 0:
        refuse("runtime.fp16_init_scale", f"must be above 0, got {rt.fp16_init_scale}", "the default is 65536")
    if d.kind == "bytes" and m.vocab_size < 256:
        refuse(
            "model.vocab_size",
            f"{m.vocab_size} is below 256, but kind: bytes data has 256 symbols",
            "use vocab_size: 256 (byte-level)",
        )
    if d.kind == "bytes" and not d.paths:
        refuse("data.paths", "kind: bytes needs paths", "list files or globs")
    if d.kind == "bytes" and not 0.0 < d.val_fraction < 1.0:
        refuse("data.val_fraction", f"must be between 0 and 1, got {d.val_fraction}")
    if d.kind == "shards" and not d.shard_dir:
        refuse("data.shard_dir", "kind: shards needs shard_dir", "point it at a directory written by `enlace prepare`")
    if cfg.distill.teacher:
        if not 0.0 <= cfg.distill.alpha <= 1.0:
            refuse(
                "distill.alpha",
                f"must be in [0, 1], got {cfg.distill.alpha}",
                "0 = no distillation, 1 = only the teacher",
            )
        if cfg.distill.temperature <= 0:
            refuse("distill.temperature", f"must be above 0, got {cfg.distill.temperature}", "typical: 1 to 4")
    params, need = estimate_train_bytes(cfg)
    if need > MAX_TRAIN_BYTES:
        biggest = max(
            ("model.d_model", "model.n_layer", "model.seq_len", "training.batch_size"),
            key=lambda k: _value(cfg, k) / _default(cfg, k),
        )
        refuse(
            biggest,
            f"≈{params:.3g} parameters and ≈{need / 2**40:.3g} TiB per training step: no device can hold that",
            "shrink the model or the batch; `enlace preflight` tells what fits",
        )
    if rt.precision == "fp16" and rt.device == "cpu":
        cfg.warnings.append(
            f"{src('runtime.precision')}: runtime.precision: fp16 on CPU is ≈20x slower than fp32 "
            "here (no fp16 kernels); use bf16 or fp32 on CPU"
        )


def no_cuda_error(cfg: Config) -> ConfigError:
    """runtime.device: cuda where no GPU is visible, with hints that each lead to a run that works here."""
    return ConfigError(
        cfg.origin("runtime.device"),
        "runtime.device",
        "is cuda but no CUDA device is visible here",
        "a GPU profile on a machine without one: use a CPU run config instead (e.g. smoke-cpu; configs/runs/ "
        "lists them), or --set runtime.device=cpu --set runtime.precision=fp32 (fp16 on a CPU is ≈20x slower)",
    )


def _value(cfg: Config, key: str):
    section, _, leaf = key.partition(".")
    return getattr(getattr(cfg, section), leaf)


def _default(cfg: Config, key: str):
    """The key's default: its section's dataclass, built bare."""
    section, _, leaf = key.partition(".")
    return getattr(type(getattr(cfg, section))(), leaf)
