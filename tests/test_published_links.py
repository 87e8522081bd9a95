"""Every link to the published study resolves: the README, the docs and the notebooks' sources point readers at
``published/`` (the default study's executed notebooks, :mod:`dmlstudy.study.publish`), and each such link, and
each file a published page loads (its MathJax) or links, must be a file there. A link is a Markdown link
``[text](target)`` or a path in backticks (`` `published/10_crt.ipynb` ``); in HTML, ``src`` and ``href``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "published"
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
QUOTED_PATH = re.compile(r"`((?:\.\./)?published/[^`\s]*)`")
HTML_LINK = re.compile(r'(?:src|href)="([^"#]+)')
NOTEBOOK_LINKS = 8  # each notebook's first cell links its published copy


def pages() -> list[Path]:
    """What readers open from the repository: README.md, docs (every level), the notebooks' jupytext sources, and
    the published folder's own index."""
    sources = sorted((ROOT / "notebooks").glob("*.py"))
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sources, PUBLISHED / "README.md"]


def links_into_published(page: Path) -> list[tuple[int, str, Path]]:
    """``(line, target, resolved path)`` of every link on ``page`` that points into ``published/``: a Markdown link
    resolved from the page's folder, a quoted path from the page's folder when it starts with ``../``, else from the
    project root (how the docs write them)."""
    found = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for target in MARKDOWN_LINK.findall(line):
            target = target.split("#")[0]
            if target and not target.startswith(("http://", "https://", "mailto:")):
                resolved = (page.parent / target).resolve()
                if resolved.is_relative_to(PUBLISHED):
                    found.append((number, target, resolved))
        for target in QUOTED_PATH.findall(line):
            base = page.parent if target.startswith("../") else ROOT
            found.append((number, target, (base / target).resolve()))
    return found


def test_every_link_to_published_resolves():
    links = [(page, *link) for page in pages() for link in links_into_published(page)]
    notebook_copies = {path for _, _, _, path in links if path.suffix == ".ipynb"}
    assert len(notebook_copies) >= NOTEBOOK_LINKS, sorted(notebook_copies)  # the check reads the links it is for
    missing = [
        f"{page.relative_to(ROOT)}:{number}: {target}"
        for page, number, target, path in links
        if not (path.is_file() or (path.is_dir() and target.endswith("/")))
    ]
    for html in sorted(PUBLISHED.glob("*.html")):  # what a published page loads or links, inside the folder
        for target in HTML_LINK.findall(html.read_text(encoding="utf-8")):
            if not target.startswith(("http://", "https://", "data:", "mailto:")) and target.strip():
                if not (html.parent / target).resolve().is_file():
                    missing.append(f"{html.relative_to(ROOT)}: {target}")
    assert not missing, (
        "links into published/ that name no file there (`make study` executes and publishes the default study; "
        "`make publish` publishes what has run):\n" + "\n".join(missing)
    )
