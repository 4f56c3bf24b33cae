"""The documentation a user navigates: a short README, pages under docs/ that each stay short, links that
resolve, a CLI reference that cannot drift from the code, and a module map that covers the tree."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from support import REPO

PAGES = sorted((REPO / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path) -> set[str]:
    """GitHub's anchors for a page's headings: lowercase, punctuation dropped, spaces as hyphens."""
    heads = re.findall(r"(?m)^#+ (.+)$", path.read_text())
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in heads}


def test_readme_is_short_and_every_page_stays_short():
    assert len((REPO / "README.md").read_text().splitlines()) <= 150
    assert PAGES, "docs/ has no pages"
    for page in PAGES:
        assert len(page.read_text().splitlines()) <= 300, page.name


@pytest.mark.parametrize("doc", [REPO / "README.md", *PAGES], ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    for target in LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        assert path.exists(), f"{doc.name}: {target} does not exist"
        if anchor:
            assert anchor in _anchors(path), f"{doc.name}: #{anchor} is not a heading of {path.name}"


def test_the_cli_reference_is_what_the_code_says():
    """docs/cli.md and docs/cli-server.md are generated from click: a verb or option added, renamed or removed without regenerating
    it fails here (python scripts/cli_reference.py rewrites it)."""
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "cli_reference.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    from enlace.cli import main as trainer
    from orchestrator.cli import main as driver

    for prog, group, page in (("enlace-remote", driver, "cli.md"), ("enlace", trainer, "cli-server.md")):
        text = (REPO / "docs" / page).read_text()
        for name, cmd in group.commands.items():
            if not cmd.hidden:
                assert f"### `{prog} {name}" in text, (prog, name)


def test_the_module_map_covers_every_module_and_folder():
    design = (REPO / "docs" / "design.md").read_text()
    modules = [p for pkg in ("enlace", "orchestrator") for p in (REPO / pkg).rglob("*.py")]
    missing = [str(p.relative_to(REPO)) for p in modules if p.name != "__init__.py"]
    missing = [m for m in missing if f"`{m}`" not in design]
    folders = sorted({p.parent for p in modules if p.parent.name not in ("enlace", "orchestrator")})
    missing += [f"{f.relative_to(REPO)}/" for f in folders if f"`{f.relative_to(REPO)}/`" not in design]
    assert not missing, f"not in docs/design.md's module map: {missing}"


def test_every_folder_says_what_it_owns_and_what_it_may_import():
    import ast

    for pkg in ("enlace", "orchestrator"):
        for init in (REPO / pkg).rglob("__init__.py"):
            if init.parent.name in ("enlace", "orchestrator"):
                continue
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            assert len(doc) > 80 and "May import" in doc, f"{init.relative_to(REPO)}: {doc!r}"


def test_a_new_user_finds_the_common_questions_from_the_readme_in_one_click():
    readme = (REPO / "README.md").read_text()
    for question, page in [
        ("install the driver on a laptop", "#install"),
        ("add my own data", "docs/data.md"),
        ("what does exit 8 mean", "docs/troubleshooting.md"),
        ("run on a Slurm cluster", "docs/slurm.md"),
    ]:
        row = next((line for line in readme.splitlines() if question in line), "")
        assert page in row, question
    assert "| 8 |" in (REPO / "docs" / "troubleshooting.md").read_text()
