"""`enlace generate`: a teacher's own text as token shards (sequence-level distillation data), written as
it is drawn so that nothing is lost when the command is stopped.

    OUT.partial/generate.json      what is being generated (teacher identity, bytes, streams, temperature, seed)
    OUT.partial/stream-NNNN.bin    each stream's bytes so far, appended a chunk at a time (fsynced)
    OUT/                           the shards (`enlace prepare`'s layout), only once every stream is complete

A stopped generate run again with the same arguments continues each stream from its last `seq_len` bytes
(its generator reseeded with the seed and the bytes already drawn): the text goes on, none is drawn
twice; it is not the byte sequence an uninterrupted run would have drawn.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from enlace.data.shards import prepare_shards
from enlace.errors import EnlaceError
from enlace.manifest import read_manifest
from enlace.tools.sample import generate_streams
from enlace.train.trained import load_model

CHUNK = 256  # bytes per stream between two writes (and two progress lines)


def _done(partial: Path, streams: int) -> int:
    sizes = [(partial / f"stream-{k:04d}.bin").stat().st_size for k in range(streams)]
    return min(sizes)


def generate_shards(
    ckpt: Path,
    out: Path,
    n_bytes: int,
    streams: int,
    temperature: float,
    seed: int,
    device,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Draw `n_bytes` from the checkpoint's model in `streams` side by side, into OUT's shards. Returns
    prepare_shards' meta plus what this call did (bytes drawn now, bytes found from an earlier call)."""

    if out.exists():
        raise EnlaceError(f"{out} exists — generate writes a new shard directory; remove it or pick another --out")
    model, trainer = load_model(ckpt, device)
    each = -(-n_bytes // streams)
    want = {
        "teacher": read_manifest(ckpt)["files"]["model.pt"]["sha256"],
        "bytes": n_bytes,
        "streams": streams,
        "temperature": temperature,
        "seed": seed,
    }
    partial = out.with_name(out.name + ".partial")
    found = 0
    if (partial / "generate.json").is_file() and json.loads((partial / "generate.json").read_text()) == want:
        found = _done(partial, streams)
        for k in range(streams):  # streams cut mid-chunk: back to the length all of them reached
            with open(partial / f"stream-{k:04d}.bin", "r+b") as fh:
                fh.truncate(found)
        say(f"continuing an interrupted generate: {found} of {each} bytes per stream are in {partial}")
    else:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for k in range(streams):
            (partial / f"stream-{k:04d}.bin").touch()
        (partial / "generate.json").write_text(json.dumps(want))
    say(f"generating {streams} x {each} bytes from step {trainer['step']} on {device}")
    t0, done = time.monotonic(), found
    seq_len = model.cfg.seq_len
    while done < each:
        n = min(CHUNK, each - done)
        contexts = None
        if done:
            contexts = []
            for k in range(streams):
                with open(partial / f"stream-{k:04d}.bin", "rb") as fh:
                    fh.seek(max(0, done - seq_len))
                    contexts.append(fh.read())
        texts = generate_streams(model, b"", streams, n, temperature, None, seed + done, contexts=contexts)
        for k, text in enumerate(texts):
            with open(partial / f"stream-{k:04d}.bin", "ab") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
        done += n
        rate = (done - found) * streams / max(time.monotonic() - t0, 1e-9)
        eta = (each - done) * streams / rate if rate else 0
        say(
            f"generate: {done * streams}/{each * streams} bytes ({100 * done / each:.0f}%), "
            f"{rate:.0f} bytes/s, ETA {eta:.0f} s"
        )
    corpus = partial / "teacher.txt"
    with open(corpus, "wb") as fh:
        for k in range(streams):
            fh.write((partial / f"stream-{k:04d}.bin").read_bytes() + b"\n")
        fh.truncate(n_bytes)
    meta = prepare_shards([corpus], out, val_fraction=0.05)
    shutil.rmtree(partial, ignore_errors=True)
    return {**meta, "drawn_bytes": (each - found) * streams, "found_bytes": found * streams}
