"""Config composition, precedence and every class of error (file, key and fix named)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from support import REPO
from support.cli import enlace
from support.configs import write_run

from enlace.config.machine import check_environment
from enlace.config.schema import load_config
from enlace.errors import ConfigError

SHIPPED_RUNS = sorted(p.stem for p in (REPO / "configs" / "runs").glob("*.yaml"))


@pytest.mark.parametrize("run", SHIPPED_RUNS)
def test_every_shipped_run_config_loads(run):
    cfg = load_config(run, root=REPO)  # values only: a distillation run loads without its teacher here
    assert cfg.run_name == run  # each names itself after its file
    teacher = cfg.distill.teacher
    if teacher and not (REPO / "runs" / teacher / "checkpoints" / "latest").exists():
        with pytest.raises(ConfigError, match=f"train the teacher first \\(enlace-remote launch {teacher} on that"):
            check_environment(cfg)  # where the run starts, a missing teacher is said


def test_precedence_set_over_run_over_profile_over_data_over_defaults(project):
    (project / "configs" / "profiles" / "p.yaml").write_text(
        "runtime: {precision: bf16, seed: 7}\ntraining: {batch_size: 3, log_every: 4}\n"
    )
    (project / "configs" / "data" / "d.yaml").write_text("kind: bytes\npaths: ['data/tiny/*.txt']\nval_fraction: 0.2\n")
    write_run(project, "prec", base={}, data="d", profile="p", training={"batch_size": 5}, runtime={"seed": 9})
    cfg = load_config("prec", ["runtime.seed=11"], root=project)
    assert cfg.runtime.seed == 11  # --set beats the run file
    assert cfg.training.batch_size == 5  # run file beats the profile
    assert cfg.training.log_every == 4  # profile beats defaults
    assert cfg.runtime.precision == "bf16"
    assert cfg.data.val_fraction == 0.2  # data file beats defaults
    assert cfg.training.max_steps == 200  # defaults
    assert cfg.run_name == "prec"  # run_name defaults to the file stem


def test_run_named_by_path_and_set_can_switch_profile(project, tmp_path):
    path = write_run(project, "bypath")
    moved = tmp_path / "elsewhere.yaml"
    moved.write_text(path.read_text())
    cfg = load_config(str(moved), ["profile=rtx2060"], root=project)
    assert cfg.run_name == "elsewhere" and cfg.runtime.precision == "fp16"


def _error(project, *overrides, **sections) -> ConfigError:
    write_run(project, "bad", **sections)
    with pytest.raises(ConfigError) as exc:
        load_config("bad", list(overrides), root=project)
    return exc.value


def test_unknown_key_names_file_key_and_closest(project):
    e = _error(project, optim={"lerning_rate": 1e-3})
    assert e.source == "configs/runs/bad.yaml" and e.key == "optim.lerning_rate"
    assert "'learning_rate'" in e.message and "\n" not in e.message


def test_unknown_section_and_unknown_set_key(project):
    assert "'training'" in _error(project, trainig={"batch_size": 2}).message
    e = _error(project, "training.bach_size=3")
    assert e.source == "--set" and "'batch_size'" in e.message
    # another trainer's name for a key: spelling alone pointed `optim.lr` at 'min_lr'
    assert "did you mean 'learning_rate'?" in _error(project, "optim.lr=-1").message
    assert "did you mean 'd_model'?" in _error(project, "model.n_embd=64").message


def test_a_mistyped_command_key_is_said_to_be_your_own_commands(project):
    """`comand:` made the file enlace's trainer's, whose keys were listed (without `command`, `data` twice)."""
    e = _error(project, comand=["python", "train.py"])
    assert "comand: unknown key — did you mean 'command'? (a run file of your own command" in e.message, e.message
    e = _error(project, zzzz=1)
    assert e.message.endswith(
        "valid keys: checkpoint, data, distill, logging, model, optim, profile, run_name, runtime, training"
    )
    assert "did you mean 'data'?" in _error(project, dat="tiny").message  # the trainer's own key, when nearer
    # a section's key at the top level says where it goes (a fault hunt: `devices:` and `steps:` were pointed at
    # your own command's `device:` and `outputs:`, and `device:` at itself)
    for key, home in (("devices", "runtime.device"), ("device", "runtime.device"), ("steps", "training.max_steps")):
        e = _error(project, model={"n_layer": 2}, **{key: 1})
        assert f"did you mean '{home}'? (it goes under its section" in e.message, e.message
    e = _error(project, model={"n_layer": 2}, outputz=["a"])  # a trainer's file: not pointed at `outputs:`
    assert "own command" not in e.message, e.message
    # a grid given to launch (or train): one value there; several are a sweep
    e = _error(project, "optim.learning_rate=1e-3,3e-3")
    assert e.message.endswith(
        "a grid of values is a sweep: enlace-remote sweep RUN --set optim.learning_rate=1e-3,3e-3"
    )


def test_unknown_key_in_profile_names_the_profile(project):
    (project / "configs" / "profiles" / "cpu.yaml").write_text("runtime: {precison: fp32}\n")
    e = _error(project)
    assert e.source == "configs/profiles/cpu.yaml" and "'precision'" in e.message


def test_wrong_types(project):
    e = _error(project, training={"batch_size": "eight"})
    assert e.key == "training.batch_size" and "integer" in e.message
    e = _error(project, runtime={"precision": "fp8"})
    assert "fp32, bf16, fp16" in e.message
    e = _error(project, runtime={"compile": "yes"})
    assert "true or false" in e.message


def test_missing_referenced_files(project):
    e = _error(project, data="nope")
    assert e.key == "data" and "tiny" in e.message and "smoke" in e.message  # lists what exists
    e = _error(project, profile="gtx9000")
    assert "profile config 'gtx9000' not found" in e.message and "rtx2060" in e.message
    with pytest.raises(ConfigError, match="run config 'ghost' not found"):
        load_config("ghost", root=project)


def test_bad_combinations(project):
    e = _error(project, runtime={"deterministic": True, "compile": True})
    assert e.key == "runtime.compile" and "autotun" in e.message
    assert "divisible" in _error(project, model={"d_model": 30, "n_head": 4}).message
    assert "min_lr" in _error(project, optim={"min_lr": 1.0, "learning_rate": 0.1}).message


def test_invalid_run_name_refused(project):
    e = _error(project, run_name="x; touch /tmp/pwned")
    assert e.key == "run_name" and "[A-Za-z0-9._-]" in e.message


def test_bad_yaml_names_line(project):
    (project / "configs" / "runs" / "broken.yaml").write_text("data: tiny\nmodel: [unclosed\n")
    with pytest.raises(ConfigError, match="line"):
        load_config("broken", root=project)


def test_fingerprint_ignores_logging_but_not_model(project):
    write_run(project, "fp")
    base = load_config("fp", root=project).fingerprint()
    assert load_config("fp", ["training.log_every=7"], root=project).fingerprint() == base
    assert load_config("fp", ["model.d_model=64"], root=project).fingerprint() != base


def test_cli_typo_is_one_line_exit_2_no_traceback(project):
    write_run(project, "typo", optim={"lerning_rate": 1e-3})
    out = subprocess.run(
        [sys.executable, "-m", "enlace", "check-config", "typo", "--root", str(project)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "configs/runs/typo.yaml" in lines[0] and "lerning_rate" in lines[0] and "'learning_rate'" in lines[0]


def test_cli_check_config_json(project):
    write_run(project, "ok")
    out = subprocess.run(
        [sys.executable, "-m", "enlace", "check-config", "ok", "--json", "--root", str(project)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    assert doc["ok"] is True and doc["config"]["model"]["d_model"] == 32


def test_set_key_errors_name_each_section_once(project):
    out = enlace(project, "check-config", "smoke-cpu", "--set", "zzz.paths=x", check=False)
    assert out.returncode == 2 and "valid keys: checkpoint, data, distill, logging, model," in out.stderr, out.stderr


def test_a_float_written_as_people_write_it_is_a_number(project):
    """`learning_rate: 3e-4` was the string '3e-4' (PyYAML reads YAML 1.1, whose floats need a dot) and refused
    as "expected a number", while `--set optim.learning_rate=3e-4` took it."""
    (project / "configs" / "runs" / "sci.yaml").write_text(
        "data: tiny\nprofile: cpu\noptim: {learning_rate: 3e-4, min_lr: 1E-5}\n"
    )
    cfg = load_config("sci", root=project)
    assert cfg.optim.learning_rate == 3e-4 and cfg.optim.min_lr == 1e-5
    (project / "configs" / "runs" / "sci.yaml").write_text(
        "data: tiny\nprofile: cpu\nrun_name: '1e3'\n"
    )  # quoted: a string
    assert load_config("sci", root=project).run_name == "1e3"


def test_a_section_given_a_value_and_a_warmup_past_the_run_say_the_fix(project):
    e = _error(project, "model=3")  # it said "unknown key — did you mean 'model'?"
    assert e.source == "--set" and "is a section, not a key" in e.message and "model.n_layer" not in e.message
    assert "set one of its keys (model.KEY=V): " in e.message and "n_layer" in e.message
    e = _error(project, "training.max_steps=30", optim={"warmup_steps": 50})
    assert "warmup_steps 50 is more than max_steps 30" in e.message and "--set optim.warmup_steps=3" in e.message
    assert e.source == "--set" and e.key == "training.max_steps"  # two keys wrong together: the one just --set
    e = _error(project, "model.d_model=131")  # it blamed the run file's model.n_head
    assert (e.source, e.key) == ("--set", "model.d_model") and "not divisible by n_head" in e.message, e.message


def test_an_empty_run_file_says_it_is_empty_and_what_a_run_file_holds(project):
    """It said `data: missing — name a file in configs/data/`, the trainer's word, in a script's repository."""
    (project / "configs" / "runs" / "b15.yaml").write_text("")
    with pytest.raises(ConfigError) as e:
        load_config("b15", root=project)
    said = e.value.format_message()
    assert said.startswith("configs/runs/b15.yaml: is empty — your own script: command: [python, train.py]"), said


def test_a_run_named_outside_any_project_says_where_it_looked(tmp_path):
    """Outside a project it said `one of: none`, with no word of --root."""
    with pytest.raises(ConfigError) as e:
        load_config("smoke-cpu", root=tmp_path)
    assert e.value.format_message().endswith(
        f"{tmp_path} holds no configs/runs/: run it in a project's folder, or give --root"
    )
