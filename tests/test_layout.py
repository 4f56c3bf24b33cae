"""The code's shape: no import cycles, every module importable first in a fresh interpreter, and each
command line's entry point holds every verb without relying on another module's import side effects."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import REPO

PACKAGES = ("enlace", "orchestrator")


def modules() -> dict[str, ast.Module]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            out[name] = ast.parse(path.read_text())
    return out


def module_level_imports(tree: ast.Module, known: set[str]) -> set[str]:
    """The project modules a module imports when it is imported (not those imported inside functions)."""
    deps = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            deps |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            deps |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names
            }
    return deps & known


def test_no_module_level_import_cycles():
    mods = modules()
    graph = {name: module_level_imports(tree, set(mods)) - {name} for name, tree in mods.items()}
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        for dep in graph[name]:
            if dep == path[0]:
                cycles.append(" -> ".join([*path, dep]))
            elif dep not in path and dep > path[0]:  # each cycle reported once, from its smallest module
                visit(dep, [*path, dep])

    for name in graph:
        visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.slow
def test_every_module_imports_first_in_a_fresh_interpreter():
    def imports(name: str) -> tuple[str, int, str]:
        r = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=REPO, capture_output=True, text=True)
        return name, r.returncode, r.stderr[-600:]

    with ThreadPoolExecutor(max_workers=4) as pool:
        failed = [f"{n}: {err}" for n, code, err in pool.map(imports, modules()) if code != 0]
    assert not failed, "\n".join(failed)


def test_each_entry_point_holds_every_verb_on_its_own():
    code = (
        "import json; from enlace.cli import main as e; from orchestrator.cli import main as r\n"
        "print(json.dumps([sorted(e.commands), sorted(r.commands)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    enlace_verbs, remote_verbs = json.loads(out.stdout)
    assert {
        "train",
        "preflight",
        "runs",
        "start",
        "wait",
        "stop",
        "logs",
        "fetch-serve",
        "submit",
        "slurm-job",
        "on-node",
        "sample",
        "plot",
        "gc",
    } <= set(enlace_verbs)
    assert {
        "sync",
        "verify",
        "preflight",
        "launch",
        "status",
        "stop",
        "logs",
        "fetch",
        "sample",
        "plot",
        "gc",
        "shell",
        "hosts",
        "setup",
    } <= set(remote_verbs)


def test_the_code_is_formatted_and_lint_clean():
    """One formatter configuration (pyproject's [tool.ruff]) instead of per-line formatter opt-outs."""
    dirs = [str(REPO / d) for d in (*PACKAGES, "tests", "bench", "scripts")]
    ruff = [sys.executable, "-m", "ruff"]
    fmt = subprocess.run([*ruff, "format", "--check", *dirs], capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout[-2000:]
    lint = subprocess.run([*ruff, "check", *dirs], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout[-2000:]
    skips = subprocess.run(
        ["git", "-C", str(REPO), "grep", "-c", "-E", "fmt:[[:space:]]+skip", "--", "*.py"],
        capture_output=True,
        text=True,
    )
    assert skips.stdout == "", skips.stdout
