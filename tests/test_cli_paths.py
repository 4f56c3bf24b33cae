"""Paths at the command line: an empty or unsuitable one is refused before anything; one the machine will not let
a verb create or write is one line, exit 2, where it is a path the command named (and only there: under a
supervisor a trainer's exit 2 is a config error, never retried); what reaches a terminal has its controls
written out."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support import REPO
from support.remote import DRIVER
from test_cli_input import _cli


@pytest.mark.parametrize(
    "args, words",
    [
        (["fetch", "tiny", "--dest", ""], "Invalid value for '--dest': an empty path"),  # it fetched into the root
        (["plot", "tiny", "--dest", " "], "Invalid value for '--dest': an empty path"),
        (["export", "tiny", "--out", ""], "Invalid value for '--out': an empty path"),
        (
            ["plot", "tiny", "--out", "curves.txt"],
            "curves.txt: name a file ending in .png, .svg, .pdf, .jpg",
        ),  # matplotlib
    ],
)
def test_a_path_option_given_empty_or_of_the_wrong_kind_is_refused_before_anything(tmp_path, monkeypatch, args, words):
    result = _cli(["--host", "local", *args], REPO, tmp_path, monkeypatch)
    assert result.exit_code == 2 and words in result.output, result.output
    assert isinstance(result.exception, SystemExit)
    from click.testing import CliRunner

    from enlace.cli import main

    for trainer_args in (["plot", "tiny", "--out", "x.txt"], ["prepare", "smoke", "--out", ""]):
        said = CliRunner().invoke(main, trainer_args)
        assert said.exit_code == 2 and "Invalid value for '--out'" in said.output, said.output


def test_a_local_path_it_cannot_create_is_one_line_and_leaves_nothing(tmp_path):
    """A hosts file that is a folder was read as none, and `hosts add` failed into it in a traceback, leaving a
    temporary copy beside it; a path the driver cannot create (under /proc) was a traceback too."""
    folder = tmp_path / "hosts-folder"
    folder.mkdir()
    for hosts_file, words in (
        (folder, f"{folder}: a folder, not a hosts file"),
        (tmp_path / "file" / "hosts.yaml", f"{tmp_path / 'file' / 'hosts.yaml'}: cannot write it (File exists) — name"),
        (
            Path("/proc/hosts.yaml"),
            "/proc/hosts.yaml: cannot write it (",
        ),  # (its temporary copy beside it: a traceback)
    ):
        (tmp_path / "file").write_text("a file, where the hosts file's folder should be\n")
        env = {**os.environ, "ENLACE_HOSTS_FILE": str(hosts_file)}
        for verb in (["hosts", "add", "g1", "--ssh", "x@y"], ["hosts"]):
            out = subprocess.run([*DRIVER, *verb], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
            if verb == ["hosts"] and hosts_file.parent != tmp_path:
                continue  # (no such file: no hosts of the user's, as without one)
            assert out.returncode == 2 and out.stderr.startswith(f"Error: {words}"), out.stderr
            assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "hosts-folder"] and not list(folder.iterdir())


def test_a_path_the_server_verbs_cannot_create_is_one_line_exit_2(project):
    """`enlace prepare --out /proc/x/p1`, `enlace train --runs-dir /proc/x` were FileNotFoundError tracebacks."""
    from support.cli import enlace

    said = "Error: /proc/x: No such file or directory — name a path this machine lets you create and write"
    for args in (["prepare", "tiny", "--out", "/proc/x/p1"], ["train", "smoke-cpu", "--runs-dir", "/proc/x"]):
        out = enlace(project, *args, check=False, fresh=True)
        assert out.returncode == 2 and out.stderr.strip() == said, out.stderr


def test_sampled_text_reaches_a_terminal_with_its_controls_written_out_and_a_pipe_as_it_is():
    """An untrained model's sample wrote ESC bytes to the terminal (15 in 3000 bytes)."""
    import io

    from enlace.errors import for_stream

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    text = "def f():\n\treturn 1\x1b[2J\x07"
    assert for_stream(text, Terminal()) == "def f():\n\treturn 1\\x1b[2J\\x07"
    assert for_stream(text, io.StringIO()) == text  # `sample > out.txt`: the bytes the model drew


def test_only_an_error_about_a_path_given_on_the_command_line_becomes_a_usage_error(tmp_path, monkeypatch):
    """Under its supervisor a trainer's exit 2 is a config error, never retried: an OSError about a compiler's
    cache (not a path the command named) must stay a crash; a full disk keeps its own exit."""
    import errno

    from enlace.errors import path_given

    monkeypatch.chdir(tmp_path)
    argv = ["train", "smoke-cpu", "--runs-dir", "/proc/x", "--out=/srv/out"]
    gone = lambda path, code=errno.ENOENT: OSError(code, os.strerror(code), path)
    said = path_given(gone("/proc/x"), argv)
    assert said is not None and said.exit_code == 2 and said.message.startswith("/proc/x: No such file or directory")
    assert path_given(gone("/srv/out/a.png", errno.EACCES), argv) is not None  # inside a path given (--out=)
    assert path_given(gone("/proc"), ["prepare", "tiny", "--out", "/proc/x/p1"]) is not None  # above one
    for not_given in (gone("/root/.triton/cache/x"), gone("/proc/x", errno.ENOSPC), gone(str(tmp_path)), gone("/")):
        assert path_given(not_given, argv) is None, not_given
    # enlace's own file, where the command's own words name a path (`launch --name z -- python t.py --out=.`)
    own = ["launch", "--name", "z", "--", "python", "t.py", "--out=.", "/"]
    assert path_given(gone(str(tmp_path / ".enlace" / "last-runs.json"), errno.EISDIR), own) is None
