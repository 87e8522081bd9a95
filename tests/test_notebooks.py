"""Notebooks: built from their jupytext sources, a parameters cell that mirrors a typed config dataclass one to one, no stored outputs, and a
clear error when papermill injects a parameter of the wrong type. (nbval executes every notebook.)"""

import ast
import dataclasses
import json
import shutil
import typing
from pathlib import Path

import nbformat
import papermill
import pytest
from papermill.exceptions import PapermillExecutionError

from dmlstudy.config import is_typed_config
from dmlstudy.experiments import notebooks as notebook_sources
from dmlstudy.run.protocol import ProtocolConfig

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PRESENT = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
NOTEBOOK_CONFIGS = notebook_sources.notebook_configs()


def test_every_notebook_has_a_config():
    assert PRESENT, "no notebooks found"
    assert set(PRESENT) <= set(NOTEBOOK_CONFIGS), (
        f"notebooks without a config dataclass: {set(PRESENT) - set(NOTEBOOK_CONFIGS)}"
    )


@pytest.mark.parametrize("name", PRESENT)
def test_parameters_cell_mirrors_the_config(name):
    parameters = papermill.inspect_notebook(str(NOTEBOOKS / name))
    config = NOTEBOOK_CONFIGS[name]
    hints = typing.get_type_hints(config)
    fields = [spec.name for spec in dataclasses.fields(config)]
    assert list(parameters) == fields
    for field_name, declared in parameters.items():
        expected = "dict" if is_typed_config(hints[field_name]) else hints[field_name].__name__  # a nested config
        assert declared["inferred_type_name"] == expected, field_name
        assert declared["help"], f"{name}: parameter {field_name} has no comment"
    cell = next(
        c for c in json.loads((NOTEBOOKS / name).read_text())["cells"] if "parameters" in c["metadata"].get("tags", [])
    )
    namespace: dict = {}
    exec("".join(cell["source"]), namespace)
    config(**{k: namespace[k] for k in fields})  # the CI-sized defaults are a valid config


@pytest.mark.parametrize("name", PRESENT)
def test_committed_notebooks_have_no_outputs(name):
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    assert not any(cell.get("outputs") or cell.get("execution_count") for cell in cells if cell["cell_type"] == "code")


def test_wrong_parameter_type_is_named(tmp_path):
    with pytest.raises(PapermillExecutionError, match="parameter 'epochs' must be of type int, got str"):
        papermill.execute_notebook(
            str(NOTEBOOKS / "01_train.ipynb"),
            str(tmp_path / "out.ipynb"),
            parameters={"epochs": "two", "runs_root": str(tmp_path)},
            kernel_name="python3",
            progress_bar=False,
        )


def test_committed_notebooks_equal_their_sources():
    assert notebook_sources.out_of_date() == []
    assert sorted(notebook_sources.stems()) == sorted(Path(name).stem for name in PRESENT)


def test_a_stale_notebook_or_parameters_cell_is_named(tmp_path):
    for stem in ("01_train", "10_crt"):
        for suffix in (".py", ".ipynb"):
            shutil.copy(NOTEBOOKS / f"{stem}{suffix}", tmp_path)
    assert notebook_sources.out_of_date(tmp_path) == []
    crt_source = tmp_path / "10_crt.py"
    crt_source.write_text(
        crt_source.read_text().replace("for reading in readings:", "for reading in sorted(readings):")
    )
    train_source = tmp_path / "01_train.py"
    train_source.write_text(train_source.read_text().replace("epochs: int = 2", "epochs: int = 3"))
    assert notebook_sources.out_of_date(tmp_path) == [
        "notebooks/01_train.py: parameters cell differs from OneRun (run `make notebooks`)",
        "notebooks/01_train.ipynb: differs from notebooks/01_train.py (run `make notebooks`)",
        "notebooks/10_crt.ipynb: differs from notebooks/10_crt.py (run `make notebooks`)",
    ]
    changed = notebook_sources.build_all(tmp_path)
    assert sorted(path.name for path in changed) == ["01_train.py", "10_crt.ipynb"]
    assert notebook_sources.out_of_date(tmp_path) == []
    assert "epochs: int = 2  #" in train_source.read_text()  # the config's CI-sized value is written back
    built = json.loads((tmp_path / "10_crt.ipynb").read_text())
    assert any("for reading in sorted(readings):" in "".join(cell["source"]) for cell in built["cells"])


def test_parameters_cell_lines_come_from_the_config():
    lines = notebook_sources.parameters_source("20_diml").splitlines()
    config = NOTEBOOK_CONFIGS["20_diml.ipynb"]
    assert [line.split(":")[0] for line in lines] == [spec.name for spec in dataclasses.fields(config)]
    for line, spec in zip(lines, dataclasses.fields(config)):
        value = line.split(" = ", 1)[1].split("  # ")[0]
        if spec.name != "protocol":
            default = spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()
            assert ast.literal_eval(value) == default, spec.name


@pytest.mark.parametrize("stem", ["10_crt", "20_diml", "30_cross_attention", "40_dgcrl", "90_compare"])
def test_a_paper_notebook_takes_the_shared_protocol_as_one_short_parameter(stem):
    [line] = [line for line in notebook_sources.parameters_source(stem).splitlines() if line.startswith("protocol:")]
    assert line.startswith(f"protocol: dict = {{'study': 'notebook-{stem}'}}  # the shared protocol: ")
    config = NOTEBOOK_CONFIGS[f"{stem}.ipynb"]
    protocol_fields = set(ProtocolConfig.field_names())
    assert not protocol_fields & set(config.field_names()), "the protocol's fields are not parameters of their own"
    built = config.from_namespace({"protocol": {"study": f"notebook-{stem}"}}).protocol
    assert built == ProtocolConfig(study=f"notebook-{stem}"), "the keys left out keep the CI-sized defaults"
    idea, parameters = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())["cells"][:2]
    assert idea["cell_type"] == "markdown" and "".join(idea["source"]).startswith("# "), (
        "the notebook opens with its idea"
    )
    assert parameters["metadata"].get("tags") == ["parameters"], "then the short parameters cell"


def test_a_wrong_protocol_value_is_named_with_its_key(tmp_path):
    with pytest.raises(PapermillExecutionError, match=r"parameter 'protocol\.seeds' must be of type list, got int"):
        papermill.execute_notebook(
            str(NOTEBOOKS / "20_diml.ipynb"),
            str(tmp_path / "out.ipynb"),
            parameters={"protocol": {"seeds": 3, "runs_root": str(tmp_path)}},
            kernel_name="python3",
            progress_bar=False,
        )


def _with_outputs(text: str) -> str:
    """A built notebook as JupyterLab saves it after a run: outputs, counts, kernel and cell metadata."""
    notebook = nbformat.reads(text, as_version=4)
    notebook.metadata["kernelspec"]["display_name"] = "Python 3 (ipykernel)"
    notebook.metadata["language_info"].update(version="3.11.9", mimetype="text/x-python")
    for count, cell in enumerate(c for c in notebook.cells if c.cell_type == "code"):
        cell.execution_count = count + 1
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"output {count}\n")]
        cell.metadata["execution"] = {"iopub.status.busy": "2026-11-23T10:00:00"}
    return nbformat.writes(notebook)


def test_strip_gives_back_the_built_notebook():
    source = (NOTEBOOKS / "01_train.py").read_text()
    built = notebook_sources.build(source)
    run = _with_outputs(built)
    assert run != built and '"output 0' in run
    assert notebook_sources.strip(run) == built
    assert notebook_sources.strip(built) == built


def test_the_recorded_revision_runs_the_notebook_filter_once_per_changed_file(tmp_path):
    """Every run records the git revision; with a filter on notebooks, a call that re-filtered every file whose
    stat is newer than the index (all of a fresh clone) cost seconds per run and made CI 5× slower."""
    import os
    import subprocess

    from dmlstudy.records import git_revision

    if shutil.which("git") is None:
        pytest.skip("git is not installed")

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    calls = tmp_path.parent / f"{tmp_path.name}-filter-calls"
    git("init", "-q")
    git("config", "user.email", "test@example.com")
    git("config", "user.name", "test")
    git("config", "filter.notebook-outputs.clean", f"sh -c 'echo x >> {calls}; cat'")
    (tmp_path / ".gitattributes").write_text("*.ipynb filter=notebook-outputs\n")
    notebooks = [tmp_path / f"{index}.ipynb" for index in range(3)]
    for path in notebooks:
        path.write_text("{}\n")
    git("add", ".")
    git("commit", "-qm", "notebooks")
    earlier = notebooks[0].stat().st_mtime - 100
    for path in notebooks:
        os.utime(path, (earlier, earlier))  # content unchanged, stat not the index's (as after a fresh clone)
    calls.unlink(missing_ok=True)
    assert [git_revision(tmp_path).endswith("+dirty") for _ in range(3)] == [False] * 3
    assert len(calls.read_text().splitlines()) == len(notebooks)


def test_git_sees_a_run_notebook_without_its_outputs(tmp_path):
    """The `.gitattributes` filter, registered as `make install` does: a notebook saved with outputs is not a
    change, and what gets committed has none."""
    import subprocess
    import sys

    from dmlstudy.records import git_revision

    if shutil.which("git") is None:
        pytest.skip("git is not installed")

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("config", "user.email", "test@example.com")
    git("config", "user.name", "test")
    git("config", "filter.notebook-outputs.clean", f"{sys.executable} -m dmlstudy.experiments.notebooks strip")
    (tmp_path / "notebooks").mkdir()
    shutil.copy(NOTEBOOKS.parent / ".gitattributes", tmp_path / ".gitattributes")
    notebook = tmp_path / "notebooks" / "01_train.ipynb"
    built = notebook_sources.build((NOTEBOOKS / "01_train.py").read_text())
    notebook.write_text(built)
    git("add", ".")
    git("commit", "-qm", "built")
    notebook.write_text(_with_outputs(built))
    assert git("diff", "--stat") == "", "a notebook run in JupyterLab differs from the commit"
    assert not git_revision(tmp_path).endswith("+dirty"), "outputs alone made the recorded revision dirty"
    git("add", ".")
    assert git("status", "--porcelain") == "", "adding a run notebook staged its outputs"
    notebook.write_text(_with_outputs(built).replace("Train one method", "Train a method"))
    assert git_revision(tmp_path).endswith("+dirty")
    git("add", ".")
    committed = git("show", ":notebooks/01_train.ipynb")
    assert "Train a method" in committed and '"outputs": []' in committed and "output 0" not in committed
