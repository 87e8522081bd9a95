"""Publishing a study (dmlstudy.study.publish): a small plan executed for real, then its executed notebooks
published as a reader gets them — outputs and figures kept, at screen resolution, no machine paths, no widget
views or widget state, no progress-bar debris, an index that links every copy, nothing of an entry that failed."""

from __future__ import annotations

import base64
import io
import json
import os

import nbformat
import pytest
from PIL import Image

from dmlstudy.paths import project_root
from dmlstudy.study import publish
from dmlstudy.study.executor import run_plan

PINNED_MATHJAX = publish.MATHJAX  # the real pins, read before a fixture puts a stand-in in their place
REVISION = "0123abc"  # what the copies say they were published from (git is not asked: seconds per call)
DEBRIS_CELL = """\
import os, sys, time
from pathlib import Path
import matplotlib.pyplot as plt
from tqdm.auto import tqdm
from dmlstudy.paths import project_root
from dmlstudy.progress_bars import transient_bar

for _ in transient_bar(range(3), desc="a transient bar"):
    time.sleep(0.01)
for _ in tqdm(range(3), desc="a bar that stays"):
    pass
sys.stderr.write("working 10%\\rworking 100%\\n")
sys.stderr.write(" 50%|#####     | 5/10 [00:01<00:01, 4.00it/s]\\n")
print("runs in", runs_root, "project", project_root(), "home", os.path.expanduser("~"))
figure, axis = plt.subplots(figsize=(20, 3))
axis.plot([0, 1], [0, 1])
axis.set_title("a wide figure")
plt.show()
Path(runs_root)
"""


def write_notebook(path, title: str, parameters: str, *cells: str):
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    parameters_cell = nbformat.v4.new_code_cell(parameters)
    parameters_cell.metadata["tags"] = ["parameters"]
    notebook.cells = [nbformat.v4.new_markdown_cell(f"# {title}\n\nWhat it shows."), parameters_cell]
    notebook.cells += [nbformat.v4.new_code_cell(cell) for cell in cells]
    path.write_text(nbformat.writes(notebook))
    return path


@pytest.fixture
def executed_plan(tmp_path):
    write_notebook(tmp_path / "20_debris.ipynb", "Debris of every kind", "runs_root: str = ''", DEBRIS_CELL)
    write_notebook(tmp_path / "30_broken.ipynb", "Broken", "value: int = 1", "raise RuntimeError('on purpose')")
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "study: publish-test\nentries:\n"
        f"  - name: debris\n    notebook: {tmp_path / '20_debris.ipynb'}\n"
        f"  - name: broken\n    notebook: {tmp_path / '30_broken.ipynb'}\n"
    )
    root = tmp_path / "runs"
    outcomes = run_plan(plan, root=root, progress=False)
    assert [o.status for o in outcomes] == ["complete", "failed"]
    executed = (root / "publish-test" / "debris" / "20_debris.ipynb").read_text()
    assert executed.count(publish.WIDGET_VIEW) == 1  # the bar that stays; the transient one emptied its output
    return plan, root


MATHJAX_STAND_IN = b"window.MathJaxStandIn = true;\n"


@pytest.fixture(autouse=True)
def mathjax_tarball(tmp_path_factory, monkeypatch):
    """A stand-in for the MathJax npm tarball, laid out as the package is and pinned as :data:`publish.MATHJAX`
    pins the real one, so publishing is tested without network; returns the specs that npm was asked for."""
    import dataclasses
    import hashlib
    import tarfile

    from dmlstudy.data.emoji_sources import integrity_of

    tarball = tmp_path_factory.mktemp("npm") / "mathjax-stand-in.tgz"
    with tarfile.open(tarball, "w:gz") as archive:
        for name, content in ((publish.MATHJAX.member, MATHJAX_STAND_IN), ("LICENSE", b"Apache License 2.0\n")):
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    pinned = dataclasses.replace(
        publish.MATHJAX, integrity=integrity_of(tarball), sha256=hashlib.sha256(MATHJAX_STAND_IN).hexdigest()
    )
    monkeypatch.setattr(publish, "MATHJAX", pinned)
    asked = []
    monkeypatch.setattr(publish, "_npm_pack", lambda asset, destination: asked.append(asset.spec) or tarball)
    return asked


def machine_paths(tmp_path) -> list[str]:
    return [str(tmp_path), str(project_root()), os.path.expanduser("~") + "/", "/tmp/", "site-packages"]


def test_a_published_notebook_keeps_its_outputs_and_loses_what_only_its_machine_knew(executed_plan, tmp_path):
    plan, root = executed_plan
    published = publish.publish_plan(plan, root=root, revision=REVISION)
    folder = root / "publish-test" / "published"
    assert [(p.entry, p.name, p.title) for p in published] == [("debris", "20_debris", "Debris of every kind")]
    assert sorted(path.name for path in folder.iterdir()) == [
        "20_debris.html",
        "20_debris.ipynb",
        "README.md",
        "index.html",
        "mathjax",
    ]  # the failed entry is not published
    assert (folder / "mathjax" / "tex-svg-full.js").read_bytes() == MATHJAX_STAND_IN
    assert (folder / "mathjax" / "LICENSE").is_file()
    text = (folder / "20_debris.ipynb").read_text()
    notebook = nbformat.reads(text, as_version=4)
    note = notebook.cells[0].source
    assert note.startswith("> **Published copy.**") and "entry `debris`" in note and f"`{REVISION}`" in note
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "runs in runs project . home ~" in printed
    assert printed.count("working") == 1 and "working 100%" in printed and "\r" not in printed  # its last redraw
    assert "it/s]" not in printed  # a text progress bar is gone
    figures = [o.data["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert len(figures) == 1
    width = Image.open(io.BytesIO(base64.b64decode(figures[0]))).width
    assert 1000 < width <= publish.MAX_FIGURE_WIDTH
    assert publish.WIDGET_VIEW not in text and "widgets" not in notebook.metadata
    assert "papermill" not in notebook.metadata
    from jupyter_client.kernelspec import KernelSpecManager

    shown = KernelSpecManager().get_kernel_spec("python3").display_name  # JupyterLab renames, then re-saves, any other
    assert notebook.metadata.kernelspec.display_name == shown
    assert "PosixPath('runs')" in text  # an echoed path is relative too (the study's notebooks echo none)
    for path in machine_paths(tmp_path):
        assert path not in text, path
    page = (folder / "20_debris.html").read_text()
    assert "Debris of every kind" in page and "data:image/png;base64" in page
    assert_offline_math(page)
    for path in machine_paths(tmp_path)[:2]:
        assert path not in page
    index = (folder / "README.md").read_text()
    assert "[ipynb](20_debris.ipynb) · [HTML](20_debris.html)" in index and "Debris of every kind" in index
    assert "broken" not in index and '<a href="20_debris.html">' in (folder / "index.html").read_text()


def assert_offline_math(page: str) -> None:
    """The page typesets ``$…$`` and ``$$…$$`` with the MathJax beside it and loads no script from the network."""
    import re

    scripts = re.findall(r'<script[^>]*src="([^"]*)"', page)
    assert scripts == ["mathjax/tex-svg-full.js"], scripts
    config = json.loads(re.search(r"window\.MathJax = (\{.*?\});</script>", page).group(1))
    assert ["$", "$"] in config["tex"]["inlineMath"] and ["$$", "$$"] in config["tex"]["displayMath"]
    assert page.index("window.MathJax = ") < page.index('src="mathjax/tex-svg-full.js"')  # configured before it loads
    assert "MathJax.Hub" not in page  # nbconvert's MathJax 2 configuration is gone


def test_an_exported_page_typesets_its_equations_offline():
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("Inline $a_{jk} = x_j^\\top c_k$ and\n\n$$L = \\frac{1}{K}\\sum_k r_k$$")
    ]
    page = publish.export_html(notebook)
    assert_offline_math(page)
    assert "$a_{jk} = x_j^\\top c_k$" in page and "$$L = \\frac{1}{K}\\sum_k r_k$$" in page  # left for MathJax


def test_mathjax_is_fetched_once_checked_and_replaced_when_not_the_pinned_file(tmp_path, mathjax_tarball):
    shipped = publish.ensure_mathjax(tmp_path, publish.MATHJAX)
    assert shipped == tmp_path / "mathjax" / "tex-svg-full.js" and mathjax_tarball == ["mathjax@3.2.2"]
    assert publish.ensure_mathjax(tmp_path, publish.MATHJAX) == shipped and len(mathjax_tarball) == 1  # reused
    shipped.write_text("tampered")
    publish.ensure_mathjax(tmp_path, publish.MATHJAX)
    assert shipped.read_bytes() == MATHJAX_STAND_IN and len(mathjax_tarball) == 2
    import dataclasses

    other = dataclasses.replace(publish.MATHJAX, sha256="0" * 64)
    with pytest.raises(publish.MathJaxUnavailable, match="not the pinned file"):
        publish.ensure_mathjax(tmp_path / "elsewhere", other)


def test_the_pinned_mathjax_is_the_one_the_notices_record():
    pinned = PINNED_MATHJAX
    notices = (project_root() / "THIRD_PARTY_NOTICES.md").read_text()
    for fact in (pinned.spec, pinned.integrity, pinned.sha256, pinned.member):
        assert fact in notices, fact


def test_an_entry_that_fails_later_loses_its_earlier_copy(executed_plan, tmp_path):
    plan, root = executed_plan
    publish.publish_plan(plan, root=root, revision=REVISION)
    record = root / "publish-test" / "debris" / "study_entry.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "status": "failed"}))
    assert publish.publish_plan(plan, root=root, html=False, revision=REVISION) == []
    folder = root / "publish-test" / "published"
    assert sorted(path.name for path in folder.iterdir()) == ["README.md"]
    assert "no entry of the plan has been executed yet" in (folder / "README.md").read_text()


def test_an_edited_notebook_is_executed_again_and_an_unchanged_one_is_not(tmp_path):
    notebook = write_notebook(tmp_path / "echo.ipynb", "Echo", "value: int = 1", "print(value)")
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"study: s\nentries:\n  - name: echo\n    notebook: {notebook}\n")
    root = tmp_path / "runs"
    assert [o.status for o in run_plan(plan, root=root, progress=False)] == ["complete"]
    assert [o.status for o in run_plan(plan, root=root, progress=False)] == ["skipped"]
    [copy] = publish.publish_plan(plan, root=root, html=False, revision=REVISION)
    assert not copy.source_changed
    write_notebook(notebook, "Echo, explained better", "value: int = 1", "print(value)")
    [copy] = publish.publish_plan(plan, root=root, html=False, revision=REVISION)  # published before it ran again
    assert copy.source_changed and copy.title == "Echo"
    assert [o.status for o in run_plan(plan, root=root, progress=False)] == ["complete"]
    executed = nbformat.read(root / "s" / "echo" / "echo.ipynb", as_version=4)
    assert publish.notebook_title(executed) == "Echo, explained better"
    [copy] = publish.publish_plan(plan, root=root, html=False, revision=REVISION)
    assert not copy.source_changed and copy.title == "Echo, explained better"


def test_screen_png_shrinks_a_wide_figure_and_keeps_a_small_one_readable():
    wide = Image.new("RGB", (3000, 400), "white")
    buffer = io.BytesIO()
    wide.save(buffer, format="PNG")
    shrunk = Image.open(io.BytesIO(base64.b64decode(publish.screen_png(base64.b64encode(buffer.getvalue())))))
    assert shrunk.size == (publish.MAX_FIGURE_WIDTH, round(400 * publish.MAX_FIGURE_WIDTH / 3000))
    small = Image.linear_gradient("L").convert("RGB").resize((200, 100))
    buffer = io.BytesIO()
    small.save(buffer, format="PNG")
    again = Image.open(io.BytesIO(base64.b64decode(publish.screen_png(base64.b64encode(buffer.getvalue())))))
    assert again.size == (200, 100)


def test_a_build_that_differs_from_the_published_one_writes_beside_its_runs(tmp_path, monkeypatch):
    """Tables, figures and notebooks of another emoji build are not the published study's: they go to
    runs/<study>/… unless the user says otherwise, and the message names the option."""
    from dmlstudy.data.emoji import PUBLISHED_FINGERPRINT
    from dmlstudy.data.emoji_checks import read_fingerprint
    from dmlstudy.paths import PUBLISH_DIFFERENT_BUILD, different_build_message, study_outputs

    monkeypatch.setenv("DMLSTUDY_HOME", str(tmp_path))
    monkeypatch.delenv(PUBLISH_DIFFERENT_BUILD, raising=False)
    assert study_outputs("default", "results") == tmp_path / "results"  # nothing built yet
    built = tmp_path / "data" / "emoji" / "fingerprint.tsv"
    built.parent.mkdir(parents=True)
    published = read_fingerprint(PUBLISHED_FINGERPRINT)
    built.write_text(published, encoding="utf-8")
    assert study_outputs("default", "figures") == tmp_path / "figures" and different_build_message("default") == ""
    lines = published.splitlines(keepends=True)
    kept = [line for line in lines if line.startswith("#") or not line.strip()]
    built.write_text("".join(kept + [line for line in lines if line not in kept][1:]), encoding="utf-8")
    for kind in ("results", "figures", "published"):
        assert study_outputs("default", kind) == tmp_path / "runs" / "default" / kind
    assert study_outputs("sequential", "results") == tmp_path / "runs" / "sequential" / "results"
    assert study_outputs("embedded", "figures") == tmp_path / "figures" / "embedded"  # generated data: no build check
    message = different_build_message("default")
    assert "differs from the published build" in message and "PUBLISH_DIFFERENT_BUILD=1" in message
    assert str(tmp_path / "runs" / "default" / "results") in message
    assert different_build_message("embedded") == "" and different_build_message("smoke") == ""
    monkeypatch.setenv(PUBLISH_DIFFERENT_BUILD, "1")
    assert study_outputs("default", "results") == tmp_path / "results" and different_build_message("default") == ""


def test_the_readme_states_the_published_folders_size_budget():
    readme = (project_root() / "README.md").read_text()
    assert f"Size budget: {publish.SIZE_BUDGET_MB:g} MB" in readme


def test_publishing_warns_past_the_size_budget(executed_plan, monkeypatch):
    plan, root = executed_plan
    monkeypatch.setattr(publish, "SIZE_BUDGET_MB", 0.01)
    with pytest.warns(UserWarning, match="over its budget of 0.01 MB"):
        publish.publish_plan(plan, root=root, revision=REVISION)
