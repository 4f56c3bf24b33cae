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

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from enlace.data.shards import prepare_shards
from enlace.errors import AlreadyRunning, BadOut
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

    with _alone(out):
        if out.exists():  # (one that held the lock finished it meanwhile)
            raise BadOut(f"{out} exists — generate writes a new shard directory; remove it or pick another --out")
        return _generate(ckpt, out, n_bytes, streams, temperature, seed, device, say)


@contextlib.contextmanager
def _alone(out: Path):
    """Held while this generate writes OUT (a lock file beside it): a second one at the same OUT is refused (two
    wrote into one OUT.partial: stream 0's first bytes twice, and a traceback)."""
    lock = out.with_name(f".{out.name}.generate-lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fh = open(lock, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise AlreadyRunning(
                f"another generate is writing {out} now — wait for it, or pick another --out"
            ) from None
        if os.path.exists(lock) and os.stat(lock).st_ino == os.fstat(fh.fileno()).st_ino:
            break  # (not a lock file the generate before removed as this one opened it)
        fh.close()
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        fh.close()


def _generate(ckpt: Path, out: Path, n_bytes: int, streams: int, temperature: float, seed: int, device, say):
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
    held = json.loads((partial / "generate.json").read_text()) if (partial / "generate.json").is_file() else None
    if held is not None and held != want:  # (it was thrown away without a word: minutes of a teacher's text)
        shown = lambda k, v: str(v)[:12] if k == "teacher" else repr(v)
        differ = ", ".join(
            f"{k} {shown(k, held.get(k))} then, {shown(k, v)} now" for k, v in want.items() if held.get(k) != v
        )
        raise BadOut(
            f"{partial} holds an interrupted generate of other arguments ({differ}): give the same ones to continue "
            f"it, or remove {partial} to start this one"
        )
    if held == want:
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
