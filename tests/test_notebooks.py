"""Notebooks: a parameters cell that mirrors a typed config dataclass one to one, no stored outputs, and a
clear error when papermill injects a parameter of the wrong type. (nbval executes every notebook.)"""
import dataclasses
import importlib
import json
import typing
from pathlib import Path

import papermill
import pytest
from papermill.exceptions import PapermillExecutionError

from dmlstudy.experiments import NOTEBOOK_CONFIGS

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PRESENT = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


def config_class(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def test_every_notebook_has_a_config():
    assert PRESENT, "no notebooks found"
    assert set(PRESENT) <= set(NOTEBOOK_CONFIGS), f"notebooks without a config dataclass: {set(PRESENT) - set(NOTEBOOK_CONFIGS)}"


@pytest.mark.parametrize("name", PRESENT)
def test_parameters_cell_mirrors_the_config(name):
    parameters = papermill.inspect_notebook(str(NOTEBOOKS / name))
    config = config_class(NOTEBOOK_CONFIGS[name])
    hints = typing.get_type_hints(config)
    fields = [spec.name for spec in dataclasses.fields(config)]
    assert list(parameters) == fields
    for field_name, declared in parameters.items():
        assert declared["inferred_type_name"] == hints[field_name].__name__, field_name
        assert declared["help"], f"{name}: parameter {field_name} has no comment"
    cell = next(c for c in json.loads((NOTEBOOKS / name).read_text())["cells"] if "parameters" in c["metadata"].get("tags", []))
    namespace: dict = {}
    exec("".join(cell["source"]), namespace)
    config(**{k: namespace[k] for k in fields})  # the CI-sized defaults are a valid config


@pytest.mark.parametrize("name", PRESENT)
def test_committed_notebooks_have_no_outputs(name):
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    assert not any(cell.get("outputs") or cell.get("execution_count") for cell in cells if cell["cell_type"] == "code")


def test_wrong_parameter_type_is_named(tmp_path):
    with pytest.raises(PapermillExecutionError, match="parameter 'epochs' must be of type int, got str"):
        papermill.execute_notebook(str(NOTEBOOKS / "01_train.ipynb"), str(tmp_path / "out.ipynb"), parameters={"epochs": "two", "runs_root": str(tmp_path)},
                                   kernel_name="python3", progress_bar=False)
