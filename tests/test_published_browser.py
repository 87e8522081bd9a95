"""A published HTML page opened in a real browser without network: headless Chromium (the Debian package
``chromium``) renders a page that :func:`dmlstudy.study.publish.export_html` wrote from an executed notebook whose
Markdown holds the CRT notebook's equations, with the pinned MathJax beside it, in a network namespace of its own
(``unshare -n``: no interface but a downed loopback), and every ``$…$`` and ``$$…$$`` must come out as typeset math.

Needs ``chromium`` and ``unshare`` (util-linux) with the right to create a network namespace (root, as in a
container), and the MathJax file, fetched by npm once; skipped where one is missing, like the CUDA tests."""

from __future__ import annotations

import re
import shutil
import subprocess

import nbformat
import pytest

from dmlstudy.paths import project_root
from dmlstudy.study import publish

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--virtual-time-budget=20000",  # lets MathJax finish typesetting before the DOM is read
]


def offline(command: list[str]) -> list[str]:
    """``command`` in a network namespace of its own, or None where this machine cannot make one."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode:
        return None
    return ["unshare", "-n", *command]


@pytest.mark.skipif(BROWSER is None, reason="needs Chromium (apt-get install chromium)")
def test_a_published_page_shows_its_equations_as_math_without_network(tmp_path):
    if offline(["true"]) is None:
        pytest.skip("needs `unshare -n` (a network namespace) to cut the network")
    try:
        publish.ensure_mathjax(tmp_path, publish.MATHJAX)
    except publish.MathJaxUnavailable as error:
        pytest.skip(f"MathJax not at hand: {error}")
    source = nbformat.read(project_root() / "notebooks" / "10_crt.ipynb", as_version=4)
    opening = next(cell for cell in source.cells if cell.cell_type == "markdown" and "$$" in cell.source)
    inline = len(re.findall(r"(?<!\$)\$[^$]+\$(?!\$)", opening.source))
    display = opening.source.count("$$") // 2
    assert inline > 5 and display >= 2
    notebook = nbformat.v4.new_notebook(cells=[opening])
    page = tmp_path / "page.html"
    page.write_text(publish.export_html(notebook), encoding="utf-8")
    done = subprocess.run(
        offline([BROWSER, *FLAGS, "--dump-dom", page.as_uri()]), capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    typeset = dom.count("<mjx-container")
    assert typeset == inline + display, (typeset, inline, display)
    assert len(re.findall(r'<mjx-container[^>]*display="true"', dom)) == display
    body = re.sub(r"<mjx-container.*?</mjx-container>|<(script|style)[^>]*>.*?</\1>", "", dom, flags=re.DOTALL)
    assert "$" not in re.sub(r"<[^>]+>", "", body), "TeX left untypeset"
    assert "mjx-merror" not in dom and "data-mjx-error" not in dom
