"""Everything the server needs must be shippable by git: nothing under enlace/, configs/ or
scripts/ may be ignored (an unanchored `data/` once hid enlace/data/ and configs/data/)."""

from __future__ import annotations

import subprocess

from support import REPO

SHIPPED = ("enlace", "configs", "scripts")


def _ignored(paths: list[str]) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(REPO), "check-ignore", "--no-index", "--stdin"],
        input="\n".join(paths),
        capture_output=True,
        text=True,
    )
    return out.stdout.split()


def test_no_shipped_file_is_ignored():
    files = [
        str(p.relative_to(REPO))
        for d in SHIPPED
        for p in (REPO / d).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    assert len(files) > 10
    assert _ignored(files) == []


def test_root_outputs_are_ignored_and_anchored():
    assert _ignored(["data/corpus/a.txt", "runs/x/run.json"]) == ["data/corpus/a.txt", "runs/x/run.json"]
    # The anchoring is what matters: the same names one level down must stay tracked.
    assert _ignored(["enlace/data/bytestream.py", "configs/data/smoke.yaml", "configs/runs/smoke-cpu.yaml"]) == []
    for line in (REPO / ".gitignore").read_text().splitlines():
        assert line.strip() not in ("data/", "runs/", "data", "runs"), f"unanchored {line!r}"


def test_ide_folders_ignored():
    assert _ignored([".vscode/settings.json", ".idea/workspace.xml"]) == [
        ".vscode/settings.json",
        ".idea/workspace.xml",
    ]


def test_a_venv_that_is_a_link_is_ignored_too(tmp_path):
    """`/.venv/` matches a directory only: a .venv linked to a shared one made the tree dirty (launch refused)."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_bytes((REPO / ".gitignore").read_bytes())
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".venv").symlink_to(tmp_path / "elsewhere")
    out = subprocess.run(["git", "-C", str(tmp_path), "status", "--porcelain"], capture_output=True, text=True)
    assert ".venv" not in out.stdout, out.stdout
