"""The study runner end to end on the real plans: the smoke plan's training entries execute through papermill
and leave run records whose values are checked; every plan file is well-formed and names real parameters."""

import json
import re
from pathlib import Path

import papermill
import pytest

from dmlstudy.experiments.notebooks import config_class
from dmlstudy.study.executor import run_plan
from dmlstudy.study.plan import injected_parameters, load_plan

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted(p for p in (ROOT / "plans").glob("*.yaml") if not p.stem.startswith("tune"))  # tune*: TuneConfig plans


@pytest.mark.parametrize("plan", PLANS, ids=[p.name for p in PLANS])
def test_plan_entries_name_declared_parameters(plan):
    entries = load_plan(plan)
    assert entries
    declared = {}
    for entry in entries:
        if entry.notebook not in declared:
            declared[entry.notebook] = papermill.inspect_notebook(str(entry.notebook))
        injected = injected_parameters(entry, declared[entry.notebook], ROOT / "runs")  # raises on unknown parameters
        config = config_class(entry.notebook.stem)(**injected)  # and a protocol key or a value its config refuses
        if "protocol" in injected:
            assert config.protocol.study == entry.study and config.protocol.runs_root == str(ROOT / "runs")


def test_smoke_training_entries_leave_checked_records(tmp_path):
    outcomes = run_plan(ROOT / "plans" / "smoke.yaml", root=tmp_path, only="^train-")
    assert [o.status for o in outcomes] == ["complete", "complete"], [o.error for o in outcomes]
    for dataset in ("synbirds", "glyphs"):
        entry_dir = tmp_path / "smoke" / f"train-dataset={dataset}"  # the executed notebook and the entry record
        (run_dir,) = (tmp_path / "smoke").glob(f"train-dataset={dataset}-*")  # the run: the entry name + config hash
        assert re.fullmatch(rf"train-dataset={dataset}-[0-9a-f]{{8}}", run_dir.name)
        metrics = json.loads((run_dir / "metrics.json").read_text())
        assert 0.0 < metrics["R@1"] <= 1.0 and metrics["R@1"] <= metrics["R@8"]
        assert (entry_dir / "01_train.ipynb").is_file() and (run_dir / "checkpoint.pt").is_file()
        assert json.loads((entry_dir / "study_entry.json").read_text())["status"] == "complete"
