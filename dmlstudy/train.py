"""Training engine: ``run(TrainConfig) -> RunResult``.

One typed config (whose fields the ``parameters`` cell of ``notebooks/01_train.ipynb`` mirrors one to one),
class-balanced batches, any registered method, evaluation on the test classes every ``eval_every``
epochs, and a run folder ``runs/<study>/<run name>-<config hash>/`` with ``config.yaml``, ``history.csv``,
``metrics.json``, ``embeddings.npz``, ``environment.json`` and an atomically written ``checkpoint.pt``.
While a run trains, ``checkpoint.pt`` is the last epoch's (weights, optimizer state, history, the validation
choice so far); once ``metrics.json`` is written it is replaced by the finished run's record: the reported
weights (the state chosen on validation, else the last epoch's), history and config. The optimizer state,
needed only to resume, is dropped, so a finished run keeps a quarter of the bytes with AdamW.

Determinism: every epoch re-seeds all generators from ``(seed, epoch)``, so a run resumed from the
checkpoint of epoch e continues exactly as the uninterrupted run (on CPU).

Run folders, reuse of finished runs, the one-writer lock, checks before data loads and SIGTERM/SIGINT
handling are :mod:`dmlstudy.runs`; ``run`` calls into it at its start and its end.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from dmlstudy import distributed, runs
from dmlstudy import metrics as metric_functions
from dmlstudy.config import TypedConfig
from dmlstudy.data import (
    ClassBalancedBatchSampler,
    ImageListDataset,
    build_dataset,
    build_transforms,
    evaluation_protocol,
)
from dmlstudy.data.folds import fold_classes, split_by_classes
from dmlstudy.data.loading import evaluation_batches, in_memory_format, resolve_num_workers
from dmlstudy.data.tensor_cache import (
    CACHE_FOLDER,
    BatchAugmentedTrain,
    DifferentImageSizes,
    EvaluationImages,
    TensorImageSplit,
    cache_key,
    cached_images,
    split_bytes,
)
from dmlstudy.methods import EVAL_BATCH_SIZE, Method, build_method
from dmlstudy.models import build_backbone
from dmlstudy.models.trunk_cache import (
    CachedViewEvaluation,
    CachedViewTrain,
    StemActivationSplit,
    StemCachedBackbone,
    stem_activation_split,
)
from dmlstudy.paths import data_root, project_file, runs_root
from dmlstudy.records import (
    environment_info,
    save_torch,
    seed_everything,
    uninterruptible,
    write_csv,
    write_json,
    write_npz,
)


@dataclass
class TrainConfig(TypedConfig):
    """Everything one training run depends on. Field names match the notebook's ``parameters`` cell.

    The defaults are a CI-sized run, what ``dmlstudy train`` with no options does: MS on the first 16 SynBirds
    classes, 2 epochs of 6 batches, evaluated on the first 16 test classes (seconds on 2 CPU cores, after the
    one-time dataset generation). Plans and paper configs set the real sizes; a full run sets
    ``steps_per_epoch``, ``train_classes`` and ``test_classes`` to 0.
    """

    study: str = "scratch"  # runs are written to <runs_root>/<study>/<run folder>/ (see run_name)
    run_name: str = ""  # folder label, default <dataset>-<method>-seed<seed>; the config hash is appended
    runs_root: str = ""  # default: <project>/runs
    data_root: str = ""  # default: <project>/data; a dataset lives in <data_root>/<dataset>
    dataset: str = "synbirds"  # a registered dataset name (dmlstudy list datasets)
    method: str = "ms"  # a registered method name (dmlstudy list methods)
    method_kwargs: dict = field(default_factory=dict)  # keyword arguments of the method (e.g. {"K1": 16})
    backbone: str = "dml_convnet"  # any timm model name (dmlstudy list backbones)
    pretrained: bool = False  # timm's pretrained weights (Hugging Face cache; timm downloads them once when online)
    checkpoint_path: str = ""  # local backbone weights file, loaded after construction (relative: from the working directory, else the project root)
    freeze_bn: bool = False  # freeze BatchNorm statistics and affine parameters of the backbone
    conv_head: bool = True  # with stem_views: end with EfficientNet's 1 × 1 conv_head (False: the last block's output is the feature map)
    stem_views: int = 0  # n ≥ 1: an EfficientNet trained from its last stage on cached activations of its frozen stem, n training views
    output_stride: int = 0  # 0: the backbone's own; 8/16 for dilated ResNets (larger feature grid)
    embedding_dim: int = 128  # d, the inference embedding size
    image_size: int = 64  # training crop and test centre-crop size in pixels
    classes_per_batch: int = 16  # P of a P × M class-balanced batch
    samples_per_class: int = 4  # M of a P × M class-balanced batch
    epochs: int = 2  # training epochs
    steps_per_epoch: int = 6  # 0: len(train) // (P·M) batches per epoch
    train_classes: int = 16  # 0: all training classes; n: only the first n (CI-sized runs)
    test_classes: int = 16  # 0: all test classes; n: only the first n
    optimizer: str = "adamw"  # adam, adamw or sgd
    lr: float = 4e-3  # learning rate of the backbone and embedding
    head_lr: float = 1e-2  # learning rate of proxies / class centres
    backbone_lr_scale: float = 1.0  # the backbone trains at lr × this (< 1 when fine-tuning a pretrained backbone)
    warmup_epochs: int = 0  # the first n epochs train only what the method adds to the backbone (backbone frozen)
    weight_decay: float = 1e-4  # weight decay of the backbone and embedding
    lr_schedule: str = "cosine"  # constant or cosine (per epoch, to 1 % of lr)
    eval_every: int = 1  # evaluate every n epochs (and after the last): validation classes, else the test classes
    validation_folds: int = 0  # 0: none, test classes evaluated every eval_every epochs; n ≥ 2: the training classes in n class-disjoint folds
    validation_fold: int = 0  # the fold held out of training as validation classes (checkpoint choice, patience)
    patience: int = 0  # with validation folds: stop after this many evaluations without a better validation R@1 (0: train all epochs)
    final_test: bool = (
        True  # with validation folds: read the test classes once, with the best-validation state (False: never)
    )
    recall_ks: list = field(default_factory=list)  # Recall@K list; empty: the dataset's standard list
    eval_batch_size: int = EVAL_BATCH_SIZE  # images per forward pass when embedding validation and test sets
    num_workers: int = -1  # DataLoader worker processes of the file pipeline; -1: min(8, cores)
    seed: int = 0  # seeds model init, batches and augmentation
    device: str = "auto"  # auto (CUDA when present), cpu, cuda or cuda:<i>
    sync_bn: bool = False  # SyncBatchNorm across ranks under torchrun (GPU); or use freeze_bn
    resume: bool = False  # continue an interrupted run from its last epoch checkpoint
    overwrite: bool = False  # replace the run folder's records (a finished run is otherwise loaded, not retrained)
    progress: bool = True  # tqdm progress bars
    input_pipeline: str = (
        "auto"  # auto (tensor when it fits), tensor (cached uint8 tensor, batched augmentation) or files (per-item PIL)
    )
    tensor_budget_gib: float = 2.0  # auto: the tensor pipeline only when all splits of the run fit in this many GiB
    channels_last: bool = (
        False  # channels_last memory format (faster on CPU, but not bit-identical across resume and ranks)
    )
    autocast: str = "auto"  # auto (bfloat16 on CUDA, off on CPU), bf16 or off
    compile: bool = False  # torch.compile the training step (see benchmarks/README.md for when it pays)

    def validate(self) -> None:
        """Check every field's type and range; the message names the offending parameter."""
        self.check_types()
        positive = (
            "embedding_dim",
            "image_size",
            "classes_per_batch",
            "samples_per_class",
            "epochs",
            "eval_every",
            "eval_batch_size",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"parameter {name!r} must be positive, got {getattr(self, name)}")
        if self.samples_per_class < 2:
            raise ValueError("parameter 'samples_per_class' must be ≥ 2: pair losses need a positive per anchor")
        self.check_choice("optimizer", sorted(OPTIMIZERS))
        self.check_choice("lr_schedule", sorted(SCHEDULES))
        if not is_device_name(self.device):
            raise ValueError(f"parameter 'device' must be auto, cpu or cuda[:i], got {self.device!r}")
        self.validate_speed_fields()
        self._validate_names()

    def _validate_names(self) -> None:
        """Folder labels and K values: bad values fail at construction, naming the parameter."""
        for name in ("study", "run_name"):
            value = getattr(self, name)
            if "/" in value or "\\" in value or value in (".", "..") or (name == "study" and not value):
                raise ValueError(
                    f"parameter {name!r} must be a folder name (no '/', not empty, '.' or '..'), got {value!r}"
                )
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.recall_ks):
            raise ValueError(f"parameter 'recall_ks' must be a list of positive integers, got {self.recall_ks!r}")
        if self.steps_per_epoch < 0 or self.train_classes < 0 or self.test_classes < 0:
            raise ValueError("parameters 'steps_per_epoch', 'train_classes' and 'test_classes' must be ≥ 0")
        if self.validation_folds == 1 or self.validation_folds < 0:
            raise ValueError(f"parameter 'validation_folds' must be 0 (none) or ≥ 2, got {self.validation_folds}")
        if self.validation_folds and not 0 <= self.validation_fold < self.validation_folds:
            raise ValueError(
                f"parameter 'validation_fold' must be in 0 … {self.validation_folds - 1}, got {self.validation_fold}"
            )
        if self.patience < 0 or (self.patience and not self.validation_folds):
            raise ValueError(
                f"parameter 'patience' ({self.patience}) needs validation classes (validation_folds ≥ 2) and must be ≥ 0: "
                "early stopping on the test classes would choose the epoch on the test set"
            )
        if not self.conv_head and not self.stem_views:
            raise ValueError("parameter 'conv_head' = False needs stem_views ≥ 1 (the split EfficientNet backbone)")
        if self.stem_views < 0 or (self.stem_views and self.input_pipeline == "files"):
            raise ValueError(
                f"parameter 'stem_views' must be ≥ 0 and needs the tensor pipeline (input_pipeline auto or tensor), "
                f"got {self.stem_views} with input_pipeline {self.input_pipeline!r}"
            )
        if not (self.backbone_lr_scale > 0 and np.isfinite(self.backbone_lr_scale)):
            raise ValueError(f"parameter 'backbone_lr_scale' must be finite and > 0, got {self.backbone_lr_scale}")
        if not 0 <= self.warmup_epochs < self.epochs:
            raise ValueError(
                f"parameter 'warmup_epochs' must be in [0, epochs) = [0, {self.epochs}), got {self.warmup_epochs}"
            )
        if not (self.lr > 0 and self.head_lr > 0 and self.weight_decay >= 0) or not all(
            map(np.isfinite, (self.lr, self.head_lr, self.weight_decay))
        ):
            raise ValueError(
                f"parameters 'lr' and 'head_lr' must be finite and > 0, 'weight_decay' ≥ 0; got {self.lr}, {self.head_lr}, {self.weight_decay}"
            )

    def validate_speed_fields(self) -> None:
        """Ranges of the input-pipeline and compute fields."""
        self.check_choice("input_pipeline", INPUT_PIPELINES)
        self.check_choice("autocast", AUTOCAST_MODES)
        if self.num_workers < -1:
            raise ValueError(f"parameter 'num_workers' must be -1 (automatic) or >= 0, got {self.num_workers}")
        if not self.tensor_budget_gib >= 0:
            raise ValueError(f"parameter 'tensor_budget_gib' must be >= 0, got {self.tensor_budget_gib}")

    def __post_init__(self) -> None:
        self.validate()

    @property
    def validates(self) -> bool:
        """Whether epochs are evaluated on validation classes (and the test classes read once, at the end)."""
        return self.validation_folds >= 2

    def selection_text(self, *, best_epoch: int, epochs_trained: int) -> str:
        """How the reported checkpoint was chosen, for tables (:func:`selection_rule` drops the epochs)."""
        if not self.validates:
            return f"last epoch ({epochs_trained}); no validation classes"
        return (
            f"best validation R@1 (fold {self.validation_fold} of {self.validation_folds} class-disjoint folds of the "
            f"training classes): epoch {best_epoch} of {epochs_trained} trained"
            + (f", patience {self.patience} evaluations" if self.patience else "")
        )

    @property
    def resolved_run_name(self) -> str:
        """The run folder's name: ``<run_name or dataset-method-seed<seed>>-<config hash>`` (:func:`dmlstudy.runs.folder_name`)."""
        return runs.folder_name(self.to_dict())

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_root or runs_root()) / self.study / self.resolved_run_name


_SELECTION_EPOCHS = re.compile(r":? epoch \d+ of \d+ trained| \(\d+\)(?=; no validation)")


def selection_rule(selection: str) -> str:
    """A run's :meth:`TrainConfig.selection_text` without its epoch numbers: the rule, the same for every run
    that followed it."""
    return _SELECTION_EPOCHS.sub("", selection)


INPUT_PIPELINES = ("auto", "tensor", "files")
AUTOCAST_MODES = ("auto", "bf16", "off")
# Not fused=True: torch's fused CPU AdamW took a CRT step's optimizer part from 54 to 13 ms, but its results
# depended on what the process had run before (after the engine tests, a run resumed in the pytest process
# drifted 2e-3 from the uninterrupted one; the multi-tensor default stays identical), which breaks the
# same-seed-same-records contract (benchmarks/README.md, "Fused AdamW (tried, not adopted)").
OPTIMIZERS = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": lambda groups, **kw: torch.optim.SGD(groups, momentum=0.9, **kw),
}
SCHEDULES = {
    "constant": lambda epoch, epochs: 1.0,
    "cosine": lambda epoch, epochs: 0.01 + 0.99 * 0.5 * (1 + np.cos(np.pi * epoch / epochs)),
}


def group_learning_rates(
    config: TrainConfig, base_lrs: Sequence[float], names: Sequence[str], epoch: int
) -> list[float]:
    """Each optimizer group's learning rate in ``epoch`` (0-based): its base rate × the schedule, and 0 for the
    ``backbone`` group during the first ``warmup_epochs`` (only the layers the method adds train)."""
    scale = SCHEDULES[config.lr_schedule](epoch, config.epochs)
    warming_up = epoch < config.warmup_epochs
    return [0.0 if warming_up and name == "backbone" else lr * scale for lr, name in zip(base_lrs, names)]


@dataclass
class RunResult:
    """What a run leaves: its folder, final metrics, per-epoch history and the trained method."""

    config: TrainConfig
    run_dir: Path
    metrics: dict[str, float]
    history: pd.DataFrame
    method: Method
    embeddings: dict[str, np.ndarray]

    @property
    def records(self) -> dict[str, Path]:
        names = ("config.yaml", "history.csv", "metrics.json", "embeddings.npz", "environment.json", "checkpoint.pt")
        return {name: self.run_dir / name for name in names}


def is_device_name(name: str) -> bool:
    """Whether :func:`resolve_device` understands ``name``: auto, cpu, cuda or cuda:<i>."""
    return name in ("auto", "cpu", "cuda") or name.startswith("cuda:")


def resolve_device(name: str) -> torch.device:
    """``auto``: the device the engine assigned to this worker process (``DMLSTUDY_DEVICE``, e.g. ``cuda:1``
    on a multi-GPU machine, see :mod:`dmlstudy.engine`), else CUDA when present, else the CPU."""
    if name == "auto":
        name = os.environ.get("DMLSTUDY_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available on this machine")
    return torch.device(name)


def _first_classes(dataset, count: int, parameter: str):
    """The images of the first ``count`` classes (all when ``count`` is 0); labels stay 0 … count−1.
    A ``count`` above the split's classes warns, naming ``parameter``, and keeps them all."""
    if count > dataset.num_classes:
        runs.warn(
            f"parameter {parameter!r}={count} is more than the {dataset.num_classes} classes of {dataset.name}; "
            "all of them are used"
        )
    if _first_class_count(dataset.num_classes, count) == dataset.num_classes:
        return dataset
    return split_by_classes(dataset, np.arange(count), role=f"first {count} classes")


def _first_class_count(available: int, count: int) -> int:
    """How many of ``available`` classes "the first ``count``" keeps: all when ``count`` is 0 or more than there are."""
    return count if 0 < count < available else available


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


EVALUATION_MEMO_BYTES = 1 << 30  # evaluation splits whose transformed images fit in this are kept in memory
_logger = logging.getLogger(__name__)


def _tensor_splits(
    config: TrainConfig, root: Path, splits: Mapping[str, ImageListDataset | None]
) -> dict[str, TensorImageSplit] | None:
    """The splits as cached uint8 tensors, or None for the file pipeline (``files``, over budget, mixed sizes).

    ``auto`` decides for all the splits of the run together: tensors only when their total size fits
    ``tensor_budget_gib`` and every split's images share one size; otherwise the reason is logged.
    ``tensor`` raises instead of falling back.
    """
    if config.input_pipeline == "files":
        return None
    present = {name: split for name, split in splits.items() if split is not None}
    total = sum(split_bytes(split) for split in present.values())
    budget = int(config.tensor_budget_gib * 2**30)
    try:
        if total > budget:
            raise MemoryError(
                f"{config.dataset}: its splits need {total / 2**30:.2f} GiB as uint8 tensors, over tensor_budget_gib = {config.tensor_budget_gib}"
            )
        return {
            name: TensorImageSplit(split, torch.from_numpy(cached_images(split, root)))
            for name, split in present.items()
        }
    except (MemoryError, DifferentImageSizes) as reason:
        if config.input_pipeline == "tensor":
            raise ValueError(f"input_pipeline='tensor' is not possible: {reason}") from reason
        _logger.info(
            "%s; reading image files instead (input_pipeline='files', %d DataLoader workers)",
            reason,
            resolve_num_workers(config.num_workers),
        )
        return None


def load_datasets(config: TrainConfig) -> dict[str, Any]:
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
    tensors = _tensor_splits(config, root, {"train": train, "query": query, "gallery": gallery})
    recall_ks = tuple(config.recall_ks) or protocol.recall_ks
    if config.stem_views:
        tensors = _stem_activations(config, root, tensors, {"train": train, "query": query, "gallery": gallery})
    if tensors is not None:
        training_view, test_view = _tensor_views(config)
        training, validation = _validation_split(
            config, _first_classes(tensors["train"], config.train_classes, "train_classes")
        )
        evaluation = {
            name: test_view(_first_classes(tensors[name], config.test_classes, "test_classes"))
            if name in tensors
            else None
            for name in ("query", "gallery")
        }
        return {
            "train": training_view(training),
            **evaluation,
            "validation": test_view(validation) if validation is not None else None,
            "recall_ks": recall_ks,
        }
    train.transform = build_transforms(config.image_size, train=True, hflip=train.flip_invariant)
    training, validation = _validation_split(config, _first_classes(train, config.train_classes, "train_classes"))
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


def _backbone_options(config: TrainConfig) -> dict[str, Any]:
    """The keyword arguments every backbone of ``config`` is built with."""
    return {
        "pretrained": config.pretrained,
        "checkpoint_path": project_file(config.checkpoint_path) if config.checkpoint_path else None,
        "freeze_bn": config.freeze_bn,
        "image_size": config.image_size,
    }


def _stem_backbone(config: TrainConfig) -> StemCachedBackbone:
    return StemCachedBackbone(config.backbone, conv_head=config.conv_head, **_backbone_options(config))


def _stem_activations(
    config: TrainConfig,
    root: Path,
    tensors: Mapping[str, TensorImageSplit] | None,
    sources: Mapping[str, ImageListDataset | None],
) -> dict[str, StemActivationSplit]:
    """The tensor splits as the stem's cached activations (``stem_views`` training views of ``train``, the test
    view of every split); computed once per image and view and shared by every run of the dataset
    (:func:`dmlstudy.models.trunk_cache.stem_activation_split`)."""
    if tensors is None:
        raise ValueError(
            f"parameter 'stem_views' needs {config.dataset}'s splits as tensors (one image size, within "
            f"tensor_budget_gib = {config.tensor_budget_gib})"
        )
    stem = _stem_backbone(config)
    return {
        name: stem_activation_split(
            split,
            stem,
            folder=root / CACHE_FOLDER / "stem",
            dataset_digest=cache_key(sources[name], root),
            image_size=config.image_size,
            training_views=config.stem_views if name == "train" else 0,
        )
        for name, split in tensors.items()
    }


def _tensor_views(config: TrainConfig) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """How the tensor pipeline wraps a split for training and for evaluation: batched augmentation and the
    centre-cropped test view of pixels, or, with ``stem_views``, the cached views of the stem's activations."""
    if config.stem_views:
        return CachedViewTrain, CachedViewEvaluation
    return (
        lambda split: BatchAugmentedTrain(split, seed=config.seed, image_size=config.image_size),
        lambda split: EvaluationImages(split, config.image_size),
    )


def class_split_counts(config: TrainConfig) -> tuple[int, int]:
    """``(training classes, validation classes)`` of a run, as :func:`load_datasets` splits them: the first
    ``train_classes`` training classes (all when 0 or more than there are), less and in fold ``validation_fold``
    (0 validation classes without folds); read from the split's class list alone (no image, no cached tensor)."""
    root = Path(config.data_root or data_root()) / config.dataset
    classes = _first_class_count(build_dataset(config.dataset, root, "train").num_classes, config.train_classes)
    if not config.validates:
        return classes, 0
    kept, held_out = fold_classes(classes, config.validation_folds, config.validation_fold)
    return len(kept), len(held_out)


def training_class_count(config: TrainConfig) -> int:
    """The number of classes a run trains on, what its class heads are sized by (:func:`class_split_counts`)."""
    return class_split_counts(config)[0]


def _validation_split(config: TrainConfig, train):
    """``(training part, validation part)`` of the training split: the classes outside and inside fold
    ``validation_fold`` (:func:`dmlstudy.data.folds.fold_classes`), or ``(train, None)`` without folds."""
    if not config.validates:
        return train, None
    kept, held_out = fold_classes(train.num_classes, config.validation_folds, config.validation_fold)
    return (
        split_by_classes(train, kept, role="training classes"),
        split_by_classes(train, held_out, role=f"validation classes, fold {config.validation_fold}"),
    )


def place_on_device(datasets: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """Move tensor-pipeline splits onto ``device`` once (a small dataset then lives on the GPU); file splits stay."""
    for value in datasets.values():
        if isinstance(value, (BatchAugmentedTrain, EvaluationImages)):
            value.to(device)
    return dict(datasets)


def autocast_dtype(config: TrainConfig, device: torch.device) -> torch.dtype | None:
    """bfloat16 when ``autocast`` is bf16, or auto on CUDA (on CPUs without bf16 units it is ~11× slower); else None."""
    if config.autocast == "bf16" or (config.autocast == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    """Autocast to ``dtype`` on ``device``'s type (:func:`autocast_dtype`), or float32 when ``dtype`` is None: the
    one precision context of training steps and of every test embedding (a run's, and DIML's grid embeddings)."""
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


@torch.no_grad()
def embed(
    method: Method,
    dataset,
    *,
    batch_size: int = EVAL_BATCH_SIZE,
    device: torch.device | str = "cpu",
    num_workers: int = 0,
    autocast: torch.dtype | None = None,
    channels_last: bool = False,
    progress: bool = False,
) -> np.ndarray:
    """Inference embeddings (``N × d``, float32) of a dataset, in dataset order.

    Tensor-pipeline splits are read as slices of their cropped tensor (large batches, no per-item work).
    Under torchrun each rank embeds one contiguous shard and the shards are gathered once. ``progress``: a
    tqdm bar over the batches (a large gallery takes minutes to embed).
    """
    device = torch.device(device)
    was_training = method.training
    method.eval()
    shard = np.array_split(np.arange(len(dataset)), distributed.world_size())[distributed.rank()]
    size = int(np.ceil(len(dataset) / distributed.world_size()))
    chunks = []
    with autocast_context(device, autocast):
        for images in tqdm(
            evaluation_batches(
                dataset,
                shard,
                batch_size=batch_size,
                device=device,
                num_workers=num_workers,
                channels_last=channels_last,
            ),
            desc=f"embedding {len(shard)} images",
            total=-(-len(shard) // batch_size),
            unit="batch",
            leave=False,
            disable=not progress,
        ):
            chunks.append(method(images).float())
    local = torch.cat(chunks) if chunks else torch.zeros(0, method.embedding_dim, device=device)
    method.train(was_training)
    if distributed.world_size() == 1:
        return local.cpu().numpy()
    padded = torch.cat([local, local.new_zeros(size - len(local), local.shape[1])])
    gathered = distributed.gather_without_grad(padded).reshape(distributed.world_size(), size, -1)
    return (
        torch.cat(
            [
                part[: len(rows)]
                for part, rows in zip(gathered, np.array_split(np.arange(len(dataset)), distributed.world_size()))
            ]
        )
        .cpu()
        .numpy()
    )


def evaluate(
    method: Method,
    datasets: Mapping[str, Any],
    *,
    batch_size: int,
    device: torch.device,
    num_workers: int = 0,
    autocast: torch.dtype | None = None,
    channels_last: bool = False,
    progress: bool = False,
    full: bool = True,
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Metrics of the spine on the evaluation splits, and the embeddings they were computed from
    (``progress``: a bar over each split's embedding batches). ``full=False`` (the per-epoch validation
    evaluations) computes the retrieval metrics only: no k-means NMI, no geometry."""
    options = {
        "batch_size": batch_size,
        "device": device,
        "num_workers": num_workers,
        "autocast": autocast,
        "channels_last": channels_last,
        "progress": progress,
    }
    query = embed(method, datasets["query"], **options)
    arrays = {"embeddings": query, "labels": np.asarray(datasets["query"].labels)}
    gallery_kwargs = {}
    if datasets.get("gallery") is not None:
        gallery = embed(method, datasets["gallery"], **options)
        arrays.update(gallery_embeddings=gallery, gallery_labels=np.asarray(datasets["gallery"].labels))
        gallery_kwargs = {"gallery": gallery, "gallery_labels": arrays["gallery_labels"]}
    values = metric_functions.evaluate(
        query, arrays["labels"], ks=datasets["recall_ks"], with_nmi=full, with_geometry=full, **gallery_kwargs
    )
    return {key: float(value) for key, value in values.items()}, arrays


def evaluation_column(history: pd.DataFrame, metric: str = "R@1") -> tuple[str, str]:
    """``(column, classes)``: the history column holding ``metric`` at each evaluated epoch and which classes it
    was measured on — ``val_<metric>`` on the validation classes for a run with validation folds, else
    ``metric`` on the test classes."""
    return (f"val_{metric}", "validation") if f"val_{metric}" in history else (metric, "test")


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch * 7_919) % 2**31


def build_model(config: TrainConfig, num_classes: int) -> Method:
    """The method of ``config`` around its backbone (seeded by ``config.seed``)."""
    seed_everything(config.seed)
    if config.stem_views:
        backbone = _stem_backbone(config)
    else:
        backbone = build_backbone(
            config.backbone, output_stride=config.output_stride or None, **_backbone_options(config)
        )
    return build_method(
        config.method,
        backbone=backbone,
        embedding_dim=config.embedding_dim,
        num_classes=num_classes,
        **config.method_kwargs,
    )


def load_reported_state(method: Method, run_dir: Path, device: torch.device) -> Method:
    """Load into ``method`` the weights a finished run reports: its ``checkpoint.pt``'s ``method`` state, or,
    in a last-epoch checkpoint that also carries a validation choice (a run finished before finished runs
    were slimmed, or one whose records were cut short), the chosen state."""
    checkpoint = _read_checkpoint(Path(run_dir) / "checkpoint.pt", device)
    chosen = checkpoint.get("selection", {}).get("state")
    method.load_state_dict(chosen if chosen is not None else checkpoint["method"])
    return method


def _load_complete(config: TrainConfig, device: torch.device) -> RunResult:
    """A finished run's records and reported weights; its images are not read (:func:`training_class_count`)."""
    run_dir = config.run_dir
    method = load_reported_state(build_model(config, training_class_count(config)).to(device), run_dir, device)
    with np.load(run_dir / "embeddings.npz") as stored:
        embeddings = dict(stored)
    return RunResult(
        config,
        run_dir,
        json.loads((run_dir / "metrics.json").read_text()),
        pd.read_csv(run_dir / "history.csv"),
        method,
        embeddings,
    )


NON_IDENTITY_FIELDS = runs.NON_IDENTITY_FIELDS  # fields that do not change what a run computes (not hashed)


def is_complete(config: TrainConfig) -> bool:
    """Whether ``config``'s run folder holds a finished run (configuration, final metrics and checkpoint)."""
    return runs.is_complete(config.run_dir)


def _read_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    """A run checkpoint; one that cannot be read names the file and the way out."""
    try:
        return torch.load(path, map_location=device, weights_only=False)
    except Exception as error:  # torch raises RuntimeError, pickle.UnpicklingError, EOFError, … for a damaged file
        raise RuntimeError(
            f"cannot read the checkpoint {path} ({type(error).__name__}: {error}); "
            "pass --overwrite (overwrite=True) to train this run again from epoch 1"
        ) from None


class TrainingWatch:
    """Numbers that cannot be right, caught where they appear.

    * A non-finite loss or input batch stops the run at the batch that produced it; the message names the
      non-finite images (training-set index and file), or the whole batch when every image is finite. The
      inputs are checked on the file pipeline only: the tensor pipeline augments cached ``uint8`` pixels,
      which cannot be non-finite.
    * A first epoch whose loss has not moved warns: the mean of its last quarter of steps within
      ``FLAT_TOLERANCE`` (relative) of its first quarter, when there are at least 4 steps. An absurd learning
      rate (``lr=1000``) is also flagged before training by :func:`dmlstudy.runs.check_before_loading`.
    """

    FLAT_TOLERANCE = 1e-3

    def __init__(self, config: TrainConfig, train, sampler) -> None:
        self.config, self.train, self.sampler = config, train, sampler
        self.first_epoch_losses: list[torch.Tensor] = []  # detached: no device sync per step
        self.first_epoch: int | None = None
        self.check_inputs = not isinstance(train, BatchAugmentedTrain)

    def _batch_indices(self, step: int) -> list[int]:
        for number, batch in enumerate(self.sampler):  # the sampler is a pure function of (seed, epoch)
            if number == step:
                return list(batch)
        return []

    def observe(self, loss: torch.Tensor, images: torch.Tensor, *, epoch: int, step: int) -> None:
        # the inputs are checked too: a loss with mining can stay finite on NaN images while its gradient is not
        finite = torch.isfinite(loss)
        if self.check_inputs:
            finite = finite & torch.isfinite(images).all()
        if not bool(finite):
            indices = self._batch_indices(step)
            bad_rows = (~torch.isfinite(images.reshape(len(images), -1)).all(dim=1)).nonzero().flatten().tolist()
            if bad_rows and indices:
                culprit = f"non-finite values in the input images {runs.describe_items(self.train, [indices[r] for r in bad_rows][:8])}"
            else:
                culprit = f"the inputs are finite; the batch was {runs.describe_items(self.train, indices[:8])}{' …' if len(indices) > 8 else ''}"
            what = (
                f"the loss became {loss.item()}"
                if not torch.isfinite(loss)
                else "a training batch holds non-finite values"
            )
            raise FloatingPointError(
                f"run {self.config.resolved_run_name}: {what} at epoch {epoch + 1}, step {step + 1}: {culprit}"
            )
        if self.first_epoch is None:
            self.first_epoch = epoch  # the first epoch this process trains (a resumed run: the one it resumes at)
        if epoch == self.first_epoch:
            self.first_epoch_losses.append(loss.detach())

    def end_epoch(self, epoch: int) -> None:
        if epoch != self.first_epoch or len(self.first_epoch_losses) < 4:
            return
        losses = torch.stack(self.first_epoch_losses).float().cpu().tolist()
        quarter = len(losses) // 4
        first, last = float(np.mean(losses[:quarter])), float(np.mean(losses[-quarter:]))
        if abs(last - first) <= self.FLAT_TOLERANCE * max(abs(first), 1e-12):
            runs.warn(
                f"run {self.config.resolved_run_name}: the loss did not move over epoch {epoch + 1} "
                f"({first:.6g} → {last:.6g} over {len(losses)} steps); check lr={self.config.lr:g} and the data"
            )


class CheckpointSelection:
    """The checkpoint a run reports, chosen on validation classes (Musgrave et al. 2020, §4.2).

    Every evaluation on the validation classes is offered to :meth:`observe`; the state with the highest
    validation R@1 is kept (a tie keeps the earlier epoch), with its epoch, the training seconds up to the end
    of that epoch, and its validation embeddings. After ``patience`` evaluations without a higher value the
    run stops (``stopped``); ``patience = 0`` never stops early. The state travels in the epoch checkpoint,
    so a resumed run chooses exactly as the uninterrupted one.

    The evaluations of the first ``warmup_epochs`` epochs are recorded in the history but are neither candidates
    nor steps of patience: the backbone is frozen then, so they score the starting backbone under a half-trained
    head, not the method being fine-tuned, and the dip that unfreezing brings must not end the run. Declared on
    2026-11-26 (``docs/protocol.md``) after one pretrained run had stopped at epoch 3 on its warm-up's validation
    R@1 and reported the warm-up state; until then warm-up evaluations counted like any other.
    """

    def __init__(self, patience: int, warmup_epochs: int = 0) -> None:
        self.patience, self.warmup_epochs = patience, warmup_epochs
        self.value, self.epoch, self.seconds, self.since = float("-inf"), 0, 0.0, 0
        self.state: dict[str, torch.Tensor] | None = None
        self.arrays: dict[str, np.ndarray] = {}
        self.stopped = False

    def observe(
        self, value: float, *, epoch: int, method: Method, trained_seconds: float, arrays: dict[str, np.ndarray]
    ) -> None:
        if epoch <= self.warmup_epochs:
            return
        if value > self.value:
            self.value, self.epoch, self.seconds, self.since = value, epoch, trained_seconds, 0
            self.state = {name: tensor.detach().clone() for name, tensor in method.state_dict().items()}
            self.arrays = arrays
        else:
            self.since += 1
        self.stopped = bool(self.patience) and self.since >= self.patience

    def to_checkpoint(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "epoch": self.epoch,
            "seconds": self.seconds,
            "since": self.since,
            "state": self.state,
            "stopped": self.stopped,
        }

    def load(self, saved: Mapping[str, Any], *, epochs_done: int) -> bool:
        """Restore the choice saved after ``epochs_done`` epochs. A choice of a warm-up epoch was made by the
        rule before 2026-11-26: while the run is still warming up the rule keeps no choice yet, so it is
        dropped; after the warm-up it cannot be remade without the states it passed over, so ``False`` says
        the run must start again."""
        if 0 < saved["epoch"] <= self.warmup_epochs:
            return epochs_done <= self.warmup_epochs
        self.value, self.epoch, self.seconds, self.since = (
            saved["value"],
            saved["epoch"],
            saved["seconds"],
            saved["since"],
        )
        self.state, self.stopped = saved["state"], saved["stopped"]
        return True


def selection_evaluations(history: pd.DataFrame, warmup_epochs: int = 0, metric: str = "R@1") -> pd.Series:
    """``metric`` at each evaluation a run's reported checkpoint is chosen among, indexed by epoch: the column
    of :func:`evaluation_column` after the first ``warmup_epochs`` epochs (:class:`CheckpointSelection`)."""
    column, _ = evaluation_column(history, metric)
    if column not in history or "epoch" not in history:
        return pd.Series(dtype=float)
    return history.loc[history["epoch"] > warmup_epochs].set_index("epoch")[column].dropna()


def best_epoch_censored(history: pd.DataFrame, patience: int, warmup_epochs: int = 0) -> bool:
    """Whether a run's epochs-to-best (``best_epoch``, ``seconds_to_best``) is right-censored by its epoch cap.

    The run ended with fewer than ``max(patience, 1)`` evaluations after its best one, so
    :class:`CheckpointSelection` never stopped it (with ``patience = 0``: its best was its last evaluation),
    and a longer cap could only have moved its best later: its true epochs-to-best is at least the recorded
    one. Replays the selection on the evaluations it chooses among (:func:`selection_evaluations`: validation
    classes after the warm-up, or the test classes of a run without them, which never stops early, so
    ``patience`` counts as 0); the first maximum is the best, as a tie keeps the earlier epoch. A run with no
    evaluation is not censored.
    """
    _, classes = evaluation_column(history)
    values = selection_evaluations(history, warmup_epochs).to_numpy()
    if not len(values):
        return False
    after_best = len(values) - 1 - int(np.argmax(values))
    return after_best < max(patience if classes == "validation" else 0, 1)


class _LossStep(nn.Module):
    """``forward(images, labels) = method.loss(images, labels)``, so DistributedDataParallel (which hooks a
    module's forward) can wrap a method's training loss."""

    def __init__(self, method: Method) -> None:
        super().__init__()
        self.method = method

    def forward(self, images: torch.Tensor, labels: torch.Tensor):
        return self.method.loss(images, labels)


def prepare_compute(config: TrainConfig, method: Method, step: nn.Module, device: torch.device) -> nn.Module:
    """The compute fast path: channels_last weights, cuDNN autotuning on CUDA, and ``torch.compile`` of the
    training step when ``config.compile`` (measured in ``benchmarks/README.md``: on this project's CPUs its
    compile time exceeds what it saves in a study-sized run). Returns the step to call."""
    if config.channels_last:
        method.to(memory_format=torch.channels_last)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    return torch.compile(step) if config.compile else step


def _file_loader(
    train, sampler: ClassBalancedBatchSampler, config: TrainConfig, device: torch.device
) -> DataLoader | None:
    """The file pipeline's DataLoader, made once per run: workers, pinned memory and persistent workers on CUDA."""
    if isinstance(train, BatchAugmentedTrain):
        return None
    workers = resolve_num_workers(config.num_workers)
    return DataLoader(
        train,
        batch_sampler=EpochTaggedBatches(sampler),
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0 and device.type == "cuda",
    )


def _training_batches(
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


def _add_parts(totals: dict[str, Any], loss: torch.Tensor, parts: Mapping[str, Any]) -> None:
    """Sum the step's loss and named parts without a host sync (tensors stay tensors until the epoch ends)."""
    for name, value in {"loss": loss.detach(), **parts}.items():
        totals[name] = totals.get(name, 0.0) + (value.detach() if isinstance(value, torch.Tensor) else value)


def run(config: TrainConfig) -> RunResult:
    """Train ``config.method`` on ``config.dataset`` and evaluate it; see the module docstring for the records.

    Under ``torchrun`` (several processes) the model is wrapped in DistributedDataParallel, each rank takes
    its share of every global P × M batch, methods gather embeddings across ranks before their pair losses,
    and only rank 0 writes records and checkpoints.
    """
    config.validate()
    runs.check_before_loading(config)
    device = distributed.setup(config.device) if distributed.launched_by_torchrun() else resolve_device(config.device)
    with runs.RunGuard(config, writer=distributed.is_main_process()) as guard:
        if guard.reusable:
            result = _load_complete(config, device)
        else:
            datasets = load_datasets(config)
            runs.check_loaded_data(config, datasets)
            guard.write_start_records({**environment_info(str(device)), "world_size": distributed.world_size()})
            training = _set_up_training(config, datasets, device, resume_from=guard.resume_from)
            _train_epochs(training)
            result = _finish(training)
    if distributed.is_main_process():
        runs.note_used(config.run_dir)
    return result


@dataclass
class _Training:
    """One run between its set-up and its records: what every epoch uses, and what the epochs so far left
    (the history, the last evaluation, the validation choice)."""

    config: TrainConfig
    run_dir: Path
    device: torch.device
    datasets: dict[str, Any]  # placed on the device (:func:`place_on_device`)
    method: Method
    step: nn.Module  # the training loss of ``method``, wrapped for DistributedDataParallel and torch.compile
    precision: torch.dtype | None  # autocast dtype of the training steps and evaluations (:func:`autocast_dtype`)
    optimizer: torch.optim.Optimizer
    base_lrs: list[float]  # per optimizer group, before the schedule
    group_names: list[str]  # per optimizer group: model, backbone, head (:meth:`Method.parameter_groups`)
    sampler: ClassBalancedBatchSampler
    loader: DataLoader | None  # the file pipeline's; None for the tensor pipeline
    watch: TrainingWatch
    selection: CheckpointSelection
    validation: dict[str, Any] | None  # the validation classes as an evaluation set; None: no validation folds
    evaluation_options: dict[str, Any]  # keyword arguments of :func:`evaluate`
    history: list[dict[str, float]] = field(default_factory=list)  # one row per epoch trained
    start_epoch: int = 0  # the first epoch to train (0-based): after the resumed checkpoint's
    latest: dict[str, float] = field(default_factory=dict)  # the metrics of the last evaluation
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # the embeddings of the last test evaluation

    @property
    def train(self):
        return self.datasets["train"]

    @property
    def shows_progress(self) -> bool:
        return self.config.progress and distributed.is_main_process()


def _set_up_training(
    config: TrainConfig, datasets: Mapping[str, Any], device: torch.device, *, resume_from: Path | None
) -> _Training:
    """Datasets on ``device``, the model (seeded by ``config.seed``), its training step, optimizer and
    class-balanced sampler; then the state of the checkpoint ``resume_from`` when the run continues one."""
    datasets = place_on_device(datasets, device)
    train = datasets["train"]
    method = build_model(config, train.num_classes).to(device)
    step = _training_step(config, method, device)
    precision = autocast_dtype(config, device)
    evaluation_options = {
        "batch_size": config.eval_batch_size,
        "device": device,
        "num_workers": config.num_workers,
        "autocast": precision,
        "channels_last": config.channels_last,
        "progress": config.progress and distributed.is_main_process(),
    }
    optimizer, group_names = _optimizer(config, method)
    sampler = ClassBalancedBatchSampler(
        train.labels,
        classes_per_batch=config.classes_per_batch,
        samples_per_class=config.samples_per_class,
        num_batches=config.steps_per_epoch or None,
        seed=config.seed,
        rank=distributed.rank(),
        world_size=distributed.world_size(),
    )
    training = _Training(
        config=config,
        run_dir=config.run_dir,
        device=device,
        datasets=datasets,
        method=method,
        step=step,
        precision=precision,
        optimizer=optimizer,
        base_lrs=[group["lr"] for group in optimizer.param_groups],
        group_names=group_names,
        sampler=sampler,
        loader=_file_loader(train, sampler, config, device),
        watch=TrainingWatch(config, train, sampler),
        selection=CheckpointSelection(config.patience, config.warmup_epochs),
        validation=_validation_sets(datasets) if config.validates else None,
        evaluation_options=evaluation_options,
    )
    if resume_from is not None:
        _resume(training, resume_from)
    return training


def _training_step(config: TrainConfig, method: Method, device: torch.device) -> nn.Module:
    """``method.loss`` as a module: wrapped in DistributedDataParallel under torchrun (SyncBatchNorm with
    ``sync_bn``), then prepared for the compute fast path (:func:`prepare_compute`)."""
    step = _LossStep(method)
    if distributed.world_size() > 1:
        if config.sync_bn:
            step = nn.SyncBatchNorm.convert_sync_batchnorm(step)
        step = nn.parallel.DistributedDataParallel(step, find_unused_parameters=True)
    return prepare_compute(config, method, step, device)


def _optimizer(config: TrainConfig, method: Method) -> tuple[torch.optim.Optimizer, list[str]]:
    """The optimizer over the method's parameter groups, and the groups' names. The backbone has a group of
    its own only when it trains at another rate (``backbone_lr_scale``) or waits for the warm-up."""
    groups = method.parameter_groups(
        lr=config.lr,
        head_lr=config.head_lr,
        weight_decay=config.weight_decay,
        backbone_lr=config.lr * config.backbone_lr_scale
        if config.backbone_lr_scale != 1.0 or config.warmup_epochs
        else None,
    )
    optimizer = OPTIMIZERS[config.optimizer]([{k: v for k, v in g.items() if k != "name"} for g in groups])
    return optimizer, [group["name"] for group in groups]


def _resume(training: _Training, checkpoint_path: Path) -> None:
    """Continue from an epoch checkpoint: weights, optimizer state, history and the validation choice so far.
    A checkpoint whose choice the warm-up rule no longer allows is set aside: the run starts again from epoch 1."""
    config = training.config
    checkpoint = _read_checkpoint(checkpoint_path, training.device)
    if config.validates and not training.selection.load(checkpoint["selection"], epochs_done=checkpoint["epoch"] + 1):
        runs.warn(
            f"{training.run_dir}: its checkpoint chose warm-up epoch {checkpoint['selection']['epoch']}, which warm-up "
            "evaluations no longer can (docs/protocol.md, 2026-11-26); starting the run again from epoch 1"
        )
        return
    training.method.load_state_dict(checkpoint["method"])
    training.optimizer.load_state_dict(checkpoint["optimizer"])
    training.history, training.start_epoch = checkpoint["history"], checkpoint["epoch"] + 1
    training.latest = next((row for row in reversed(training.history) if "R@1" in row), {})


def _train_epochs(training: _Training) -> None:
    """Epochs ``start_epoch`` … ``epochs − 1``, or until the validation choice stops the run: each one trained,
    evaluated every ``eval_every`` epochs and after the last, and recorded (history and checkpoint)."""
    config = training.config
    epochs = tqdm(
        range(training.start_epoch, config.epochs),
        desc=config.resolved_run_name,
        disable=not training.shows_progress,
        initial=training.start_epoch,
        total=config.epochs,
    )
    trained_seconds = float(sum(row["train_seconds"] for row in training.history))
    for epoch in epochs:
        if training.selection.stopped:
            break
        row = _train_epoch(training, epoch)
        trained_seconds += row["train_seconds"]
        if (epoch + 1) % config.eval_every == 0 or epoch + 1 == config.epochs:
            row.update(_evaluate_epoch(training, epoch, trained_seconds=trained_seconds))
        training.history.append(row)
        training.watch.end_epoch(epoch)
        if distributed.is_main_process():
            _save_epoch(training, epoch)
        epochs.set_postfix(loss=f"{row['loss']:.4f}", R1=f"{training.latest.get('R@1', float('nan')):.3f}")


def _train_epoch(training: _Training, epoch: int) -> dict[str, float]:
    """Epoch ``epoch`` (0-based), every generator re-seeded from ``(seed, epoch)``: its history row (the mean
    loss and named parts over its steps, the learning rate, wall-clock and CPU seconds)."""
    config, method, optimizer, sampler = training.config, training.method, training.optimizer, training.sampler
    seed_everything(_epoch_seed(config.seed, epoch))
    sampler.set_epoch(epoch)
    training.train.set_epoch(epoch)
    learning_rates = group_learning_rates(config, training.base_lrs, training.group_names, epoch)
    for group, lr in zip(optimizer.param_groups, learning_rates):
        group["lr"] = lr
    method.train()
    started, started_cpu, totals, steps = time.perf_counter(), time.process_time(), {}, 0
    for images, labels in tqdm(
        _training_batches(training.train, sampler, training.loader, training.device, config.channels_last),
        desc=f"epoch {epoch + 1}",
        total=len(sampler),
        leave=False,
        disable=not training.shows_progress,
    ):
        runs.check_stop(training.run_dir, config.epochs)
        with autocast_context(training.device, training.precision):
            loss, parts = training.step(images, labels)
        training.watch.observe(loss, images, epoch=epoch, step=steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps += 1
        _add_parts(totals, loss, parts)
    return {
        "epoch": epoch + 1,
        **{name: float(value) / max(steps, 1) for name, value in totals.items()},
        "lr": learning_rates[0],  # the "model" group: never frozen
        "train_seconds": time.perf_counter() - started,
        "train_cpu_seconds": time.process_time() - started_cpu,
    }


def _evaluate_epoch(training: _Training, epoch: int, *, trained_seconds: float) -> dict[str, float]:
    """The evaluation after epoch ``epoch`` (0-based): on the test classes (kept as the run's latest metrics
    and embeddings), or on the validation classes, offered to the checkpoint selection with the training
    seconds so far. Returns the history row's columns: the metrics (``val_`` prefixed on validation classes)
    and the evaluation's wall-clock and CPU seconds."""
    started, started_cpu = time.perf_counter(), time.process_time()
    if training.validation is None:
        training.latest, training.arrays = evaluate(training.method, training.datasets, **training.evaluation_options)
        columns = dict(training.latest)
    else:
        training.latest, validation_arrays = evaluate(
            training.method, training.validation, **training.evaluation_options, full=False
        )
        columns = {f"val_{name}": value for name, value in training.latest.items()}
        training.selection.observe(
            training.latest["R@1"],
            epoch=epoch + 1,
            method=training.method,
            trained_seconds=trained_seconds,
            arrays=validation_arrays,
        )
    return {
        **columns,
        "eval_seconds": time.perf_counter() - started,
        "eval_cpu_seconds": time.process_time() - started_cpu,
    }


def _save_epoch(training: _Training, epoch: int) -> None:
    """The history so far and the epoch checkpoint (weights, optimizer state, history, the validation choice so
    far): both or neither."""
    with uninterruptible():
        write_csv(training.run_dir / "history.csv", pd.DataFrame(training.history))
        save_torch(
            training.run_dir / "checkpoint.pt",
            {
                "epoch": epoch,
                "method": training.method.state_dict(),
                "optimizer": training.optimizer.state_dict(),
                "history": training.history,
                "config": training.config.to_dict(),
                **({"selection": training.selection.to_checkpoint()} if training.validation is not None else {}),
            },
        )


def _finish(training: _Training) -> RunResult:
    """The run's reported metrics and embeddings (:func:`_reported_evaluation`) and its final records:
    ``embeddings.npz``, ``metrics.json``, and ``checkpoint.pt`` replaced by the reported weights without the
    optimizer state."""
    config, method = training.config, training.method
    frame = pd.DataFrame(training.history)
    epochs_trained = int(frame["epoch"].iloc[-1]) if len(frame) else 0
    metrics, arrays, chosen = _reported_evaluation(training, epochs_trained=epochs_trained)
    summary = {
        **metrics,
        **chosen,
        "epochs": config.epochs,
        "train_seconds": float(frame["train_seconds"].sum()),
        "seconds_per_epoch": float(frame["train_seconds"].mean()),
        "parameters": int(sum(p.numel() for p in method.parameters())),
    }
    if distributed.is_main_process():
        write_npz(training.run_dir / "embeddings.npz", arrays)
        write_json(training.run_dir / "metrics.json", summary)
        # metrics.json first: a crash between the two leaves a finished run with its full last checkpoint
        save_torch(
            training.run_dir / "checkpoint.pt",
            {
                "epoch": epochs_trained - 1,
                "method": method.state_dict(),
                "history": training.history,
                "config": config.to_dict(),
            },
        )
    return RunResult(config, training.run_dir, summary, frame, method, arrays)


def _reported_evaluation(
    training: _Training, *, epochs_trained: int
) -> tuple[dict[str, float], dict[str, np.ndarray], dict[str, Any]]:
    """``(metrics, embeddings, choice)`` a run reports: without validation classes, the last epoch's test
    evaluation (evaluated again when a resumed run holds none); with them, the best-validation state's
    (:func:`_chosen_checkpoint_metrics`), with that choice's value, epoch and seconds."""
    config, selection = training.config, training.selection
    if training.validation is None:
        metrics, arrays = training.latest, training.arrays
        if not arrays:  # resumed after the last epoch's checkpoint but before the records were written
            metrics, arrays = evaluate(training.method, training.datasets, **training.evaluation_options)
        return (
            metrics,
            arrays,
            {"selection": config.selection_text(best_epoch=epochs_trained, epochs_trained=epochs_trained)},
        )
    metrics, arrays = _chosen_checkpoint_metrics(
        config, training.method, training.datasets, training.validation, selection, training.evaluation_options
    )
    return (
        metrics,
        arrays,
        {
            "val_R@1": selection.value,
            "best_epoch": selection.epoch,
            "epochs_trained": epochs_trained,
            "seconds_to_best": selection.seconds,
            "selection": config.selection_text(best_epoch=selection.epoch, epochs_trained=epochs_trained),
        },
    )


def _validation_sets(datasets: Mapping[str, Any]) -> dict[str, Any]:
    """The validation classes as an evaluation set: query = gallery, each query excluding itself; Recall@K
    only for K below the number of validation images."""
    validation = datasets["validation"]
    return {
        "query": validation,
        "gallery": None,
        "recall_ks": tuple(k for k in datasets["recall_ks"] if k < len(validation)) or (1,),
    }


def _chosen_checkpoint_metrics(
    config: TrainConfig,
    method: Method,
    datasets: Mapping[str, Any],
    validation: Mapping[str, Any],
    selection: CheckpointSelection,
    options: Mapping[str, Any],
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Load the best-validation state into ``method``; then the test metrics and embeddings, read once
    (``final_test``), or no metrics and the validation embeddings of that state."""
    method.load_state_dict(selection.state)
    if config.final_test:
        return evaluate(method, datasets, **options)
    if not selection.arrays:  # resumed after the last checkpoint: embed the validation classes again
        _, selection.arrays = evaluate(method, validation, **options)
    return {}, selection.arrays
