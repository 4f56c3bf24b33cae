"""`enlace export`: a trained model out of enlace, from a complete, verified checkpoint.

    --format safetensors   model.safetensors (enlace's own tensor names; the tied head is stored once, as
                           tok_emb.weight) and enlace.json (the model config, the tie, the checkpoint's step)
    --format hf            a directory `transformers.AutoModelForCausalLM.from_pretrained(DIR)` loads as GPT-2:
                           config.json, model.safetensors, generation_config.json, a byte-level tokenizer
                           (tokenizer.json: ids are the bytes themselves, no added tokens) and README.md, a
                           model card (config, steps, data, val bpb, commit)

enlace's model is GPT-2's architecture over bytes: pre-norm blocks, learned positions, an exact-GELU MLP,
tied embeddings, no biases. GPT-2 keeps biases (written as zeros here) and stores its linear weights as
Conv1D, (in, out): each is the transpose of enlace's nn.Linear weight. Needs only safetensors and the
trainer; transformers is needed to load the result, not to write it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from enlace.errors import BadOut, EnlaceError
from enlace.manifest import MANIFEST, read_manifest, write_manifest
from enlace.train.trained import load_model


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as one printable character (what ByteLevel pre-tokenizes to)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


def tokenizer_json() -> dict[str, Any]:
    """A tokenizers-library tokenizer whose ids are the bytes: byte-level pre-tokenizing, a BPE model with
    the 256 byte characters and no merges, byte-level decoding."""
    vocab = {char: byte for byte, char in sorted(_bytes_to_unicode().items())}
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": level,
        "post_processor": None,
        "decoder": level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def gpt2_tensors(state: dict[str, torch.Tensor], n_layer: int) -> dict[str, torch.Tensor]:
    """enlace's state_dict as GPT2LMHeadModel's (the tied lm_head left to transformers' tie)."""
    out = {
        "transformer.wte.weight": state["tok_emb.weight"],
        "transformer.wpe.weight": state["pos_emb.weight"],
        "transformer.ln_f.weight": state["ln_f.weight"],
        "transformer.ln_f.bias": state["ln_f.bias"],
    }
    for i in range(n_layer):
        src, dst = f"blocks.{i}.", f"transformer.h.{i}."
        for a, b in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[f"{dst}{b}.weight"], out[f"{dst}{b}.bias"] = state[f"{src}{a}.weight"], state[f"{src}{a}.bias"]
        for a, b in (
            ("attn.qkv", "attn.c_attn"),
            ("attn.proj", "attn.c_proj"),
            ("mlp.fc", "mlp.c_fc"),
            ("mlp.proj", "mlp.c_proj"),
        ):
            weight = state[f"{src}{a}.weight"].t()  # nn.Linear (out, in) -> Conv1D (in, out)
            out[f"{dst}{b}.weight"] = weight
            out[f"{dst}{b}.bias"] = torch.zeros(weight.shape[1], dtype=weight.dtype)
    return {k: v.detach().float().contiguous() for k, v in out.items()}


def gpt2_config(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": model["vocab_size"],
        "n_positions": model["seq_len"],
        "n_embd": model["d_model"],
        "n_layer": model["n_layer"],
        "n_head": model["n_head"],
        "n_inner": 4 * model["d_model"],
        "activation_function": "gelu",  # exact GELU, as enlace's MLP (GPT-2's own default is the tanh one)
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": None,
        "torch_dtype": "float32",
    }


def export(ckpt: Path, fmt: str, out: Path, run_state: dict[str, Any]) -> list[str]:
    """Write the export of checkpoint `ckpt` into `out` (which must not exist; it appears only once
    complete). `run_state`: the run's run.json, for the model card. Returns the files written."""
    from safetensors.torch import save_file

    if out.is_symlink():  # a dangling one too: the rename at the end would fail on it
        raise BadOut(f"{out} is a link (to {os.readlink(out)}) — export writes a new directory; pick another --out")
    if out.exists():
        raise BadOut(f"{out} exists — export writes a new directory; remove it or pick another --out")
    model, trainer = load_model(ckpt, torch.device("cpu"))  # verified against MANIFEST, weights_only
    cfg = trainer["config"]["model"]
    state = model.state_dict()
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise EnlaceError(f"cannot create {out}: {e.strerror} — pick another --out") from None
    try:
        if fmt == "safetensors":
            tensors = {k: v.detach().contiguous() for k, v in state.items() if k != "head.weight"}
            save_file(tensors, tmp / "model.safetensors")
            meta = {"model": cfg, "tied": {"head.weight": "tok_emb.weight"}, "step": trainer["step"]}
            (tmp / "enlace.json").write_text(json.dumps(meta, indent=1) + "\n")
        else:
            save_file(gpt2_tensors(state, cfg["n_layer"]), tmp / "model.safetensors", metadata={"format": "pt"})
            (tmp / "config.json").write_text(json.dumps(gpt2_config(cfg), indent=1) + "\n")
            generation = {"do_sample": False, "max_length": cfg["seq_len"], "pad_token_id": 0}
            (tmp / "generation_config.json").write_text(json.dumps(generation, indent=1) + "\n")
            (tmp / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False) + "\n")
            tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg["seq_len"]}
            (tmp / "tokenizer_config.json").write_text(json.dumps({**tok_cfg, "clean_up_tokenization_spaces": False}))
            (tmp / "README.md").write_text(_card(ckpt, trainer, run_state, read_manifest(ckpt)))
        write_manifest(tmp, trainer["step"], sorted(p.name for p in tmp.iterdir()))  # verifiable where it is copied
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(p.name for p in out.iterdir() if p.name != MANIFEST)


def _card(ckpt: Path, trainer: dict[str, Any], run_state: dict[str, Any], manifest: dict[str, Any]) -> str:
    cfg, data = trainer["config"], trainer.get("data") or {}
    m = cfg["model"]
    bpb = run_state.get("val_bpb")
    return f"""# {cfg.get("run_name", ckpt.parent.parent.name)} (enlace, byte-level GPT-2)

A byte-level language model trained with enlace and exported as GPT-2 for Hugging Face transformers:
token ids are the bytes themselves (vocab 256, no added tokens), the context is {m["seq_len"]} bytes.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("THIS_DIR")
tok = AutoTokenizer.from_pretrained("THIS_DIR")
ids = tok("def ", return_tensors="pt").input_ids
out = model.generate(ids, max_length=model.config.n_positions)  # the prompt and new bytes fit its positions
print(tok.decode(out[0]))
```

| | |
|---|---|
| model | {m["n_layer"]} layers, d_model {m["d_model"]}, {m["n_head"]} heads, seq_len {m["seq_len"]} |
| trained | step {trainer["step"]} of {cfg["training"]["max_steps"]}, {trainer["tokens"]} tokens, batch {cfg["training"]["batch_size"]} x grad_accum {cfg["training"]["grad_accum"]} |
| optimizer | AdamW, learning rate {cfg["optim"]["learning_rate"]:g} → {cfg["optim"]["min_lr"]:g} (cosine) |
| precision | {cfg["runtime"]["precision"]}, deterministic {cfg["runtime"]["deterministic"]} |
| data | {data.get("files", "?")} files, {data.get("bytes", "?")} bytes, sha256 {data.get("sha256", "?")} |
| val bits/byte | {f"{bpb:.4f}" if isinstance(bpb, (int, float)) else "not recorded"} |
| commit | {trainer.get("commit", "unknown")} |
| checkpoint | {ckpt.name}, MANIFEST version {manifest["version"]} |
"""
