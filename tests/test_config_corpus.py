"""60 malformed configs: each is refused by `check-config` with exit 2 and one line naming the file,
the key and the fix — and `train` refuses it the same way, before building anything (no traceback)."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner
from support.configs import write_run

from enlace.cli import main

# (case id, sections merged over TINY, the key the message must name, a word of the fix or problem)
CASES = [
    ("beta1-one", {"optim": {"beta1": 1.0}}, "optim.beta1", "[0, 1)"),
    ("beta1-above", {"optim": {"beta1": 1.5}}, "optim.beta1", "[0, 1)"),
    ("beta1-negative", {"optim": {"beta1": -0.1}}, "optim.beta1", "[0, 1)"),
    ("beta2-one", {"optim": {"beta2": 1}}, "optim.beta2", "[0, 1)"),
    ("eps-zero", {"optim": {"eps": 0.0}}, "optim.eps", "above 0"),
    ("eps-negative", {"optim": {"eps": -1e-8}}, "optim.eps", "above 0"),
    ("lr-nan", {"optim": {"learning_rate": float("nan")}}, "optim.learning_rate", "finite"),
    ("lr-inf", {"optim": {"learning_rate": float("inf")}}, "optim.learning_rate", "finite"),
    ("lr-negative", {"optim": {"learning_rate": -1e-3}}, "optim.learning_rate", "above 0"),
    ("lr-zero", {"optim": {"learning_rate": 0}}, "optim.learning_rate", "above 0"),
    ("min-lr-above-lr", {"optim": {"min_lr": 0.1, "learning_rate": 0.01}}, "optim.min_lr", "floor"),
    ("min-lr-negative", {"optim": {"min_lr": -1e-4}}, "optim.min_lr", "negative"),
    ("weight-decay-negative", {"optim": {"weight_decay": -0.1}}, "optim.weight_decay", "negative"),
    ("grad-clip-nan", {"optim": {"grad_clip": float("nan")}}, "optim.grad_clip", "finite"),
    ("grad-clip-negative", {"optim": {"grad_clip": -1.0}}, "optim.grad_clip", "negative"),
    ("warmup-negative", {"optim": {"warmup_steps": -1}}, "optim.warmup_steps", "negative"),
    ("warmup-beyond-max", {"optim": {"warmup_steps": 500}}, "optim.warmup_steps", "max_steps"),
    ("lr-string", {"optim": {"learning_rate": "fast"}}, "optim.learning_rate", "a number"),
    (
        "fp16-scale-nan",
        {"runtime": {"precision": "fp16", "fp16_init_scale": float("nan")}},
        "runtime.fp16_init_scale",
        "finite",
    ),
    ("fp16-scale-zero", {"runtime": {"precision": "fp16", "fp16_init_scale": 0}}, "runtime.fp16_init_scale", "above 0"),
    (
        "fp16-scale-inf",
        {"runtime": {"precision": "fp16", "fp16_init_scale": float("inf")}},
        "runtime.fp16_init_scale",
        "finite",
    ),
    ("vocab-below-bytes", {"model": {"vocab_size": 100}}, "model.vocab_size", "256"),
    ("vocab-zero", {"model": {"vocab_size": 0}}, "model.vocab_size", "at least 1"),
    ("seed-negative", {"runtime": {"seed": -1}}, "runtime.seed", "64-bit"),
    ("seed-too-big", {"runtime": {"seed": 2**64}}, "runtime.seed", "64-bit"),
    ("seed-float", {"runtime": {"seed": 1.5}}, "runtime.seed", "integer"),
    ("d-model-huge", {"model": {"d_model": 10**9, "n_head": 1}}, "model.d_model", "TiB"),
    ("layers-huge", {"model": {"n_layer": 10**7, "d_model": 1024, "n_head": 8}}, "model.n_layer", "TiB"),
    ("seq-len-huge", {"model": {"seq_len": 10**8}}, "model.seq_len", "TiB"),
    ("batch-huge", {"training": {"batch_size": 10**9}}, "training.batch_size", "TiB"),
    ("d-model-zero", {"model": {"d_model": 0}}, "model.d_model", "at least 1"),
    ("n-head-not-divisor", {"model": {"d_model": 30, "n_head": 4}}, "model.n_head", "divides"),
    ("n-head-zero", {"model": {"n_head": 0}}, "model.n_head", "at least 1"),
    ("seq-len-zero", {"model": {"seq_len": 0}}, "model.seq_len", "at least 1"),
    ("dropout-one", {"model": {"dropout": 1.0}}, "model.dropout", "[0, 1)"),
    ("dropout-negative", {"model": {"dropout": -0.5}}, "model.dropout", "[0, 1)"),
    ("dropout-nan", {"model": {"dropout": float("nan")}}, "model.dropout", "finite"),
    ("batch-zero", {"training": {"batch_size": 0}}, "training.batch_size", "at least 1"),
    ("batch-string", {"training": {"batch_size": "8"}}, "training.batch_size", "integer"),
    ("batch-bool", {"training": {"batch_size": True}}, "training.batch_size", "integer"),
    ("grad-accum-zero", {"training": {"grad_accum": 0}}, "training.grad_accum", "at least 1"),
    ("max-steps-zero", {"training": {"max_steps": 0}}, "training.max_steps", "at least 1"),
    ("log-every-zero", {"training": {"log_every": 0}}, "training.log_every", "at least 1"),
    ("eval-every-negative", {"training": {"eval_every": -5}}, "training.eval_every", "negative"),
    ("eval-batches-zero", {"training": {"eval_batches": 0}}, "training.eval_batches", "at least 1"),
    ("ckpt-every-negative", {"checkpoint": {"every": -1}}, "checkpoint.every", "negative"),
    ("ckpt-keep-zero", {"checkpoint": {"keep": 0}}, "checkpoint.keep", "at least 1"),
    ("threads-negative", {"runtime": {"threads": -2}}, "runtime.threads", "negative"),
    ("precision-unknown", {"runtime": {"precision": "fp8"}}, "runtime.precision", "fp32, bf16, fp16"),
    ("device-unknown", {"runtime": {"device": "tpu"}}, "runtime.device", "auto, cpu, cuda"),
    ("compile-string", {"runtime": {"compile": "yes"}}, "runtime.compile", "true or false"),
    (
        "deterministic-compile",
        {"runtime": {"deterministic": True, "compile": True}},
        "runtime.compile",
        "compile: false",
    ),
    ("unknown-key-typo", {"optim": {"lerning_rate": 1e-3}}, "optim.lerning_rate", "learning_rate"),
    ("unknown-section", {"trainig": {"batch_size": 2}}, "trainig", "training"),
    ("section-not-mapping", {"model": [1, 2]}, "model", "mapping"),
    ("run-name-hostile", {"run_name": "x; rm -rf /"}, "run_name", "[A-Za-z0-9._-]"),
    ("run-name-too-long", {"run_name": "a" * 65}, "run_name", "1-64"),
    ("profile-missing", {"profile": "gtx9000"}, "profile", "cpu"),
]
RAW = [  # whole files that are not valid configs at all
    ("duplicate-section", b"data: tiny\nprofile: cpu\nmodel: {d_model: 32}\nmodel: {n_head: 2}\n", "model", "twice"),
    ("not-utf8", b"data: tiny\nprofile: cpu\nrun_name: caf\xe9\n", "", "UTF-8"),
    ("tab-indent", b"data: tiny\nprofile: cpu\nmodel:\n\tn_layer: 2\n", "line 4", "indent with spaces"),
    ("bad-syntax", b"data: tiny\nprofile: cpu\nmodel: {n_layer: 2\n", "not valid YAML", "fix the syntax"),
]


def _invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=True)


@pytest.mark.parametrize(("case", "sections", "key", "fix"), CASES, ids=[c[0] for c in CASES])
def test_malformed_config_refused_in_one_line_by_check_config_and_train(project, case, sections, key, fix):
    path = write_run(project, case, **sections)
    _assert_refused(project, case, path, key, fix)


@pytest.mark.parametrize(("case", "raw", "key", "fix"), RAW, ids=[c[0] for c in RAW])
def test_malformed_file_refused(project, case, raw, key, fix):
    path = project / "configs" / "runs" / f"{case}.yaml"
    path.write_bytes(raw)
    _assert_refused(project, case, path, key, fix)


def _assert_refused(project, case, path, key, fix):
    for verb in ("check-config", "train"):
        res = _invoke(verb, case, "--root", str(project))
        assert res.exit_code == 2, (verb, res.output, res.exception)
        assert isinstance(res.exception, SystemExit), res.exception  # a ClickException, never a traceback
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
        assert path.name in lines[0] or "configs/profiles" in lines[0], lines[0]  # the file that set it
        assert str(project) not in lines[0], lines[0]  # named as in the project, as every other error names it
        assert key in lines[0] and fix in lines[0], lines[0]
    assert not (project / "runs" / case).exists()  # train refused before writing anything


def test_corpus_is_sixty_cases():
    assert len(CASES) + len(RAW) >= 60


def test_device_cuda_error_names_the_file_that_set_it(project):
    """On this CPU-only machine: cuda set by the run file is blamed on the run file, not the profile."""
    write_run(project, "wantcuda", runtime={"device": "cuda"})
    res = _invoke("train", "wantcuda", "--root", str(project))
    assert res.exit_code == 2 and "configs/runs/wantcuda.yaml: runtime.device" in res.output, res.output
    res = _invoke("train", "wantcuda", "--root", str(project), "--set", "runtime.device=cuda")
    assert res.exit_code == 2 and "--set: runtime.device" in res.output


def test_fp16_on_cpu_is_a_warning_not_an_error(project):
    write_run(project, "half", runtime={"device": "cpu", "precision": "fp16"})
    res = CliRunner().invoke(main, ["check-config", "half", "--root", str(project), "--json"])
    assert res.exit_code == 0
    doc = yaml.safe_load(res.stdout)
    assert "20x slower" in doc["warnings"][0] and "runtime.precision" in doc["warnings"][0]


def test_a_run_config_linked_outside_the_project_or_to_a_device_is_refused(tmp_path):
    """What runs must be what was committed: a run file that is a link to a file outside the project trained
    from that unversioned file; one linked to /dev/zero was 'not found … one of: …, zero'."""
    from enlace.config.schema import load_config
    from enlace.errors import ConfigError

    root = tmp_path / "proj"
    (root / "configs" / "runs").mkdir(parents=True)
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text("data: smoke\nprofile: cpu\n")
    (root / "configs" / "runs" / "linked.yaml").symlink_to(outside)
    (root / "configs" / "runs" / "zero.yaml").symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match=r"is a link to .*elsewhere\.yaml, outside the project") as e:
        load_config("linked", root=root)
    assert "commit the file itself" in str(e.value)
    with pytest.raises(ConfigError, match="not a regular file") as e:
        load_config("zero", root=root)
    assert "one of:" not in str(e.value)


def test_a_key_a_set_item_made_needed_blames_the_set_item(project):
    """`--set data.kind=shards` without a shard_dir blamed "defaults" (where shard_dir's empty value comes from)."""
    write_run(project, "kinds")
    res = _invoke("check-config", "kinds", "--root", str(project), "--set", "data.kind=shards")
    assert res.exit_code == 2 and "Error: --set: data.shard_dir: kind: shards needs shard_dir" in res.output, res.output
