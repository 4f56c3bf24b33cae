"""Batches drawn ahead on a helper thread (enlace/data/prefetch.py): the same batches in the same order, and a
state that is the last batch a step took, not the last one drawn ahead. On the CPU; the CUDA branch (pinned
memory, one asynchronous copy) needs a card: bench/gpu_check.py runs it there."""

from __future__ import annotations

import threading

import pytest
import torch

from enlace.data.bytestream import ByteStream
from enlace.data.prefetch import Prefetched
from enlace.data.shards import ShardStream, prepare_shards

CPU = torch.device("cpu")


@pytest.fixture
def files(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_bytes(bytes(range(256)) * 200)
    return [f]


def streams(files, tmp_path):
    prepare_shards(files, tmp_path / "s", shard_tokens=2048, dtype="uint16")
    return {
        "bytes": lambda: ByteStream(files, 16, 4, seed=3),
        "shards": lambda: ShardStream(tmp_path / "s", 16, 4, seed=5),  # 40 draws cross a shard boundary
    }


def as_bytes(batch) -> bytes:
    x, y = batch
    return x.numpy().tobytes() + y.numpy().tobytes()


@pytest.mark.parametrize("kind", ["bytes", "shards"])
@pytest.mark.parametrize("depth", [0, 1, 3])
def test_prefetched_batches_and_states_are_the_streams_own(files, tmp_path, kind, depth):
    make = streams(files, tmp_path)[kind]
    plain, ahead = make(), Prefetched(make(), CPU, depth)
    try:
        for _ in range(40):
            assert as_bytes(ahead.next_batch()) == as_bytes(plain.next_batch())
            # the state is the last batch taken, though up to `depth` more were drawn behind it
            assert ahead.state_dict() == plain.state_dict()
    finally:
        ahead.close()


@pytest.mark.parametrize("kind", ["bytes", "shards"])
def test_a_state_taken_while_batches_are_in_flight_resumes_at_the_first_batch_no_step_saw(files, tmp_path, kind):
    make = streams(files, tmp_path)[kind]
    first = Prefetched(make(), CPU, 3)
    for _ in range(7):
        first.next_batch()
    state = first.state_dict()
    expected = [as_bytes(first.next_batch()) for _ in range(10)]
    first.close()
    resumed = Prefetched(make(), CPU, 3)
    resumed.load_state_dict(state)
    assert [as_bytes(resumed.next_batch()) for _ in range(10)] == expected
    # loaded again mid-stream (what a restore does): the draws in flight are dropped, not taken
    resumed.load_state_dict(state)
    assert as_bytes(resumed.next_batch()) == expected[0]
    resumed.close()


class Failing:
    """A stream whose draw number `bad` raises (a shard that cannot be read)."""

    def __init__(self, bad: int):
        self.k, self.bad, self.threads = 0, bad, set()

    def next_batch(self):
        self.threads.add(threading.current_thread().name)
        self.k += 1
        if self.k == self.bad:
            raise OSError(f"draw {self.k} failed")
        return torch.full((1, 2), self.k), torch.full((1, 2), self.k)

    def state_dict(self):
        return {"k": self.k}


def test_a_draw_that_fails_is_raised_by_the_step_that_takes_it_not_before():
    stream = Failing(bad=3)
    ahead = Prefetched(stream, CPU, 2)
    assert int(ahead.next_batch()[0][0, 0]) == 1  # draw 3 already failed on the helper by now
    assert int(ahead.next_batch()[0][0, 0]) == 2
    assert ahead.state_dict() == {"k": 2}
    with pytest.raises(OSError, match="draw 3 failed"):
        ahead.next_batch()
    ahead.close()
    assert stream.threads and all(t.startswith("enlace-prefetch") for t in stream.threads)  # never the caller's


def test_close_ends_the_helper_thread(files):
    ahead = Prefetched(ByteStream(files, 16, 4), CPU, 2)
    ahead.next_batch()
    assert any(t.name.startswith("enlace-prefetch") for t in threading.enumerate())
    ahead.close()
    assert not any(t.name.startswith("enlace-prefetch") for t in threading.enumerate())
