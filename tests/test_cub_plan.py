"""plans/cub.yaml and plans/tune_cub.yaml: the default study's headline protocol on cub200, tuned on CUB's own
validation classes into a folder the plan reads; the plan's notebook path executed at CI size on a small folder in
the official CUB layout (the fetched layout), its images of different sizes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from dmlstudy.config import load_yaml
from dmlstudy.experiments import compare
from dmlstudy.findings.claims import CLAIMS
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.study.executor import run_plan
from dmlstudy.study.plan import load_plan
from dmlstudy.study.tuning import RowResult, load_tune_config, plan_rows, write_tuned
from tests.fixtures_layouts import write_cub

ROOT = Path(__file__).resolve().parents[1]
PLAN, TUNE, DEFAULT = ROOT / "plans" / "cub.yaml", ROOT / "plans" / "tune_cub.yaml", ROOT / "plans" / "default.yaml"
CI_SIZES = dict(
    seeds=[0], epochs=1, steps_per_epoch=2, image_size=32, classes_per_batch=4, samples_per_class=3, workers=1
)


def _entries(path: Path) -> dict[str, dict]:
    return {entry.run_name: entry.parameters for entry in load_plan(path)}


def test_the_cub_plan_is_the_default_studys_protocol_and_rows_on_cub200():
    cub, default = _entries(PLAN), _entries(DEFAULT)
    assert set(cub) == set(default) - {"train"}  # the one MS run shown at emoji's tuned values is left out
    for name, parameters in cub.items():
        expected = json.loads(json.dumps(default[name]).replace('"emoji"', '"cub200"'))
        if "protocol" in expected:
            expected["protocol"] |= {"tuned": "runs/tune_cub/tuned", "data_root": ""}
        if name == "datasets":
            expected["data_root"] = ""
        assert parameters == expected, name


def test_the_cub_tuning_plan_tunes_the_compared_rows_with_the_default_budget_where_the_plan_reads_them():
    tune, imagenet = load_tune_config(TUNE), load_tune_config(ROOT / "plans" / "tune_imagenet.yaml")
    own = {"name", "protocol", "datasets", "out_dir", "figure"}  # the study plan each reads its protocol from
    assert {k: v for k, v in dataclasses.asdict(tune).items() if k not in own} == {
        k: v for k, v in dataclasses.asdict(imagenet).items() if k not in own
    }
    assert tune.datasets == ["cub200"] and tune.rows == plan_rows(str(DEFAULT))
    protocol = ProtocolConfig(**load_yaml(PLAN.read_text())["protocol"])
    assert (
        Path(tune.out_dir) == Path(protocol.tuned) / protocol.regime
    )  # ProtocolConfig.tuned_folder's <tuned>/<regime>
    assert not Path(tune.out_dir).is_relative_to("plans"), "the committed tuned values are never rewritten"


@pytest.fixture(scope="module")
def cub_root(tmp_path_factory) -> Path:
    """A data root holding ``cub200/CUB_200_2011/``: 16 classes × 5 images in the official layout (the fetched one),
    of different sizes as CUB's photos are, and tuned values where plans/tune_cub.yaml writes them
    (``<tuned>/imagenet/cub200.yaml``), for MS only."""
    root = tmp_path_factory.mktemp("cub_plan")
    write_cub(root / "data" / "cub200", images_per_class=[5] * 16, mixed_sizes=True)
    ms = RowResult("cub200", "ms", {"lr": 0.002, "method_kwargs": {"loss_kwargs": {"alpha": 3.0}}}, 0.5, 6, [], 1.0)
    write_tuned(root / "tuned" / "imagenet" / "cub200.yaml", "cub200", [ms], {"command": "test"}, regime="imagenet")
    return root


def _ci_entry(name: str, root: Path, runs: Path) -> dict:
    """The parameters of the plan's entry ``name`` at CI size, reading ``root``'s data and tuned values."""
    [parameters] = [entry.parameters for entry in load_plan(PLAN) if entry.run_name == name]
    parameters = dict(parameters)
    if "protocol" in parameters:
        parameters["protocol"] = {
            **parameters["protocol"],
            **CI_SIZES,
            "data_root": str(root / "data"),
            "tuned": str(root / "tuned"),
            "runs_root": str(runs),
            "study": "cub",
        }
    return parameters


def test_the_cub_plans_dataset_tour_runs_as_a_notebook_on_the_fetched_layout(cub_root, tmp_path):
    parameters = _ci_entry("datasets", cub_root, tmp_path / "runs") | {
        "data_root": str(cub_root / "data"),
        "knn_sizes": [32],
    }
    plan = tmp_path / "cub_ci.yaml"
    notebook = "notebooks/00_datasets.ipynb"
    plan.write_text(
        yaml.safe_dump(
            {"study": "cub", "entries": [{"name": "datasets", "notebook": notebook, "parameters": parameters}]}
        )
    )
    [outcome] = run_plan(plan, root=tmp_path / "runs")
    assert outcome.status == "complete", outcome.error
    executed = json.loads((tmp_path / "runs" / "cub" / "datasets" / "00_datasets.ipynb").read_text())
    outputs = json.dumps([output for cell in executed["cells"] for output in cell.get("outputs", [])])
    assert "cub200" in outputs and "CUB_200_2011" not in outputs  # a table of the dataset, no layout error


@pytest.mark.filterwarnings("ignore::dmlstudy.run.protocol.UntunedRowWarning")
def test_the_cub_plans_comparison_judges_the_8_headline_claims_on_cub200_at_ci_size(cub_root, tmp_path):
    """The comparison entry's rows, protocol and regime as the plan gives them, at one seed of one 2-step epoch (the
    notebooks' CI size; the ablation runs left out), trained in this process as the comparison tests do."""
    parameters = _ci_entry("compare", cub_root, tmp_path / "runs") | {"classic_seeds": [0], "ablation_seeds": []}
    result = compare.compare_regime(compare.CompareStudy(**parameters))
    headline = result.claims[result.claims["kind"] == "headline"]
    assert sorted(headline["claim"]) == sorted(c.name for c in CLAIMS if c.kind == "headline")
    assert set(headline["dataset"]) == {"cub200"} and set(headline["regime"]) == {"imagenet"}
    assert (headline["seeds"] == 1).all()
    cache = cub_root / "data" / "cub200" / ".tensor-cache"
    assert sorted(path.name for path in cache.glob("*.npy")) == ["cub200-test-37px.npy", "cub200-train-37px.npy"]
    configs = {variant: run.config for variant, run in result.main}
    assert configs["ms"].stem_views and configs["ms"].backbone == "dml_efficientnet_lite0"  # the imagenet regime
    assert configs["ms"].lr == 0.002 and configs["crt"].lr == 0.004  # tuned values read from <tuned>/imagenet/
