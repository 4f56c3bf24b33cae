"""The server half of fetch (enlace/server/fetchserve.py) on real files, without sshd: what it offers, how it
resumes, what it refuses, and that a checkpoint pruned mid-fetch is still served whole."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil

import pytest
from support.canned import CannedWire, canned_session

from enlace.contract import FRAME
from enlace.server.fetchserve import BadRequest, serve
from enlace.train.checkpoint import save_checkpoint


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "runs" / "r"
    for step in (2, 4):
        save_checkpoint(d / "checkpoints", step, {"model.pt": bytes(range(256)) * (100 + step)}, keep=5)
    (d / "checkpoints" / "step-000006").mkdir()  # being written: no MANIFEST, never offered
    (d / "run.json").write_text('{"status": "running"}\n')
    (d / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    return d


def converse(run_dir, tmp_path, send):
    """Run serve() with `send` as the request; returns the offer and [(start, bytes)] per file."""
    out_path = tmp_path / "wire.out"
    with open(out_path, "w+b") as out:
        serve(run_dir, io.BytesIO(json.dumps({"send": send}).encode() + b"\n"), out)
    data = out_path.read_bytes()
    line, rest = data.split(b"\n", 1)
    frames = []
    while rest:
        start, count = FRAME.unpack(rest[: FRAME.size])
        frames.append((start, rest[FRAME.size : FRAME.size + count]))
        rest = rest[FRAME.size + count :]
    return json.loads(line), frames


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_offer_lists_complete_checkpoints_and_run_files(run_dir, tmp_path):
    offer, frames = converse(run_dir, tmp_path, [])
    assert [c["name"] for c in offer["checkpoints"]] == ["step-000002", "step-000004"]
    assert offer["latest"] == "step-000004" and frames == []
    assert offer["files"] == {"run.json": 22, "metrics.jsonl": 24}
    model = run_dir / "checkpoints" / "step-000004" / "model.pt"
    assert offer["checkpoints"][1]["files"]["model.pt"] == {
        "sha256": sha(model.read_bytes()),
        "bytes": model.stat().st_size,
    }


def test_a_fetched_copy_of_a_checkpoint_the_server_set_aside_goes_aside_and_no_other(run_dir, tmp_path):
    """A launch that started afresh moved the old line to checkpoints-set-aside/ on the server: the offer lists
    it, and the driver's copies go aside too, matched by their MANIFEST's files (a copy of the same name with
    other bytes, a step the server pruned, the present line's step-N: left where they are)."""
    from enlace.manifest import set_aside_copies

    aside = run_dir / "checkpoints-set-aside" / "20261208-010359-31772"
    aside.mkdir(parents=True)
    shutil.move(run_dir / "checkpoints" / "step-000002", aside / "step-000002")
    offer, _ = converse(run_dir, tmp_path, [])
    assert [(e["folder"], e["name"]) for e in offer["set_aside"]] == [(aside.name, "step-000002")]
    here = tmp_path / "here" / "checkpoints"
    for step, body in ((2, bytes(range(256)) * 102), (3, b"pruned on the server"), (4, bytes(range(256)) * 104)):
        save_checkpoint(here, step, {"model.pt": body}, keep=5)
    other = [{**offer["set_aside"][0], "name": "step-000003"}, {**offer["set_aside"][0], "name": "../../x"}]
    present = {c["name"]: c["files"] for c in offer["checkpoints"]}
    assert set_aside_copies(here, offer["set_aside"] + other, present) == [f"{aside.name}/step-000002"]
    assert sorted(p.name for p in here.glob("step-*")) == ["step-000003", "step-000004"]
    moved = here.parent / "checkpoints-set-aside" / aside.name / "step-000002" / "model.pt"
    assert moved.read_bytes() == (aside / "step-000002" / "model.pt").read_bytes()
    # the present line holds a step-N with the set-aside one's very files (--resume named it): it stays
    same = {"folder": aside.name, "name": "step-000004", "files": present["step-000004"]}
    assert set_aside_copies(here, [same], present) == [] and (here / "step-000004").is_dir()
    assert set_aside_copies(here, [same], {}) == [f"{aside.name}/step-000004"]  # (what `present` kept)


def test_a_file_resumes_only_when_the_driver_holds_its_true_start(run_dir, tmp_path):
    model = (run_dir / "checkpoints" / "step-000004" / "model.pt").read_bytes()
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    send = [
        ["checkpoints/step-000004/model.pt", 1000, sha(model[:1000])],  # a true prefix: the rest only
        ["metrics.jsonl", 5, sha(b"wrong")],  # not the server's bytes: the whole file again
        ["run.json", 0, sha(b"")],
    ]
    _, frames = converse(run_dir, tmp_path, send)
    assert frames == [(1000, model[1000:]), (0, metrics), (0, (run_dir / "run.json").read_bytes())]


def test_a_checkpoint_pruned_after_the_offer_is_still_served_whole(run_dir, tmp_path):
    model = (run_dir / "checkpoints" / "step-000002" / "model.pt").read_bytes()

    class PruneThenAsk(io.BytesIO):
        def readline(self, *args):  # the live run prunes step-000002 between the offer and the request
            shutil.rmtree(run_dir / "checkpoints" / "step-000002")
            return super().readline(*args)

    request = json.dumps({"send": [["checkpoints/step-000002/model.pt", 0, sha(b"")]]}).encode() + b"\n"
    with open(tmp_path / "wire.out", "w+b") as out:
        serve(run_dir, PruneThenAsk(request), out)
    assert not (run_dir / "checkpoints" / "step-000002").exists()
    assert (tmp_path / "wire.out").read_bytes().endswith(FRAME.pack(0, len(model)) + model)


@pytest.mark.parametrize(
    "path", ["../../../etc/passwd", "checkpoints/step-000006/model.pt", "checkpoints/step-000002/../../run.json"]
)
def test_nothing_off_the_offer_is_served(run_dir, tmp_path, path):
    with pytest.raises(BadRequest, match="not on offer"):
        converse(run_dir, tmp_path, [["run.json", 0, sha(b"")], [path, 0, sha(b"")]])
    offer_line = (tmp_path / "wire.out").read_bytes()
    assert offer_line.count(b"\n") == 1 and offer_line.endswith(b"\n")  # the offer, and not one byte more


@pytest.mark.parametrize(
    ("held", "start"),
    [(None, 0), (b"", 0), (b"x" * 100, 0), (b"abc" + b"y" * 97, 3), (b"abc", 3)],
    ids=["new", "empty", "longer-restarted", "longer-resumed", "resumed"],
)
def test_the_driver_lands_a_frame_after_what_it_holds_and_drops_the_rest(tmp_path, held, start):
    """The driver's half: the frame's bytes land at START, whatever the staging file held beyond START
    is dropped (a file the server restarted, or one that shrank), and the hash covers the whole file."""
    from orchestrator.transfer.wire import Progress, Reader, receive

    body, local = b"0123456789", tmp_path / "f"
    if held is not None:
        local.write_bytes(held)
    hasher = hashlib.sha256((held or b"")[:start])
    reader = Reader(io.BytesIO(FRAME.pack(start, len(body)) + body))
    hasher, n = receive(reader, local, start, hasher, Progress("fetch", len(body), tty=False))
    want = (held or b"")[:start] + body
    assert n == len(body) and local.read_bytes() == want and hasher.hexdigest() == sha(want)


def _outputs_run(tmp_path, files: dict[str, bytes]):
    from enlace.state import runs

    d = tmp_path / "runs" / "r"
    runs.update(d, status="finished", command={"run_name": "r", "command": ["true"], "outputs": ["out/**/*"]})
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    return d


def _frames(rest: bytes, ask: list[str]) -> list[tuple]:
    """(start, bytes) per asked file, and for an output (out/...) the 32-byte sha256 that follows its bytes."""
    frames = []
    for rel in ask:
        start, count = FRAME.unpack(rest[: FRAME.size])
        data, rest = rest[FRAME.size : FRAME.size + count], rest[FRAME.size + count :]
        if rel.startswith("out/"):
            digest, rest = rest[:32].hex(), rest[32:]
            frames.append((start, data, digest))
        else:
            frames.append((start, data))
    assert rest == b""
    return frames


def test_outputs_are_read_when_sent_and_their_sha256_follows_their_bytes(tmp_path):
    """A command run's outputs are only listed for the offer (with their sizes), then each is read once when
    sent, as it is then, many frames to a write, its sha256 after its bytes: that of the whole file, a resumed
    one's too. Frames come in the order asked, mixed with run files; one the driver holds whole and unchanged
    (fetched before) costs nothing but its digest; a start that is not the file's gets the file whole."""
    from enlace.server import fetchserve

    files = {"out/a.txt": b"alpha\n", "out/deep/b.bin": bytes(range(256)) * 20, "out/empty": b""}
    files["out/big.bin"] = bytes(range(251)) * (fetchserve.BATCH // 251 + 9)  # over one write
    files["out/same.bin"] = b"fetched before" * 10
    d = _outputs_run(tmp_path, files)
    (d / "out" / ".partial").write_bytes(b"hidden")  # a partial save: never offered

    class RewriteThenAsk(io.BytesIO):
        def readline(self, *args):  # between the offer and the request, the command rewrites an output
            (d / "out" / "a.txt").write_bytes(b"ALPHA, rewritten\n")
            return super().readline(*args)

    ask = ["out/deep/b.bin", "run.json", "out/big.bin", "out/a.txt", "out/empty", "out/same.bin"]
    send = [[rel, 0, sha(b"")] for rel in ask]
    send[0] = ["out/deep/b.bin", 256, sha(files["out/deep/b.bin"][:256])]  # resumed from its true start
    send[3] = ["out/a.txt", 3, sha(b"xyz")]  # a start that is not the file's: sent whole
    send[5] = ["out/same.bin", 140, sha(files["out/same.bin"])]  # held whole, unchanged
    out_path = tmp_path / "wire.out"
    with open(out_path, "w+b") as out:
        fetchserve.serve(d, RewriteThenAsk(json.dumps({"send": send}).encode() + b"\n"), out, outputs=True)
    line, rest = out_path.read_bytes().split(b"\n", 1)
    offer = json.loads(line)
    assert offer["output_digests"] == "trailing"
    assert offer["outputs"] == {rel: {"bytes": len(data)} for rel, data in files.items()}
    rewritten = b"ALPHA, rewritten\n"
    assert _frames(rest, ask) == [
        (256, files["out/deep/b.bin"][256:], sha(files["out/deep/b.bin"])),
        (0, (d / "run.json").read_bytes()),
        (0, files["out/big.bin"], sha(files["out/big.bin"])),
        (0, rewritten, sha(rewritten)),  # as it is when sent
        (0, b"", sha(b"")),
        (140, b"", sha(files["out/same.bin"])),
    ]


@pytest.mark.parametrize(
    ("swap", "says"),
    [
        ("deleted", r"out/b\.txt was deleted"),
        ("link", r"out/b\.txt is no longer a regular file"),
        ("fifo", "no longer"),
    ],
)
def test_an_output_deleted_or_swapped_after_the_offer_is_one_error(tmp_path, swap, says):
    """Between the offer and the send: deleted, or replaced by a link (to a file outside the run: never followed)
    or a FIFO (never waited on)."""
    import os

    from enlace.errors import EnlaceError
    from enlace.server import fetchserve

    d = _outputs_run(tmp_path, {"out/a.txt": b"a", "out/b.txt": b"b"})
    (tmp_path / "secret").write_bytes(b"not the run's")

    class SwapThenAsk(io.BytesIO):
        def readline(self, *args):
            (d / "out" / "b.txt").unlink()
            if swap == "link":
                (d / "out" / "b.txt").symlink_to(tmp_path / "secret")
            elif swap == "fifo":
                os.mkfifo(d / "out" / "b.txt")
            return super().readline(*args)

    request = json.dumps({"send": [["out/a.txt", 0, sha(b"")], ["out/b.txt", 0, sha(b"")]]}).encode() + b"\n"
    with open(tmp_path / "wire.out", "w+b") as out, pytest.raises(EnlaceError, match=says):
        fetchserve.serve(d, SwapThenAsk(request), out, outputs=True)
    assert b"not the run's" not in (tmp_path / "wire.out").read_bytes()


def test_the_driver_offers_outputs_fetched_before_as_their_start(tmp_path):
    """The driver's plan for outputs: each one's sha256 comes after its bytes, and an output already here at the
    offered size is hard-linked into staging as its start (not a link of the user's, not one of another size);
    a server tree older than the driver lists sha256s in the offer, and only the outputs that differ are asked."""
    from orchestrator.transfer.outputs import STAGING, TRAILING, want_outputs

    root = tmp_path / "dest"
    (root / "out").mkdir(parents=True)
    (root / "out" / "same.txt").write_bytes(b"same")
    (root / "out" / "grown.txt").write_bytes(b"short")
    (root / "out" / "linked.txt").symlink_to(root / "out" / "same.txt")
    sizes = {"out/same.txt": 4, "out/grown.txt": 9, "out/linked.txt": 4, "out/new/n.txt": 3}
    offer = {"output_digests": "trailing", "outputs": {rel: {"bytes": n} for rel, n in sizes.items()}}
    assert want_outputs(str(root), offer) == dict.fromkeys(sizes, TRAILING)
    staged = root / STAGING / "out"
    assert sorted(p.name for p in staged.iterdir()) == ["same.txt"]
    assert (staged / "same.txt").stat().st_ino == (root / "out" / "same.txt").stat().st_ino

    old = {rel: {"bytes": n, "sha256": sha(b"same")} for rel, n in sizes.items()}
    assert want_outputs(str(tmp_path / "dest2"), {"outputs": old}) == {rel: sha(b"same") for rel in sizes}
    assert want_outputs(str(root), {"outputs": {"out/same.txt": old["out/same.txt"]}}) == {}


@pytest.mark.parametrize("case", ["fresh", "leftover-file", "leftover-dir", "leftover-link", "dest-has-it"])
def test_outputs_land_a_whole_directory_at_once_only_when_nothing_else_would(tmp_path, case):
    """The driver's last step: a top directory the destination lacks is renamed in whole (20,000 outputs: one
    rename) only when staging holds exactly the fetched files; anything else there, or the directory already
    at the destination, and they go one by one — a leftover never lands, a file already there stays."""
    from orchestrator.transfer.outputs import STAGING, install_outputs

    root, rels = tmp_path / "dest", ["out/a.txt", "out/deep/b.txt", "top.txt"]
    for rel in rels:
        (root / STAGING / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / STAGING / rel).write_text(rel)
    if case == "leftover-file":  # an earlier, interrupted fetch's output the server no longer offers
        (root / STAGING / "out" / "gone.txt").write_text("stale")
    if case == "leftover-dir":
        (root / STAGING / "out" / "empty").mkdir()
    if case == "leftover-link":  # os.walk lists a link to a directory but does not enter it
        (root / STAGING / "out" / "elsewhere").symlink_to(tmp_path)
    if case == "dest-has-it":
        (root / "out").mkdir(parents=True)
        (root / "out" / "mine.txt").write_text("kept")
    install_outputs(str(root), rels)
    assert all((root / rel).read_text() == rel for rel in rels)
    landed = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if STAGING not in p.parts)
    extra = {"dest-has-it": ["out/mine.txt"]}.get(case, [])
    assert landed == sorted(["out", "out/deep", *rels, *extra]), landed
    assert (root / STAGING / "out").exists() == (case != "fresh")  # renamed away whole only when fresh


@pytest.mark.parametrize("case", ["unchanged", "grown", "changed"])
def test_the_driver_never_writes_through_a_copy_fetched_before(tmp_path, case):
    """An output here is staged as a hard link to itself (its start): unchanged, nothing is opened (not even its
    mtime moves); grown on the server since the offer (a frame from its end with more bytes), or changed (a frame
    from 0), the staged name becomes a file of its own first: the copy here, and any other link to it, stays as it
    was until the new one is verified and installed."""
    import os

    from orchestrator.transfer.wire import Progress, Reader, receive

    mine, backup, staged = tmp_path / "out.txt", tmp_path / "backup.txt", tmp_path / "staged.txt"
    mine.write_bytes(b"line1\n")
    os.utime(mine, ns=(10**18, 10**18))
    os.link(mine, backup)  # the user's own second name for it (cp -al)
    os.link(mine, staged)
    start, body = {"unchanged": (6, b""), "grown": (6, b"line2\n"), "changed": (0, b"LINE1\n")}[case]
    hasher = hashlib.sha256(b"line1\n")
    reader = Reader(io.BytesIO(FRAME.pack(start, len(body)) + body))
    hasher, n = receive(reader, str(staged), 6, hasher, Progress("fetch", len(body), tty=False))
    want = b"line1\n"[:start] + body
    assert n == len(body) and staged.read_bytes() == want and hasher.hexdigest() == sha(want)
    assert mine.read_bytes() == backup.read_bytes() == b"line1\n" and mine.stat().st_mtime_ns == 10**18
    assert (staged.stat().st_ino == mine.stat().st_ino) == (case == "unchanged")


def test_an_output_whose_trailing_sha256_disagrees_is_refused_and_not_kept(tmp_path):
    from orchestrator.transfer.fetch import CorruptCheckpoint, _converse_once
    from orchestrator.transfer.outputs import TRAILING

    offer = (
        json.dumps({"files": {}, "outputs": {"out/a.txt": {"bytes": 5}}, "output_digests": "trailing"}).encode() + b"\n"
    )
    frame = FRAME.pack(0, 5) + b"hello"
    plan = lambda offer: {"out/a.txt": TRAILING}
    staging = tmp_path / "staging"
    good = CannedWire(offer + frame + hashlib.sha256(b"hello").digest())
    _, want, got = _converse_once(canned_session(good), "r", staging, plan, lambda: None, False, True)
    assert got == 5 and want == {"out/a.txt": sha(b"hello")} and (staging / "out/a.txt").read_bytes() == b"hello"
    bad = CannedWire(offer + frame + hashlib.sha256(b"hellO").digest())
    with pytest.raises(CorruptCheckpoint, match=r"out/a\.txt: sha256 does not match"):
        _converse_once(canned_session(bad), "r", staging, plan, lambda: None, False, True)
    assert not (staging / "out/a.txt").exists()


def test_a_server_that_stops_in_mid_stream_is_one_error_in_its_own_words(tmp_path):
    """An output deleted on the server while it is fetched ends fetch-serve; the user reads why, not only that the
    stream ended."""
    from enlace.errors import EnlaceError
    from orchestrator.transfer.fetch import _converse_once
    from orchestrator.transfer.outputs import TRAILING

    offer = (
        json.dumps({"files": {}, "outputs": {"out/a.txt": {"bytes": 5}}, "output_digests": "trailing"}).encode() + b"\n"
    )
    said = "Error: fetch: the output out/a.txt was deleted on the server while it was fetched\n"
    wire = CannedWire(offer + FRAME.pack(0, 5) + b"he", code=1, err=said)
    with pytest.raises(EnlaceError, match=r"stopped in mid-transfer \(exit 1\): Error: fetch: the output out/a\.txt"):
        _converse_once(
            canned_session(wire), "r", tmp_path, lambda offer: {"out/a.txt": TRAILING}, lambda: None, False, True
        )


def test_a_connection_lost_in_mid_stream_is_transient_so_the_fetch_resumes(tmp_path):
    """The stream's end with ssh's own failure behind it (system ssh's finish raises it: exit 255, no marker of the
    command's own) is Transient, which retrying() resumes; before, it was reported as the server's end."""
    from orchestrator.errors import Transient
    from orchestrator.transfer.fetch import _converse_once
    from orchestrator.transfer.outputs import TRAILING

    class Dropped(CannedWire):
        def finish(self):
            raise Transient("ssh: connection to gpu1 lost", started=True)

    offer = json.dumps({"files": {}, "outputs": {"out/a.txt": {"bytes": 5}}, "output_digests": "trailing"}).encode()
    wire = Dropped(offer + b"\n" + FRAME.pack(0, 5) + b"he")
    with pytest.raises(Transient, match="connection to gpu1 lost"):
        _converse_once(
            canned_session(wire), "r", tmp_path, lambda offer: {"out/a.txt": TRAILING}, lambda: None, False, True
        )
    assert (tmp_path / "out" / "a.txt").read_bytes() == b"he"  # what arrived stays: the next try resumes from it


def test_the_offer_names_a_commands_output_globs_so_a_fetch_can_say_they_matched_nothing(tmp_path):
    from enlace.server.fetchserve import open_offer
    from enlace.state import runs

    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    runs.update(
        run_dir, status="finished", command={"command": ["python", "t.py"], "run_name": "r", "outputs": ["out/*"]}
    )
    offer, _ = open_offer(run_dir, outputs=True)
    assert offer["command"] and offer["outputs"] == {} and offer["output_globs"] == ["out/*"]


def test_a_latest_that_would_lead_out_of_the_run_is_refused(tmp_path, monkeypatch):
    """A server's offer named checkpoints/latest as `../../elsewhere/step-000007`, unchecked: local tools then
    loaded a checkpoint outside the fetched run. (A crafted offer stands in for a hostile server.)"""
    from types import SimpleNamespace

    from enlace.errors import EnlaceError
    from orchestrator.transfer import fetch

    elsewhere = tmp_path / "elsewhere" / "step-000007"
    save_checkpoint(elsewhere.parent, 7, {"model.pt": b"not this run's"}, keep=5)
    listed = [{"name": "step-000001", "files": {}}]
    offer = {"checkpoints": listed, "latest": "../../elsewhere/step-000007", "files": {}, "run_dir": "runs/r"}
    monkeypatch.setattr(fetch, "_converse", lambda session, name, staging, plan, **kw: (offer, plan(offer), 0))
    session = SimpleNamespace(host=SimpleNamespace(name="evil", local=False))
    said = re.escape("refusing checkpoint name '../../elsewhere/step-000007' from the server")
    with pytest.raises(EnlaceError, match=said):
        fetch.fetch(session, "r", tmp_path / "runs" / "r", all_checkpoints=False)
    assert not (tmp_path / "runs" / "r" / "checkpoints" / "latest").exists()


def test_outputs_that_would_be_one_file_on_a_case_folding_disk_are_refused(tmp_path, monkeypatch):
    """A laptop's disk that does not tell upper from lower case (macOS, Windows by default) took the server's
    `Out.txt` and `out.txt` as one file: the second replaced the first, silently. The probe is real here (this
    disk tells them apart); such a disk cannot exist here, so a stand-in answers for it below."""
    from enlace.errors import EnlaceError
    from orchestrator.transfer import outputs

    dest = tmp_path / "runs" / "r"  # not made yet: its nearest folder is asked
    assert outputs.folds_case(str(dest)) is False and list(tmp_path.iterdir()) == []  # the probe leaves nothing
    distinct = ["train.log", "run.json", "out/a.txt", "out/b.txt", "logs/a.txt"]
    monkeypatch.setattr(outputs, "folds_case", lambda root: True)
    outputs.one_name_each(str(dest), distinct)  # nothing folds together: nothing refused
    for one, two in [
        ("out/a.txt", "out/A.txt"),
        ("out/a.txt", "OUT/b.txt"),
        ("train.log", "Train.log"),
        ("caf\u00e9.txt", "cafe\u0301.txt"),
    ]:  # a name, a folder, a run file, NFC against NFD
        with pytest.raises(EnlaceError, match=r"would be one file in .* does not tell upper from lower case"):
            outputs.one_name_each(str(dest), [*distinct, two] if one in distinct else [one, two])
    outputs.one_name_each(str(dest), ["stra\u00dfe.txt", "STRASSE.txt"])  # ß is no ss to these disks
    asked = []
    monkeypatch.setattr(outputs, "folds_case", lambda root: asked.append(root) or False)
    outputs.one_name_each(str(dest), [f"{d}/{i}.txt" for d in ("out", "OUT") for i in range(100)])
    assert asked == [str(dest)]  # a disk that tells them apart takes them all, asked once


def test_a_corrupt_checkpoint_is_left_out_and_the_others_still_land(tmp_path):
    """fetch --all where the server's newest checkpoint is corrupt installed none, not even the intact older
    one, and its advice (`--all`) was what had just failed: the bad one is now left out, said after the rest."""
    from orchestrator.transfer.fetch import _converse_once

    bodies = {  # in the plan's order: each checkpoint's file, then its MANIFEST
        "checkpoints/step-000010/model.pt": b"old, intact",
        "checkpoints/step-000010/MANIFEST": b"{}",
        "checkpoints/step-000020/model.pt": b"new, bad",
        "checkpoints/step-000020/MANIFEST": b"{}",
    }
    listed = [
        {
            "name": f"step-0000{n}0",
            "files": {"model.pt": {"bytes": len(bodies[f"checkpoints/step-0000{n}0/model.pt"])}},
            "manifest_bytes": 2,
        }
        for n in (1, 2)
    ]
    wire = json.dumps({"files": {}, "checkpoints": listed, "latest": "step-000020"}).encode() + b"\n"
    for body in bodies.values():
        wire += FRAME.pack(0, len(body)) + body
    plan = lambda offer: {
        "checkpoints/step-000010/model.pt": sha(b"old, intact"),
        "checkpoints/step-000010/MANIFEST": None,
        "checkpoints/step-000020/model.pt": sha(b"what the server's MANIFEST says"),
        "checkpoints/step-000020/MANIFEST": None,
    }
    staging = tmp_path / "staging"
    got_offer, want, _ = _converse_once(
        canned_session(CannedWire(wire)), "r", staging, plan, lambda: None, False, False
    )
    assert got_offer["corrupt"] == ["checkpoints/step-000020/model.pt"]
    assert sorted(want) == ["checkpoints/step-000010/MANIFEST", "checkpoints/step-000010/model.pt"]
    assert not (staging / "checkpoints/step-000020/model.pt").exists()
    assert (staging / "checkpoints/step-000010/model.pt").read_bytes() == b"old, intact"


def test_the_would_mix_refusal_names_the_run_the_folder_holds(tmp_path):
    """`fetch smoke-cpu-deterministic --dest runs/smoke-cpu` said the folder held smoke-cpu-deterministic."""
    from orchestrator.errors import UsageError
    from orchestrator.transfer.fetch import ORIGIN, _claim

    (tmp_path / ORIGIN).write_text(json.dumps({"host": "local", "run_dir": "/srv/x/runs/smoke-cpu"}))
    with pytest.raises(
        UsageError,
        match=r"holds smoke-cpu fetched from local \(/srv/x/runs/smoke-cpu\); fetching "
        r"smoke-cpu-deterministic from local",
    ):
        _claim(tmp_path, "local", "/srv/x/runs/smoke-cpu-deterministic", "smoke-cpu-deterministic")
