"""Every paper-protocol config in plans/papers/ is a valid TrainConfig and trains for one step.

Each file is loaded as `dmlstudy train --config` loads it, turned into a TrainConfig, and run for one step on a
tiny fixture in its dataset's official layout (tests/fixtures_layouts.py), with the config's own backbone,
method and method keyword arguments. Only size fields are overridden (image size, batch, steps, Recall@K
list, evaluation batch) plus where the run reads and writes; ``pretrained`` is switched off (no weights
here). The test checks that nothing else was changed.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml

from tests.fixtures_layouts import write_cars, write_cub, write_inshop, write_sop

REPO = Path(__file__).resolve().parents[1]
PAPER_CONFIGS = sorted((REPO / "plans" / "papers").glob("*.yaml"))
PAPERS = ("crt", "diml", "cross_attention", "dgcrl")
DATASETS = ("cub200", "cars196", "sop", "inshop")

# Fields the smoke run may change: sizes (so one step runs in seconds on a CPU) and run locations.
SIZE_FIELDS = (
    "image_size",
    "classes_per_batch",
    "samples_per_class",
    "epochs",
    "steps_per_epoch",
    "recall_ks",
    "eval_batch_size",
)
LOCATION_FIELDS = ("pretrained", "data_root", "runs_root", "study", "run_name", "progress", "device", "num_workers")
SMOKE_OVERRIDES = {
    "pretrained": False,
    "image_size": 64,  # 2 × 2 final map for the stride-32 CNNs and pvt_v2 (ViTs take img_size from it too)
    "classes_per_batch": 2,
    "samples_per_class": 2,
    "epochs": 1,
    "steps_per_epoch": 1,
    "recall_ks": [1, 2],  # the benchmarks' K lists (up to 1000) exceed the tiny galleries
    "eval_batch_size": 16,
    "progress": False,
    "device": "cpu",
    "num_workers": 0,
}


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_every_paper_and_benchmark_has_a_config():
    names = {path.stem for path in PAPER_CONFIGS}
    expected = {f"crt_{d}" for d in DATASETS} | {
        f"{p}_{d}" for p in ("diml", "cross_attention") for d in ("cub200", "cars196", "sop")
    }
    expected |= {"dgcrl_cub200", "dgcrl_cars196"}
    assert names == expected


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_config_is_a_valid_train_config_with_the_papers_numbers(path):
    from dmlstudy.run.train import TrainConfig

    loaded = load(path)
    paper, dataset = next((p, path.stem[len(p) + 1 :]) for p in PAPERS if path.stem.startswith(p + "_"))
    parameters = loaded["parameters"]
    unknown = set(parameters) - set(TrainConfig.field_names())
    assert not unknown, f"{path.name}: not TrainConfig fields: {sorted(unknown)}"
    config = TrainConfig(**parameters)
    assert (config.method, config.dataset, config.pretrained) == (paper, dataset, True)
    reported = loaded["reported"]["metrics"]
    assert reported and all(0 < value <= 100 for value in reported.values())
    assert "# Run:" in path.read_text() and "Cannot be reproduced exactly" in path.read_text()


def write_fixture(dataset: str, root: Path) -> None:
    """A tiny dataset of 4 training and 4 test classes in ``root/<dataset>``, in the official layout."""
    if dataset == "cub200":
        write_cub(root / "cub200", images_per_class=[3] * 8)
    elif dataset == "cars196":
        write_cars(root / "cars196", images_per_class=[3] * 8)
    elif dataset == "sop":
        write_sop(root / "sop", images_per_class=[3] * 8)
    elif dataset == "inshop":
        items = [(f"id_{i:08d}", ["train"] * 3) for i in range(4)]
        items += [(f"id_{i:08d}", ["query", "query", "gallery", "gallery"]) for i in range(4, 8)]
        write_inshop(root / "inshop", items=items)
    else:
        raise ValueError(f"no fixture writer for dataset {dataset!r}")


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_config_trains_one_step_on_a_tiny_fixture(path, tmp_path):
    from dmlstudy.methods import METHODS
    from dmlstudy.run.train import TrainConfig, run

    parameters = load(path)["parameters"]
    if parameters["method"] not in METHODS:
        pytest.skip(f"method {parameters['method']!r} is not registered yet (its file is still a placeholder)")
    write_fixture(parameters["dataset"], tmp_path / "data")
    overrides = {
        **SMOKE_OVERRIDES,
        "data_root": str(tmp_path / "data"),
        "runs_root": str(tmp_path / "runs"),
        "study": "paper-smoke",
    }
    assert set(overrides) <= set(SIZE_FIELDS) | set(LOCATION_FIELDS)
    config = TrainConfig(**{**parameters, **overrides})
    as_written = TrainConfig(**parameters)
    changed = {
        f.name for f in dataclasses.fields(TrainConfig) if getattr(config, f.name) != getattr(as_written, f.name)
    }
    assert changed <= set(SIZE_FIELDS) | set(LOCATION_FIELDS), (
        f"smoke run changed protocol fields {changed - set(SIZE_FIELDS) - set(LOCATION_FIELDS)}"
    )
    assert (config.backbone, config.method, config.method_kwargs) == (
        parameters["backbone"],
        parameters["method"],
        parameters["method_kwargs"],
    )

    try:
        result = run(config)
    except NotImplementedError as error:
        pytest.skip(f"method {config.method!r} is still a placeholder: {error}")
    assert len(result.history) == 1 and math.isfinite(result.history["loss"].iloc[0])
    for key in ("R@1", "R@2", "P@1", "RP", "MAP@R", "NMI"):
        assert 0.0 <= result.metrics[key] <= 1.0, key
    assert result.embeddings["embeddings"].shape[1] == result.method.embedding_dim
    assert (result.run_dir / "metrics.json").is_file()
