"""`enlace export`: a trained checkpoint as Hugging Face transformers' GPT-2 (same logits, same greedy bytes
as `enlace sample`) and as plain safetensors (the checkpoint's tensors exactly); a corrupt checkpoint is
refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from support.cli import enlace
from support.configs import write_run

from enlace.tools.sample import find_checkpoint, generate, load_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(module_project):
    """A small model trained a few steps, with a context long enough for a 64-byte greedy generation."""
    write_run(
        module_project,
        "exp",
        model={"seq_len": 96, "n_layer": 2, "n_head": 2, "d_model": 32, "dropout": 0.1},
        training={"max_steps": 12, "eval_every": 6},
    )
    enlace(module_project, "train", "exp")
    return module_project


def test_hf_export_loads_in_transformers_with_the_same_logits_and_greedy_bytes(trained, tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is in the dev extra")
    out = tmp_path / "hf"
    enlace(trained, "export", "exp", "--format", "hf", "--out", str(out))
    assert sorted(p.name for p in out.iterdir()) == [
        "MANIFEST",  # each file's sha256: a copy of the export is verifiable (enlace-remote export checks it)
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ours, _ = load_model(find_checkpoint(trained / "runs" / "exp"), torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        x = torch.randint(0, 256, (1, 96), generator=g)
        with torch.no_grad():
            a, _ = ours(x)
            b = hf(x).logits
        assert (a - b).abs().max().item() < 1e-5
    prompt = b"def main():\n    "
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok(prompt.decode(), return_tensors="pt").input_ids
    assert ids[0].tolist() == list(prompt)  # the ids are the bytes themselves
    with torch.no_grad():
        greedy = hf.generate(ids, max_new_tokens=64, do_sample=False)[0, len(prompt) :].tolist()
    assert bytes(greedy) == generate(ours, prompt, 64, 0.0, None, 0)  # enlace sample --temperature 0
    cli = json.loads(
        enlace(
            trained, "sample", "exp", "--prompt", prompt.decode(), "--bytes", "64", "--temperature", "0", "--json"
        ).stdout
    )
    assert cli["text"] == (prompt + bytes(greedy)).decode("utf-8", errors="replace")  # the CLI's own bytes
    card = (out / "README.md").read_text()
    assert "step 12 of 12" in card and "sha256" in card and "val bits/byte" in card


def test_safetensors_export_equals_the_checkpoints_tensors(trained, tmp_path):
    from safetensors.torch import load_file

    from enlace.train.checkpoint import load_checkpoint

    out = tmp_path / "st"
    enlace(trained, "export", "exp", "--format", "safetensors", "--out", str(out))
    tensors = load_file(out / "model.safetensors")
    saved = load_checkpoint(find_checkpoint(trained / "runs" / "exp"))["model.pt"]
    meta = json.loads((out / "enlace.json").read_text())
    assert meta["tied"] == {"head.weight": "tok_emb.weight"} and meta["model"]["seq_len"] == 96
    for name, value in saved.items():
        stored = tensors[meta["tied"].get(name, name)]
        assert stored.dtype == value.dtype and torch.equal(stored, value), name


def test_a_corrupt_checkpoint_is_refused_in_one_line(trained, tmp_path):
    ckpt = find_checkpoint(trained / "runs" / "exp")
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    model = bad / "model.pt"
    model.write_bytes(model.read_bytes()[:-10] + b"0123456789")
    out = enlace(trained, "export", str(bad), "--out", str(tmp_path / "x"), check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "does not match its sha256 in MANIFEST" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_an_out_that_is_a_dangling_link_or_cannot_be_made_is_one_line(trained, tmp_path):
    """Seen: `export --out` naming a dangling symlink ended in a NotADirectoryError traceback."""
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_text("a file, not a directory")
    for out_dir, words in ((tmp_path / "dangling", "is a link"), (tmp_path / "file" / "x", "cannot create")):
        out = enlace(trained, "export", "exp", "--out", str(out_dir), check=False)
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
        assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    out = enlace(trained, "export", "exp", "--out", str(tmp_path), check=False)  # exists: usage, as the driver's
    assert out.returncode == 2 and "exists — export writes a new directory" in out.stderr, out.stderr
    out = enlace(trained, "export", "exp", check=False)  # neither --out nor --in-run
    assert out.returncode == 2 and "say where the export goes" in out.stderr, out.stderr


def test_the_docs_example_runs_as_written(trained, tmp_path):
    """docs/export.md's Python block and the export's model card's, run as a user runs them, against a fresh
    export of a model whose seq_len is smoke-cpu's (64): both crashed in transformers (prompt 4 + 64 new bytes
    past 64 positions)."""
    import re
    import subprocess
    import sys

    from support import REPO

    block = re.search(r"```python\n(.*?)```", (REPO / "docs" / "export.md").read_text(), re.S).group(1)
    write_run(
        trained, "short", model={"seq_len": 64, "n_layer": 1, "n_head": 2, "d_model": 32}, training={"max_steps": 3}
    )
    enlace(trained, "train", "short")
    enlace(trained, "export", "short", "--out", str(tmp_path / "exports" / "smoke-cpu"))
    card = (tmp_path / "exports" / "smoke-cpu" / "README.md").read_text()  # the model card's own example too
    card_block = re.search(r"```python\n(.*?)```", card, re.S).group(1).replace("THIS_DIR", "exports/smoke-cpu")
    both = block + "\n" + card_block
    out = subprocess.run([sys.executable, "-c", both], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("def ") and out.stdout.count("def ") >= 2, out.stdout


def test_an_in_run_export_is_of_the_checkpoint_not_of_its_step_name(project):
    """Seen: after `--resume none` the new line's step-000004 got the old line's export back (matched by
    step name alone), weights that then lay only in checkpoints-set-aside/."""
    write_run(project, "lines", training={"max_steps": 4, "eval_every": 0}, checkpoint={"every": 4})
    enlace(project, "train", "lines")
    first = json.loads(enlace(project, "export", "lines", "--in-run", "--format", "safetensors", "--json").stdout)
    again = json.loads(enlace(project, "export", "lines", "--in-run", "--format", "safetensors", "--json").stdout)
    assert again["name"] == first["name"] and first["name"].startswith("safetensors-step-000004-")  # kept
    enlace(project, "train", "lines", "--resume", "none", "--set", "runtime.seed=7")  # other weights
    second = json.loads(enlace(project, "export", "lines", "--in-run", "--format", "safetensors", "--json").stdout)
    assert second["name"] != first["name"] and second["checkpoint"] == "step-000004", second
    exports = project / "runs" / "lines" / "exports"
    new, old = (exports / second["name"] / "model.safetensors"), (exports / first["name"] / "model.safetensors")
    assert new.read_bytes() != old.read_bytes()  # the new line's weights
    ckpt = project / "runs" / "lines" / "checkpoints" / "step-000004"
    from safetensors.torch import load_file

    assert torch.equal(
        load_file(new)["tok_emb.weight"], torch.load(ckpt / "model.pt", weights_only=True)["tok_emb.weight"]
    )
