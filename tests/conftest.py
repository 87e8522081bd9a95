"""Shared fixtures: a tiny image dataset in the CUB-200-2011 layout (rendered by the SynBirds generator),
read through the real ``cub200`` reader, so training tests exercise the whole data path in seconds."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "TRUE")


@pytest.fixture(scope="package")
def tiny_data_root(tmp_path_factory) -> Path:
    """``<root>/cub200`` holds 24 classes × 6 images (12 train classes, 12 test classes), 64 px."""
    from dmlstudy.data.embedded import ensure_generated
    from dmlstudy.data.synbirds import SynBirdsGenerator

    root = tmp_path_factory.mktemp("data")
    ensure_generated(root / "cub200", SynBirdsGenerator(num_classes=24, images_per_class=6, workers=1), seed=5)
    return root


TINY_RUN = dict(image_size=32, classes_per_batch=4, samples_per_class=3, steps_per_epoch=2)  # seconds-long runs


@pytest.fixture
def tiny_config(tiny_data_root, tmp_path):
    """A TrainConfig factory for seconds-long runs on the tiny dataset, writing into a temporary runs folder."""
    from dmlstudy.run.train import TrainConfig

    def make(**overrides):
        values = dict(
            study="test",
            runs_root=str(tmp_path / "runs"),
            data_root=str(tiny_data_root),
            dataset="cub200",
            **TINY_RUN,
            epochs=2,
            eval_batch_size=64,
            progress=False,
            device="cpu",
        )
        values.update(overrides)
        return TrainConfig(**values)

    return make


@pytest.fixture
def tiny_comparison(tiny_data_root, tmp_path):
    """A ``compare.CompareStudy`` factory on the tiny dataset (one 2-step epoch per run), writing into a
    temporary runs folder. An override named like a protocol field (``seeds``, ``regime``) goes into the
    config's ``protocol``; the others are the comparison's own."""
    from dmlstudy.experiments.compare import CompareStudy
    from dmlstudy.run.protocol import ProtocolConfig

    def make(**overrides):
        protocol = dict(
            study="test",
            runs_root=str(tmp_path / "runs"),
            data_root=str(tiny_data_root),
            datasets=["cub200"],
            **TINY_RUN,
            epochs=1,
            train_classes=0,
            test_classes=0,
        )
        protocol.update({key: value for key, value in overrides.items() if key in ProtocolConfig.field_names()})
        own = {key: value for key, value in overrides.items() if key not in ProtocolConfig.field_names()}
        return CompareStudy(protocol=protocol, **own)

    return make
