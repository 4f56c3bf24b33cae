"""Bad combinations of config values, each refused with the file, the key and the fix."""

from __future__ import annotations

from enlace.config import Config
from enlace.errors import ConfigError


def check_combinations(cfg: Config, origin: dict[str, str]) -> None:
    """Values that are each valid but wrong together; `origin` maps a dotted key to the file that set it."""
    src = lambda key, default="defaults": origin.get(key, default)
    rt, m, t, o, d = cfg.runtime, cfg.model, cfg.training, cfg.optim, cfg.data
    if rt.deterministic and rt.compile:
        raise ConfigError(
            src("runtime.compile", src("runtime.deterministic")),
            "runtime.compile",
            "deterministic: true cannot be combined with compile: true",
            "torch.compile's autotuning picks different kernels between runs, which brings back the "
            "variance deterministic mode removes; set compile: false (or deterministic: false)",
        )
    positive = [
        ("model.seq_len", m.seq_len), ("model.n_layer", m.n_layer), ("model.n_head", m.n_head),
        ("model.d_model", m.d_model), ("model.vocab_size", m.vocab_size),
        ("training.batch_size", t.batch_size), ("training.grad_accum", t.grad_accum),
        ("training.max_steps", t.max_steps), ("training.log_every", t.log_every),
        ("training.eval_batches", t.eval_batches), ("checkpoint.keep", cfg.checkpoint.keep),
    ]  # fmt: skip
    for key, value in positive:
        if value < 1:
            raise ConfigError(src(key), key, f"must be at least 1, got {value}")
    for key, value in [("training.eval_every", t.eval_every), ("checkpoint.every", cfg.checkpoint.every),
                       ("training.eval_batch_size", t.eval_batch_size), ("runtime.threads", rt.threads),
                       ("optim.warmup_steps", o.warmup_steps), ("optim.grad_clip", o.grad_clip)]:  # fmt: skip
        if value < 0:
            raise ConfigError(src(key), key, f"must not be negative, got {value}")
    if m.d_model % m.n_head:
        raise ConfigError(src("model.n_head"), "model.n_head", f"d_model {m.d_model} is not divisible by "
                          f"n_head {m.n_head}", "pick n_head that divides d_model")  # fmt: skip
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError(src("model.dropout"), "model.dropout", f"must be in [0, 1), got {m.dropout}")
    if o.min_lr > o.learning_rate:
        raise ConfigError(src("optim.min_lr"), "optim.min_lr", "is above learning_rate",
                          "min_lr is the floor of the cosine decay")  # fmt: skip
    if o.warmup_steps > t.max_steps:
        raise ConfigError(src("optim.warmup_steps"), "optim.warmup_steps",
                          f"{o.warmup_steps} is more than max_steps {t.max_steps}", "shorten the warmup")  # fmt: skip
    if d.kind == "bytes" and not d.paths:
        raise ConfigError(src("data.kind"), "data.paths", "kind: bytes needs paths", "list files or globs")
    if d.kind == "bytes" and not 0.0 < d.val_fraction < 1.0:
        raise ConfigError(src("data.val_fraction"), "data.val_fraction", "must be between 0 and 1")
    if d.kind == "shards" and not d.shard_dir:
        raise ConfigError(src("data.kind"), "data.shard_dir", "kind: shards needs shard_dir",
                          "point it at a directory written by `enlace prepare`")  # fmt: skip
    if rt.precision == "fp16" and rt.fp16_init_scale <= 0:
        raise ConfigError(src("runtime.fp16_init_scale"), "runtime.fp16_init_scale", "must be positive")
