"""The study notebooks' sources: ``notebooks/<name>.py`` (jupytext py:percent) is what people edit, in an
editor or in JupyterLab (jupytext opens it as a notebook); ``notebooks/<name>.ipynb`` is *built* from it.

Decision: build, not pair. Papermill, nbval and the study plans need an ``.ipynb``, but a paired one is a
second editable copy that JupyterLab saves with outputs and jupytext syncs in whichever direction is newer,
so an edit can silently lose to a stale twin. Here the ``.ipynb`` is a deterministic function of the source
(cells ``cell-NN``, no outputs, no jupytext metadata) and ``tests/test_notebooks.py`` fails when a committed
one differs from what its source builds.

The ``parameters`` cell is written from the notebook's config dataclass (:func:`notebook_configs`): one line
per field, ``name: type = literal  # the field's comment``, in field order, with the dataclass default
unless :data:`CI_SIZED` gives the notebook's own CI-sized value. ``study`` is ``notebook-<stem>``, so
CI-sized runs of different notebooks never share run folders; the explorer alone keeps its ``""`` (it trains
nothing of its own unless no study has runs, and then into ``notebook-95_explore``).

A field that is itself a config (the paper notebooks' ``protocol``, a
:class:`~dmlstudy.run.protocol.ProtocolConfig`) is one ``dict`` parameter whose literal holds only the
notebook's own values of its fields (``{'study': 'notebook-10_crt'}``): the keys left out keep the config's
CI-sized defaults, so the cell stays short and a plan's ``protocol: *protocol`` replaces the whole mapping.

    python -m dmlstudy.experiments.notebooks build   # parameters cells from the configs, then every .ipynb
    python -m dmlstudy.experiments.notebooks check   # exit 1 naming every source or notebook out of date
    python -m dmlstudy.experiments.notebooks strip   # stdin → stdout: a notebook without outputs (git's filter)
    python -m dmlstudy.experiments.notebooks expected [stem ...]   # execute at CI size → nbval's expected outputs

**Expected outputs.** ``make test`` runs nbval in its comparing mode (``--nbval``) on
``tests/notebook_outputs/<name>.ipynb``: each is a notebook as built here, executed at its CI-sized defaults
under the study's pinned numerics with runs in an empty folder (:func:`execute_expected`), with its outputs kept as nbval's reference and
images dropped (nbval compares a figure by its text, ``<Figure size … with n Axes>``, not by its pixels).
``tests/notebook_outputs/sanitize.cfg`` blanks what may differ between two executions on any machine (times,
paths, progress bars); every number a run computes is compared. :func:`out_of_date` names a copy whose cells
differ from its notebook's, so an edited source without new expected outputs fails ``make test`` with the
command that refreshes them (``make notebook-outputs``).

Notebooks stay clean in git: ``.gitattributes`` sends ``notebooks/*.ipynb`` through the ``notebook-outputs``
filter, whose clean step is :func:`strip` (``make install`` registers it in the clone's git config). A notebook
run and saved in JupyterLab keeps its outputs on disk, but git sees it without them, so it is not a change,
nothing with outputs can be committed, and the git revision recorded in a run's ``environment.json``
(:func:`dmlstudy.records.git_revision`) stays clean.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import re
import shutil
import sys
import tempfile
import typing
from pathlib import Path

import jupytext
import nbformat

from dmlstudy.config import is_typed_config
from dmlstudy.paths import RUNS_VARIABLE, project_root

CI_SIZED: dict[str, dict[str, typing.Any]] = {  # a notebook's parameter values that differ from its config's defaults
    "00_datasets": {"knn_classes": 20, "knn_sizes": [32]},
    "01_train": {"epochs": 2, "train_classes": 16, "test_classes": 16, "steps_per_epoch": 6, "progress": False},
    "95_explore": {"study": ""},  # "": the published study when it has runs (explore.choose_study)
}
KERNEL_ENVIRONMENT = {"TQDM_DISABLE": "1"}  # a notebook kernel under nbval or making its expected outputs: no
# progress bars, which show only while something is generated or trained (a fresh clone's first execution) and so
# would change how many outputs a cell has; and its runs in a fresh folder (kernel_environment)


def kernel_environment(runs: Path) -> dict[str, str]:
    """The environment of a notebook kernel whose outputs are compared (nbval) or kept as the expected ones:
    this process's, :data:`KERNEL_ENVIRONMENT`, and runs under ``runs`` (``$DMLSTUDY_RUNS``), an empty folder
    per test run, so that every notebook trains as on a fresh clone, whatever runs the project holds."""
    return {**os.environ, **KERNEL_ENVIRONMENT, RUNS_VARIABLE: str(runs)}


PARAMETERS_CELL = re.compile(r'^# %% tags=\["parameters"\]\n(?P<body>(?:(?!# %%).*\n)*?)(?=\n# %%|\Z)', re.MULTILINE)


def notebooks_folder() -> Path:
    return project_root() / "notebooks"


def notebook_configs() -> dict[str, type]:
    """Each notebook → the config dataclass its ``parameters`` cell mirrors one to one (checked by
    ``tests/test_notebooks.py``). Imported inside the function so that :func:`strip`, git's filter, stays light;
    they are plain imports, so the import graph sees every one."""
    from dmlstudy.experiments.compare import CompareStudy
    from dmlstudy.experiments.datasets import DatasetTour
    from dmlstudy.experiments.explore import ExploreConfig
    from dmlstudy.experiments.one_run import OneRun
    from dmlstudy.experiments.papers.cross_attention import CrossAttentionStudy
    from dmlstudy.experiments.papers.crt import CRTStudy
    from dmlstudy.experiments.papers.dgcrl import DGCRLStudy
    from dmlstudy.experiments.papers.diml import DIMLStudy

    return {
        "00_datasets.ipynb": DatasetTour,
        "01_train.ipynb": OneRun,
        "10_crt.ipynb": CRTStudy,
        "20_diml.ipynb": DIMLStudy,
        "30_cross_attention.ipynb": CrossAttentionStudy,
        "40_dgcrl.ipynb": DGCRLStudy,
        "90_compare.ipynb": CompareStudy,
        "95_explore.ipynb": ExploreConfig,
    }


def config_class(stem: str) -> type:
    """The dataclass that notebook ``stem``'s parameters cell mirrors."""
    configs = notebook_configs()
    if f"{stem}.ipynb" not in configs:
        raise KeyError(f"notebook {stem!r} has no config; notebooks with one: {sorted(configs)}")
    return configs[f"{stem}.ipynb"]


def parameters_source(stem: str) -> str:
    """The ``parameters`` cell of notebook ``stem``: ``name: type = literal  # comment`` per config field."""
    config = config_class(stem)
    values = {"study": f"notebook-{stem}", **CI_SIZED.get(stem, {})}  # a field's, or a nested config's field's
    comments = config.field_help()  # the one reader of field comments (dmlstudy.config.TypedConfig)
    hints = typing.get_type_hints(config)
    lines = []
    for spec in dataclasses.fields(config):
        kind = hints[spec.name]
        if is_typed_config(kind):
            own = set(config.field_names())
            value = {name: values[name] for name in kind.field_names() if name in values and name not in own}
            kind = dict
        elif spec.name in values:
            value = values[spec.name]
        elif spec.default is not dataclasses.MISSING:
            value = spec.default
        else:
            value = spec.default_factory()
        try:
            ast.literal_eval(repr(value))
        except ValueError:
            raise ValueError(
                f"{config.__name__}.{spec.name}: a parameters cell holds literals only, got {value!r}"
            ) from None
        comment = comments.get(spec.name, "")
        if "=" in comment:  # papermill reads "name: type = value  # comment" and would take the comment's "=" for it
            raise ValueError(f"{config.__name__}.{spec.name}: a parameter's comment cannot hold '=': {comment!r}")
        lines.append(f"{spec.name}: {kind.__name__} = {value!r}  # {comment}".rstrip())
    return "\n".join(lines) + "\n"


def with_parameters(source: str, stem: str) -> str:
    """``source`` (py:percent text) with its ``parameters`` cell rewritten from the config."""
    matches = list(PARAMETERS_CELL.finditer(source))
    if len(matches) != 1:
        raise ValueError(f"notebooks/{stem}.py: expected one '# %% tags=[\"parameters\"]' cell, found {len(matches)}")
    match = matches[0]
    return source[: match.start("body")] + parameters_source(stem) + source[match.end("body") :]


def _clean_notebook(cells, *, where: str) -> str:
    """The ``.ipynb`` text of ``cells`` as the project commits notebooks: python3 kernel metadata, cells
    ``cell-NN`` (or their own id), markdown and code only, code cells with their tags and no outputs."""
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.metadata["language_info"] = {"name": "python"}
    for index, cell in enumerate(cells):
        if cell.cell_type == "markdown":
            new = nbformat.v4.new_markdown_cell(cell.source)
        elif cell.cell_type == "code":
            new = nbformat.v4.new_code_cell(cell.source)
            tags = cell.metadata.get("tags", [])
            if tags:
                new.metadata["tags"] = list(tags)
        else:
            raise ValueError(
                f"{where}: unexpected {cell.cell_type} cell {index}: notebooks hold markdown and code cells only"
            )
        new["id"] = cell.get("id") or f"cell-{index:02d}"
        notebook.cells.append(new)
    nbformat.validate(notebook)
    return nbformat.writes(notebook) + "\n"


def build(source: str) -> str:
    """The ``.ipynb`` text of a py:percent ``source``: cells ``cell-NN``, no outputs, python3 kernel."""
    cells = jupytext.reads(source, fmt="py:percent").cells
    for cell in cells:
        cell.pop("id", None)  # jupytext's own ids: the committed notebook numbers its cells
    return _clean_notebook(cells, where="source")


def strip(text: str) -> str:
    """``text`` (an ``.ipynb``) as :func:`build` writes it: outputs and execution counts removed, only the cell
    tags and the notebook's kernel metadata kept. An unchanged built notebook strips to itself."""
    return _clean_notebook(nbformat.reads(text, as_version=4).cells, where="notebook")


def expected_folder() -> Path:
    return project_root() / "tests" / "notebook_outputs"


def expected_copy(executed: nbformat.NotebookNode) -> str:
    """The ``.ipynb`` text of ``executed`` as nbval's reference: the built cells with their outputs and execution
    counts (nbval takes a cell without a count for one never run), images dropped (a figure keeps its
    ``text/plain`` line) and execution metadata removed, so the file is small and changes only when an output does."""
    notebook = nbformat.reads(_clean_notebook(executed.cells, where="executed notebook"), as_version=4)
    for built, ran in zip(notebook.cells, executed.cells, strict=True):
        if built.cell_type != "code":
            continue
        outputs = []
        for output in ran.get("outputs", []):
            output = nbformat.from_dict(dict(output))
            if output.output_type != "stream":
                output["metadata"] = {}
            if "data" in output:
                output["data"] = {key: value for key, value in output["data"].items() if not key.startswith("image/")}
            outputs.append(output)
        built["outputs"] = outputs
        built["execution_count"] = ran.get("execution_count")
    nbformat.validate(notebook)
    return nbformat.writes(notebook) + "\n"


def execute_expected(names: typing.Sequence[str] = (), *, timeout: int = 1800) -> list[Path]:
    """Execute each built notebook (``names``: stems; default all) at its CI-sized defaults, from
    :func:`expected_folder` as nbval does, and write its :func:`expected_copy` there; returns the files written."""
    from jupyter_client import AsyncKernelManager
    from nbclient import NotebookClient

    from dmlstudy.study.executor import kernel_config

    folder = expected_folder()
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    runs = Path(tempfile.mkdtemp(prefix="dmlstudy-notebook-outputs-")) / "runs"
    try:
        for stem in names or stems():
            notebook = nbformat.reads(build((notebooks_folder() / f"{stem}.py").read_text()), as_version=4)
            kernel = AsyncKernelManager(kernel_name="python3", config=kernel_config())
            client = NotebookClient(notebook, km=kernel, timeout=timeout, resources={"metadata": {"path": str(folder)}})
            client.execute(env=kernel_environment(runs))
            path = folder / f"{stem}.ipynb"
            path.write_text(expected_copy(notebook))
            written.append(path)
    finally:
        shutil.rmtree(runs.parent, ignore_errors=True)
    return written


def stems(folder: Path | None = None) -> list[str]:
    return sorted(path.stem for path in (folder or notebooks_folder()).glob("*.py"))


def out_of_date(folder: Path | None = None) -> list[str]:
    """Every source whose parameters cell differs from its config, and every ``.ipynb`` that differs from
    what its source builds (or is missing), as readable lines; empty when all are current."""
    folder = folder or notebooks_folder()
    problems = []
    for stem in stems(folder):
        source = (folder / f"{stem}.py").read_text()
        if with_parameters(source, stem) != source:
            problems.append(
                f"notebooks/{stem}.py: parameters cell differs from {config_class(stem).__name__} (run `make notebooks`)"
            )
        notebook = folder / f"{stem}.ipynb"
        if not notebook.is_file() or notebook.read_text() != build(source):
            problems.append(f"notebooks/{stem}.ipynb: differs from notebooks/{stem}.py (run `make notebooks`)")
    orphans = sorted({path.stem for path in folder.glob("*.ipynb")} - set(stems(folder)))
    problems += [f"notebooks/{stem}.ipynb: has no source notebooks/{stem}.py" for stem in orphans]
    if folder == notebooks_folder():
        problems += expected_out_of_date()
    return problems


def expected_out_of_date() -> list[str]:
    """Every notebook whose expected outputs are missing or were executed from other cells than its source
    builds now, as readable lines."""
    problems = []
    for stem in stems():
        path = expected_folder() / f"{stem}.ipynb"
        if not path.is_file():
            problems.append(f"tests/notebook_outputs/{stem}.ipynb: missing (run `make notebook-outputs`)")
        elif strip(path.read_text()) != build((notebooks_folder() / f"{stem}.py").read_text()):  # cells, outputs aside
            problems.append(
                f"tests/notebook_outputs/{stem}.ipynb: executed from other cells than notebooks/{stem}.py "
                "(run `make notebook-outputs`)"
            )
    return problems


def build_all(folder: Path | None = None) -> list[Path]:
    """Rewrite every source's parameters cell, then every ``.ipynb``; returns the files that changed."""
    folder = folder or notebooks_folder()
    changed = []
    for stem in stems(folder):
        source_path, notebook_path = folder / f"{stem}.py", folder / f"{stem}.ipynb"
        source = source_path.read_text()
        updated = with_parameters(source, stem)
        if updated != source:
            source_path.write_text(updated)
            changed.append(source_path)
        text = build(updated)
        if not notebook_path.is_file() or notebook_path.read_text() != text:
            notebook_path.write_text(text)
            changed.append(notebook_path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dmlstudy.experiments.notebooks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("command", choices=["build", "check", "strip", "expected"])
    parser.add_argument("stems", nargs="*", help="expected: the notebooks to execute (default: all)")
    args = parser.parse_args(argv)
    if args.command == "expected":
        for path in execute_expected(args.stems):
            print("wrote", path.relative_to(project_root()))
        return 0
    if args.command == "strip":
        sys.stdout.write(strip(sys.stdin.read()))
        return 0
    if args.command == "build":
        for path in build_all():
            print("wrote", path.relative_to(project_root()))
        return 0
    problems = out_of_date()
    print("\n".join(problems) or "every notebook equals its source")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
