"""Datasets: real benchmark readers (official layouts), the embedded generated sets, transforms, sampler.

``build_dataset(name, root, split)`` is the one entry point; importing this package registers every reader.
"""

from dmlstudy.data import cars, cub, emoji, fractals, glyphs, inshop, shapes, sop, synbirds  # noqa: F401,E401  (register readers)
from dmlstudy.data.base import (
    DATASETS,
    CorruptImageError,
    DatasetLayoutError,
    EvaluationProtocol,
    ImageListDataset,
    build_dataset,
    evaluation_protocol,
    list_datasets,
    register_dataset,
)
from dmlstudy.data.sampler import ClassBalancedBatchSampler
from dmlstudy.data.transforms import build_transforms, denormalize

__all__ = [
    "DATASETS",
    "ClassBalancedBatchSampler",
    "CorruptImageError",
    "DatasetLayoutError",
    "EvaluationProtocol",
    "ImageListDataset",
    "build_dataset",
    "build_transforms",
    "denormalize",
    "evaluation_protocol",
    "list_datasets",
    "register_dataset",
]
