"""README's "On a GPU server" section, played literally by a new user: a fresh unix account on a real
sshd with its own HOME and nothing of enlace, the host added with the documented command, `python`
left at its default (a venv built on the server); setup, preflight, launch, logs -f, fetch succeed.
The test user's pip gets the machine's local wheels through --pip-arg, as a user points pip at their index."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from support import REPO
from support.configs import write_tiny_corpus
from support.remote import tiny_corpus

WHEELS = Path("/opt/wheels")


def readme_commands(block: int = 0) -> list[str]:
    """The commands of README's "On a GPU server" section: its first bash block (the walk), or another."""
    text = (REPO / "README.md").read_text()
    section = text.split("## On a GPU server", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"```bash\n(.*?)```", section, re.S)[block]
    return [line.split("  #")[0].strip() for line in found.splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.longest
def test_readme_gpu_server_section_works_for_a_new_user(tmp_path, user_repo, fresh_users):
    """Both ends are fresh non-root accounts: the laptop user runs the driver with its own HOME and its own
    clone; the server account has nothing of enlace."""
    from support.sshd import make_server

    fresh_user, laptop_user = fresh_users(), fresh_users()
    srv = make_server(tmp_path, name="fresh", own_homes=True)
    home = Path(f"/home/{laptop_user}")  # the new user's own machine: a key, known_hosts and a clone, no enlace config
    (home / ".ssh").mkdir(mode=0o700)
    shutil.copy(srv.dir / "client_key", home / ".ssh" / "id_ed25519")
    shutil.copy(srv.dir / "known_hosts", home / ".ssh" / "known_hosts")
    repo = home / "repo"
    subprocess.run(["git", "clone", "-q", str(user_repo), str(repo)], check=True)
    system_python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if not system_python:
        pytest.skip("no python3 outside root's home for the laptop account to run the driver with")
    # README's install line for a laptop, as written (no torch): it must leave enlace-remote in ~/.local/bin,
    # which a login shell puts on PATH (it was left in a venv's bin/, and the next README line failed)
    install = re.search(r"your laptop .*?\| `(.+?)` \(from a clone", (REPO / "README.md").read_text()).group(1)
    pip_cache = {"PIP_CACHE_DIR": "/root/.cache/pip", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # this machine's
    env_install = {"HOME": str(home), "PATH": str(Path(system_python).parent) + ":/usr/bin:/bin", **pip_cache}
    subprocess.run(["bash", "-c", install], cwd=repo, env=env_install, check=True, capture_output=True)
    driver_bin = home / ".local" / "bin"
    assert (driver_bin / "enlace-remote").exists()
    subprocess.run(["chown", "-R", f"{laptop_user}:", str(home)], check=True)
    server_home = Path(f"/home/{fresh_user}")
    (server_home / ".ssh").mkdir(mode=0o700)
    shutil.copy(srv.dir / "client_key.pub", server_home / ".ssh" / "authorized_keys")
    subprocess.run(["chown", "-R", f"{fresh_user}:", str(server_home / ".ssh")], check=True)
    env = {
        **os.environ,
        "HOME": str(home),
        "USER": laptop_user,
        "LOGNAME": laptop_user,
        "PATH": f"{driver_bin}:/usr/local/bin:/usr/bin:/bin",
    }
    for key in ("ENLACE_HOSTS_FILE", "ENLACE_SSH_CONFIG", "ENLACE_REMOTE_HOST", "PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(key, None)
    pip = [f"--pip-arg={a}" for a in ("--find-links", str(WHEELS))] if WHEELS.is_dir() else []

    def as_laptop(argv: list[str]) -> subprocess.CompletedProcess:
        out = subprocess.run(
            argv,
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
            stdin=subprocess.DEVNULL,
            user=laptop_user,
            group=laptop_user,
            extra_groups=[],
        )
        assert out.returncode == 0, f"{shlex.join(argv)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        assert "Traceback" not in out.stderr, out.stderr
        return out

    try:
        for line in readme_commands():
            line = line.replace("alice@gpu1.example.org", f"{fresh_user}@127.0.0.1:{srv.port}")
            line = line.replace("smoke-2060", "tiny")  # a CPU-sized run: this machine has no GPU
            if line.startswith("export "):
                key, _, value = line.removeprefix("export ").partition("=")
                env[key] = value
                continue
            argv = shlex.split(line) + (pip if " hosts add " in f" {line} " else [])
            if argv[1] == "preflight":  # the data goes to <remote_dir>/data by hand, before the run reads it
                tiny_corpus(server_home / "enlace")
                subprocess.run(["chown", "-R", f"{fresh_user}:", str(server_home / "enlace" / "data")], check=True)
            out = as_laptop(argv)
            if argv[1] == "setup":
                assert "building the server's python" in out.stderr and "built " in out.stderr
        venvs = list((server_home / "enlace" / "venvs").iterdir())
        assert len(venvs) == 1 and (venvs[0] / "bin" / "python").exists()  # python: venv, the default
        # no NVIDIA driver on this server: the CPU build, in the account's shared cache, linked from remote_dir
        shared = server_home / ".cache" / "enlace" / "venvs" / f"{venvs[0].name}-cpu"
        assert venvs[0].is_symlink() and Path(os.readlink(venvs[0])) == shared
        # a second remote_dir of the same account: the venv is not built again
        ssh = f"{fresh_user}@127.0.0.1:{srv.port}"
        as_laptop(["enlace-remote", "hosts", "add", "gpu2", "--ssh", ssh, "--remote-dir", "~/enlace2", *pip])
        again = as_laptop(["enlace-remote", "--host", "gpu2", "setup"])
        assert "building the server's python" not in again.stderr, again.stderr
        assert Path(os.readlink(server_home / "enlace2" / "venvs" / venvs[0].name)) == shared
        hosts_file = home / ".config" / "enlace" / "hosts.yaml"
        assert f"{fresh_user}@127.0.0.1:{srv.port}" in hosts_file.read_text()
        assert hosts_file.stat().st_uid == _uid(laptop_user)  # written by the laptop user, in their HOME
        server_run = server_home / "enlace" / "runs" / "tiny"
        fetched = repo / "runs" / "tiny"
        assert (fetched / "checkpoints" / "step-000030" / "model.pt").read_bytes() == (
            server_run / "checkpoints" / "step-000030" / "model.pt"
        ).read_bytes()
        assert (fetched / "checkpoints" / "step-000030" / "model.pt").stat().st_uid == _uid(laptop_user)
        assert (server_run / "train.log").stat().st_uid == _uid(fresh_user)
        # docs/export.md's laptop route: exported on the server, in the run's directory, and brought home
        as_laptop(["enlace-remote", "export", "tiny"])
        home_export = repo / "exports" / "tiny-hf"
        (kept,) = (server_run / "exports").glob("hf-step-000030-*")  # with the checkpoint's identity
        assert (home_export / "model.safetensors").read_bytes() == (kept / "model.safetensors").read_bytes()
        assert (home_export / "model.safetensors").stat().st_uid == _uid(laptop_user)
        # README's own-corpus flow on this CPU server, as its comment says: corpus-cpu (shortened for the test)
        write_tiny_corpus(repo / "data" / "corpus" / "notes")  # *.txt at any depth under data/corpus/
        subprocess.run(["chown", "-R", f"{laptop_user}:", str(repo / "data")], check=True)
        for line in readme_commands(block=1):
            argv = shlex.split(line.replace("corpus-2060", "corpus-cpu"))
            short = ["--set", "training.max_steps=20", "--set", "optim.warmup_steps=5", "--follow"]
            as_laptop(argv + (short if argv[1] == "launch" else []))
        corpus_run = json.loads((server_home / "enlace" / "runs" / "corpus-cpu" / "run.json").read_text())
        assert (corpus_run["status"], corpus_run["step"]) == ("finished", 20), corpus_run
    finally:
        srv.stop()


def _uid(user: str) -> int:
    return int(subprocess.check_output(["id", "-u", user]))
