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
    rt = cfg.runtime
    if rt.deterministic and rt.compile:
        _refuse(
            cfg,
            "runtime.compile" if "runtime.compile" in cfg.origins else "runtime.deterministic",
            "deterministic: true cannot be combined with compile: true",
            "torch.compile's autotuning picks different kernels between runs, which brings back the variance "
            "deterministic mode removes; set compile: false (or deterministic: false)",
        )
    _check_ranges(cfg)
    _check_together(cfg)
    _check_data(cfg)
    _check_size(cfg)
    if rt.precision == "fp16" and rt.device == "cpu":
        cfg.warnings.append(
            f"{cfg.origin('runtime.precision')}: runtime.precision: fp16 on CPU is ≈20x slower than fp32 "
            "here (no fp16 kernels); use bf16 or fp32 on CPU"
        )


def _refuse(cfg: Config, key: str, problem: str, fix: str = "", blame: str | None = None) -> None:
    """ConfigError naming the file that set `key` — or that set `blame`, the key that made `key` needed."""
    raise ConfigError(cfg.origin(blame or key), key, problem, fix)


AT_LEAST_ONE = (
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
)
NOT_NEGATIVE = (
    "training.eval_every",
    "checkpoint.every",
    "training.eval_batch_size",
    "training.prefetch",
    "runtime.threads",
    "optim.warmup_steps",
    "optim.grad_clip",
    "optim.weight_decay",
    "optim.min_lr",
)


def _check_ranges(cfg: Config) -> None:
    """Each value alone."""
    o, rt = cfg.optim, cfg.runtime
    for key in AT_LEAST_ONE:
        if _value(cfg, key) < 1:
            _refuse(cfg, key, f"must be at least 1, got {_value(cfg, key)}")
    for key in NOT_NEGATIVE:
        if _value(cfg, key) < 0:
            _refuse(cfg, key, f"must not be negative, got {_value(cfg, key)}")
    if o.learning_rate <= 0:
        _refuse(cfg, "optim.learning_rate", f"must be above 0, got {o.learning_rate}", "typical: 1e-4 to 3e-3")
    for key in ("optim.beta1", "optim.beta2"):
        if not 0.0 <= _value(cfg, key) < 1.0:
            fix = "AdamW's betas are decay rates; typical 0.9 / 0.95"
            _refuse(cfg, key, f"must be in [0, 1), got {_value(cfg, key)}", fix)
    if o.eps <= 0:
        _refuse(cfg, "optim.eps", f"must be above 0, got {o.eps}", "typical: 1e-8")
    if not 0.0 <= cfg.model.dropout < 1.0:
        _refuse(cfg, "model.dropout", f"must be in [0, 1), got {cfg.model.dropout}")
    if not 0 <= rt.seed < SEED_LIMIT:
        _refuse(cfg, "runtime.seed", f"{rt.seed} is outside 0 … 2**64-1", "use a non-negative 64-bit integer")
    if rt.precision == "fp16" and rt.fp16_init_scale <= 0:
        _refuse(cfg, "runtime.fp16_init_scale", f"must be above 0, got {rt.fp16_init_scale}", "the default is 65536")


def _blamed(cfg: Config, *keys: str) -> str:
    """Of keys wrong together, the one a --set gave (what the user just changed), else the first."""
    return next((k for k in keys if cfg.origin(k) == "--set"), keys[0])


def _check_together(cfg: Config) -> None:
    """Values that are wrong together: the model's shape, the schedule, distillation."""
    m, o, t = cfg.model, cfg.optim, cfg.training
    if m.d_model % m.n_head:
        _refuse(
            cfg,
            _blamed(cfg, "model.n_head", "model.d_model"),
            f"d_model {m.d_model} is not divisible by n_head {m.n_head}",
            "pick an n_head that divides d_model (or a d_model that n_head divides)",
        )
    if o.min_lr > o.learning_rate:
        fix = "min_lr is the floor of the cosine decay"
        _refuse(
            cfg,
            _blamed(cfg, "optim.min_lr", "optim.learning_rate"),
            f"min_lr {o.min_lr} is above learning_rate {o.learning_rate}",
            fix,
        )
    if o.warmup_steps > t.max_steps:
        _refuse(
            cfg,
            _blamed(cfg, "optim.warmup_steps", "training.max_steps"),
            f"warmup_steps {o.warmup_steps} is more than max_steps {t.max_steps}",
            f"shorten the warmup (--set optim.warmup_steps={max(0, t.max_steps // 10)})",
        )
    if cfg.distill.teacher:
        if not 0.0 <= cfg.distill.alpha <= 1.0:
            fix = "0 = no distillation, 1 = only the teacher"
            _refuse(cfg, "distill.alpha", f"must be in [0, 1], got {cfg.distill.alpha}", fix)
        if cfg.distill.temperature <= 0:
            _refuse(cfg, "distill.temperature", f"must be above 0, got {cfg.distill.temperature}", "typical: 1 to 4")


def _check_data(cfg: Config) -> None:
    m, d = cfg.model, cfg.data
    if d.kind == "bytes" and m.vocab_size < 256:
        problem = f"{m.vocab_size} is below 256, but kind: bytes data has 256 symbols"
        _refuse(cfg, "model.vocab_size", problem, "use vocab_size: 256 (byte-level)")
    if d.kind == "bytes" and not d.paths:
        _refuse(cfg, "data.paths", "kind: bytes needs paths", "list files or globs", blame="data.kind")
    if d.kind == "bytes" and not 0.0 < d.val_fraction < 1.0:
        _refuse(cfg, "data.val_fraction", f"must be between 0 and 1, got {d.val_fraction}")
    if d.kind == "shards" and not d.shard_dir:
        fix = "point it at a directory written by `enlace prepare`"
        _refuse(cfg, "data.shard_dir", "kind: shards needs shard_dir", fix, blame="data.kind")  # (it blamed defaults)


def _check_size(cfg: Config) -> None:
    """A model and batch no device could hold, blamed on the value furthest above its default."""
    params, need = estimate_train_bytes(cfg)
    if need > MAX_TRAIN_BYTES:
        biggest = max(
            ("model.d_model", "model.n_layer", "model.seq_len", "training.batch_size"),
            key=lambda k: _value(cfg, k) / _default(cfg, k),
        )
        _refuse(
            cfg,
            biggest,
            f"≈{params:.3g} parameters and ≈{need / 2**40:.3g} TiB per training step: no device can hold that",
            "shrink the model or the batch; `enlace preflight` tells what fits",
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
