"""A run's data: its training, validation and test splits as the run reads them (:func:`load_datasets`), the
class counts they hold (:func:`class_split_counts`, read without an image), and the batches of an epoch.

Two input pipelines give the same ``dataset[i] = (image, label)``: cached uint8 tensors augmented a batch at a
time (:mod:`dmlstudy.data.tensor_cache`; with ``stem_views``, the frozen stem's cached activations,
:mod:`dmlstudy.models.trunk_cache`), or image files with per-item transforms, whose random augmentation is a
pure function of ``(seed, epoch, item)`` (:class:`SeededAugmentation`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader

from dmlstudy.data import (
    ClassBalancedBatchSampler,
    ImageListDataset,
    build_dataset,
    build_transforms,
    evaluation_protocol,
)
from dmlstudy.data.folds import fold_classes, split_by_classes
from dmlstudy.data.loading import in_memory_format, resolve_num_workers
from dmlstudy.data.tensor_cache import (
    CACHE_FOLDER,
    BatchAugmentedTrain,
    DifferentImageSizes,
    EvaluationImages,
    TensorImageSplit,
    TensorLayout,
    cached_images,
    stored_side,
    tensor_layout,
)
from dmlstudy.models.trunk_cache import (
    CachedViewEvaluation,
    CachedViewTrain,
    StemActivationSplit,
    stem_activation_split,
)
from dmlstudy.paths import data_root
from dmlstudy.run import identity
from dmlstudy.run.model import ModelConfig, stem_backbone


class DataConfig(ModelConfig, Protocol):
    """The fields of a run's config (:class:`dmlstudy.run.train.TrainConfig`, which describes them) that its data
    depends on; those of its model too, as the ``stem_views`` pipeline runs the model's stem once per image."""

    data_root: str
    dataset: str
    train_classes: int
    test_classes: int
    validation_folds: int
    validation_fold: int
    final_test: bool
    recall_ks: list
    num_workers: int
    input_pipeline: str
    tensor_budget_gib: float
    progress: bool

    @property
    def validates(self) -> bool: ...


EVALUATION_MEMO_BYTES = 1 << 30  # evaluation splits whose transformed images fit in this are kept in memory
_logger = logging.getLogger(__name__)


def load_datasets(config: DataConfig) -> dict[str, Any]:
    """Train split (train augmentation) and the evaluation splits (test geometry) of ``config.dataset``.

    Tensor pipeline (:mod:`dmlstudy.data.tensor_cache`): ``train`` is a :class:`BatchAugmentedTrain`,
    ``query``/``gallery``/``validation`` :class:`EvaluationImages`. File pipeline: per-item PIL transforms
    (:class:`SeededAugmentation` and memoized test items). Both give ``dataset[i] = (image, label)``.

    With validation folds (:mod:`dmlstudy.data.folds`), the classes of fold ``validation_fold`` of the
    (first ``train_classes``) training classes leave ``train`` and form ``validation`` (query = gallery,
    each query excluding itself). With ``final_test=False`` the test split is never built or read:
    ``query`` and ``gallery`` are None.
    """
    root = Path(config.data_root or data_root()) / config.dataset
    protocol = evaluation_protocol(config.dataset)
    reads_test = config.final_test or not config.validates
    train = build_dataset(config.dataset, root, "train")
    query = build_dataset(config.dataset, root, protocol.query_split) if reads_test else None
    gallery = (
        build_dataset(config.dataset, root, protocol.gallery_split) if reads_test and protocol.gallery_split else None
    )
    found = _tensor_splits(config, root, {"train": train, "query": query, "gallery": gallery})
    recall_ks = tuple(config.recall_ks) or protocol.recall_ks
    tensors = found[0] if found is not None else None
    if config.stem_views:
        tensors = _stem_activations(config, root, found)
    if tensors is not None:
        first_training = _first_classes(tensors["train"], config.train_classes, "train_classes")
        training, validation = _validation_split(first_training, config.validation_folds, config.validation_fold)
        evaluation = {
            name: _first_classes(tensors[name], config.test_classes, "test_classes") if name in tensors else None
            for name in ("query", "gallery")
        }
        training_view, test_view = _tensor_views(config)
        return {
            "train": training_view(training),
            **{name: test_view(split) if split is not None else None for name, split in evaluation.items()},
            "validation": test_view(validation) if validation is not None else None,
            "recall_ks": recall_ks,
        }
    train.transform = build_transforms(config.image_size, train=True, hflip=train.flip_invariant)
    first_training = _first_classes(train, config.train_classes, "train_classes")
    training, validation = _validation_split(first_training, config.validation_folds, config.validation_fold)
    query = _first_classes(query, config.test_classes, "test_classes") if query is not None else None
    gallery = _first_classes(gallery, config.test_classes, "test_classes") if gallery is not None else None
    test_transform = build_transforms(config.image_size, train=False)
    for split in (query, gallery, validation):
        if split is not None:
            split.transform = test_transform
            if len(split) * 3 * config.image_size**2 * 4 <= EVALUATION_MEMO_BYTES:
                split.memoize_items()
    return {
        "train": SeededAugmentation(training, seed=config.seed),
        "query": query,
        "gallery": gallery,
        "validation": validation,
        "recall_ks": recall_ks,
    }


def class_split_counts(config: DataConfig) -> tuple[int, int]:
    """``(training classes, validation classes)`` of a run, as :func:`load_datasets` splits them: the first
    ``train_classes`` training classes (all when 0 or more than there are), less and in fold ``validation_fold``
    (0 validation classes without folds); read from the split's class list alone (no image, no cached tensor)."""
    root = Path(config.data_root or data_root()) / config.dataset
    classes = _first_class_count(build_dataset(config.dataset, root, "train").num_classes, config.train_classes)
    if not config.validates:
        return classes, 0
    kept, held_out = fold_classes(classes, config.validation_folds, config.validation_fold)
    return len(kept), len(held_out)


def training_class_count(config: DataConfig) -> int:
    """The number of classes a run trains on, what its class heads are sized by (:func:`class_split_counts`)."""
    return class_split_counts(config)[0]


def _first_classes(dataset, count: int, parameter: str):
    """The images of the first ``count`` classes (all when ``count`` is 0); labels stay 0 … count−1.
    A ``count`` above the split's classes warns, naming ``parameter``, and keeps them all."""
    if count > dataset.num_classes:
        identity.warn(
            f"parameter {parameter!r}={count} is more than the {dataset.num_classes} classes of {dataset.name}; "
            "all of them are used"
        )
    if _first_class_count(dataset.num_classes, count) == dataset.num_classes:
        return dataset
    return split_by_classes(dataset, np.arange(count), role=f"first {count} classes")


def _first_class_count(available: int, count: int) -> int:
    """How many of ``available`` classes "the first ``count``" keeps: all when ``count`` is 0 or more than there are."""
    return count if 0 < count < available else available


def _validation_split(train, folds: int, fold: int):
    """``(training part, validation part)`` of the training split: the classes outside and inside fold ``fold``
    of ``folds`` (:func:`dmlstudy.data.folds.fold_classes`), or ``(train, None)`` without folds (``folds`` < 2)."""
    if folds < 2:
        return train, None
    kept, held_out = fold_classes(train.num_classes, folds, fold)
    return (
        split_by_classes(train, kept, role="training classes"),
        split_by_classes(train, held_out, role=f"validation classes, fold {fold}"),
    )


def _tensor_splits(
    config: DataConfig, root: Path, splits: Mapping[str, ImageListDataset | None]
) -> tuple[dict[str, TensorImageSplit], dict[str, TensorLayout]] | None:
    """The splits as cached uint8 tensors and their layouts, or None for the file pipeline (``files``, over
    budget, or images of different sizes under ``auto`` without ``stem_views``).

    ``auto`` decides for all the splits of the run together: tensors only when their total size fits
    ``tensor_budget_gib``; otherwise the reason is logged. ``tensor`` raises instead of falling back.
    Images of different sizes are stacked resized to a square of :func:`~dmlstudy.data.tensor_cache.stored_side`
    (the module docstring of :mod:`dmlstudy.data.tensor_cache` has the rule) when the run needs tensors
    (``stem_views``, or ``input_pipeline='tensor'``); under ``auto`` otherwise they are read as files, whose
    training crops range over the whole photo.
    """
    if config.input_pipeline == "files":
        return None
    present = {name: split for name, split in splits.items() if split is not None}
    side = stored_side(config.image_size) if config.stem_views or config.input_pipeline == "tensor" else None
    budget = int(config.tensor_budget_gib * 2**30)
    try:
        layouts = {name: tensor_layout(split, root, side=side) for name, split in present.items()}
        total = sum(layout.nbytes for layout in layouts.values())
        if total > budget:
            raise MemoryError(
                f"{config.dataset}: its splits need {total / 2**30:.2f} GiB as uint8 tensors, over tensor_budget_gib = {config.tensor_budget_gib}"
            )
        resized = sorted(name for name, layout in layouts.items() if layout.side is not None)
        if resized:
            _logger.info(
                "%s: images of different sizes, cached with the shorter side resized to %d px and the centre "
                "%d × %d square cut out (splits %s)",
                config.dataset,
                side,
                side,
                side,
                ", ".join(resized),
            )
        tensors = {
            name: TensorImageSplit(split, torch.from_numpy(cached_images(split, root, layouts[name])))
            for name, split in present.items()
        }
        return tensors, layouts
    except (MemoryError, DifferentImageSizes) as reason:
        if config.input_pipeline == "tensor":
            raise ValueError(f"input_pipeline='tensor' is not possible: {reason}") from reason
        _logger.info(
            "%s; reading image files instead (input_pipeline='files', %d DataLoader workers)",
            reason,
            resolve_num_workers(config.num_workers),
        )
        return None


def _stem_activations(
    config: DataConfig,
    root: Path,
    found: tuple[Mapping[str, TensorImageSplit], Mapping[str, TensorLayout]] | None,
) -> dict[str, StemActivationSplit]:
    """The tensor splits as the stem's cached activations (``stem_views`` training views of ``train``, the test
    view of every split); computed once per image and view and shared by every run of the dataset
    (:func:`dmlstudy.models.trunk_cache.stem_activation_split`, keyed by the pixels' cache key)."""
    if found is None:
        raise ValueError(
            f"parameter 'stem_views' needs {config.dataset}'s splits as tensors (within "
            f"tensor_budget_gib = {config.tensor_budget_gib})"
        )
    tensors, layouts = found
    stem = stem_backbone(config)
    return {
        name: stem_activation_split(
            split,
            stem,
            folder=root / CACHE_FOLDER / "stem",
            dataset_digest=layouts[name].key,
            image_size=config.image_size,
            training_views=config.stem_views if name == "train" else 0,
            progress=config.progress,
        )
        for name, split in tensors.items()
    }


def _tensor_views(config: DataConfig) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """How the tensor pipeline wraps a split for training and for evaluation: batched augmentation and the
    centre-cropped test view of pixels, or, with ``stem_views``, the cached views of the stem's activations."""
    if config.stem_views:
        return CachedViewTrain, CachedViewEvaluation
    return (
        lambda split: BatchAugmentedTrain(split, seed=config.seed, image_size=config.image_size),
        lambda split: EvaluationImages(split, config.image_size),
    )


class SeededAugmentation(torch.utils.data.Dataset):
    """Training view (file pipeline) whose random augmentation of item ``i`` in epoch ``e`` is a pure function of
    ``(seed, e, i)``: results do not depend on batch order, DataLoader workers, or how a global batch is
    split across distributed ranks (so one process and N processes see identical images).

    An item may be asked for as ``(epoch, index)`` (what :class:`EpochTaggedBatches` yields), so persistent
    DataLoader workers, which keep their own copy of this object, still see the current epoch."""

    def __init__(self, dataset, *, seed: int) -> None:
        self.dataset, self.seed, self.epoch = dataset, seed, 0
        self.labels, self.num_classes = dataset.labels, dataset.num_classes

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        epoch, index = index if isinstance(index, tuple) else (self.epoch, index)
        with torch.random.fork_rng(devices=[]):
            # the CPU generator only: torch.manual_seed also seeds every accelerator backend, ≈ 0.7 ms per item
            torch.default_generator.manual_seed((self.seed * 1_000_003 + epoch * 7_919 + int(index) * 104_729) % 2**63)
            return self.dataset[index]


class EpochTaggedBatches(torch.utils.data.Sampler[list[tuple[int, int]]]):
    """A batch sampler's batches as ``[(epoch, index), …]`` (its ``epoch`` attribute at iteration time)."""

    def __init__(self, sampler: ClassBalancedBatchSampler) -> None:
        self.sampler = sampler

    def __iter__(self):
        for batch in self.sampler:
            yield [(self.sampler.epoch, index) for index in batch]

    def __len__(self) -> int:
        return len(self.sampler)


def place_on_device(datasets: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """Move tensor-pipeline splits onto ``device`` once (a small dataset then lives on the GPU); file splits stay."""
    for value in datasets.values():
        if isinstance(value, (BatchAugmentedTrain, EvaluationImages)):
            value.to(device)
    return dict(datasets)


def validation_sets(datasets: Mapping[str, Any]) -> dict[str, Any]:
    """The validation classes as an evaluation set: query = gallery, each query excluding itself; Recall@K
    only for K below the number of validation images."""
    validation = datasets["validation"]
    return {
        "query": validation,
        "gallery": None,
        "recall_ks": tuple(k for k in datasets["recall_ks"] if k < len(validation)) or (1,),
    }


def file_loader(
    train, sampler: ClassBalancedBatchSampler, config: DataConfig, device: torch.device
) -> DataLoader | None:
    """The file pipeline's DataLoader, made once per run: workers, pinned memory and persistent workers on CUDA."""
    if isinstance(train, BatchAugmentedTrain):
        return None
    batches = EpochTaggedBatches(sampler)
    workers = resolve_num_workers(config.num_workers)
    return DataLoader(
        train,
        batch_sampler=batches,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0 and device.type == "cuda",
    )


def training_batches(
    train, sampler: ClassBalancedBatchSampler, loader: DataLoader | None, device: torch.device, channels_last: bool
):
    """``(images, labels)`` of one epoch on ``device``: augmented batches of the resident tensor, or the loader's."""
    if loader is None:
        for indices in sampler:
            images, labels = train.batch(indices, device)
            yield in_memory_format(images, channels_last), labels
        return
    for images, labels in loader:
        yield (
            in_memory_format(images.to(device, non_blocking=True), channels_last),
            labels.to(device, non_blocking=True),
        )
