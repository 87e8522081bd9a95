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

This module reads top to bottom: the config, the training loop, the evaluations, the records. What a run
uses comes from below: its data (:mod:`dmlstudy.run.data`), model (:mod:`dmlstudy.run.model`), device,
precision and training step (:mod:`dmlstudy.run.compute`), evaluation (:mod:`dmlstudy.run.evaluation`), the
validation choice of its reported checkpoint (:mod:`dmlstudy.run.checkpoint_selection`) and the checks of its
numbers (:mod:`dmlstudy.run.training_watch`). Run folders, reuse of finished runs, the one-writer lock, checks before data
loads and SIGTERM/SIGINT handling are :mod:`dmlstudy.run.identity`; ``run`` calls into it at its start and its end.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from dmlstudy import distributed, numerics
from dmlstudy.data import ClassBalancedBatchSampler
from dmlstudy.methods import EVAL_BATCH_SIZE, Method
from dmlstudy.paths import runs_root
from dmlstudy.progress_bars import disabled, transient_bar
from dmlstudy.records import (
    environment_info,
    save_torch,
    seed_everything,
    uninterruptible,
    write_csv,
    write_json,
    write_npz,
)
from dmlstudy.rows import BASELINE
from dmlstudy.run import guard, identity
from dmlstudy.run.checkpoint_selection import CheckpointSelection
from dmlstudy.run.compute import autocast_context, autocast_dtype, is_device_name, resolve_device, training_step
from dmlstudy.run.data import (
    file_loader,
    load_datasets,
    place_on_device,
    training_batches,
    training_class_count,
    validation_sets,
)
from dmlstudy.run.evaluation import evaluate
from dmlstudy.run.model import build_model
from dmlstudy.run.settings import AUTOCAST_MODES, RunSettings
from dmlstudy.run.training_watch import TrainingWatch


@dataclass
class TrainConfig(RunSettings):
    """Everything one training run depends on. Field names match the notebook's ``parameters`` cell.

    The defaults are a CI-sized run, what ``dmlstudy train`` with no options does: MS on the first 16 SynBirds
    classes, 2 epochs of 6 batches, evaluated on the first 16 test classes (seconds on 2 CPU cores, after the
    one-time dataset generation). Plans and paper configs set the real sizes; a full run sets
    ``steps_per_epoch``, ``train_classes`` and ``test_classes`` to 0.

    The settings a run shares with its study's protocol and with the tuning plan of its row (sizes, budget,
    ``lr``, validation folds, precision) are declared in :class:`~dmlstudy.run.settings.RunSettings`; the fields
    below are the run's own.
    """

    study: str = "scratch"  # runs are written to <runs_root>/<study>/<run folder>/ (see run_name)
    run_name: str = ""  # folder label, default <dataset>-<method>-seed<seed>; the config hash is appended
    dataset: str = "synbirds"  # a registered dataset name (dmlstudy list datasets)
    method: str = BASELINE  # a registered method name (dmlstudy list methods); default the baseline
    method_kwargs: dict = field(default_factory=dict)  # keyword arguments of the method (e.g. {"K1": 16})
    pretrained: bool = False  # timm's pretrained weights (Hugging Face cache; timm downloads them once when online)
    checkpoint_path: str = ""  # local backbone weights file, loaded after construction (relative: from the working directory, else the project root)
    freeze_bn: bool = False  # freeze BatchNorm statistics and affine parameters of the backbone
    conv_head: bool = True  # with stem_views: end with EfficientNet's 1 × 1 conv_head (False: the last block's output is the feature map)
    stem_views: int = 0  # n ≥ 1: an EfficientNet trained from its last stage on cached activations of its frozen stem, n training views
    output_stride: int = 0  # 0: the backbone's own; 8/16 for dilated ResNets (larger feature grid)
    optimizer: str = "adamw"  # adam, adamw or sgd
    head_lr: float = 1e-2  # learning rate of proxies / class centres
    backbone_lr_scale: float = 1.0  # the backbone trains at lr × this (< 1 when fine-tuning a pretrained backbone)
    warmup_epochs: int = 0  # the first n epochs train only what the method adds to the backbone (backbone frozen)
    weight_decay: float = 1e-4  # weight decay of the backbone and embedding
    lr_schedule: str = "cosine"  # constant or cosine (per epoch, to 1 % of lr)
    validation_fold: int = 0  # the fold held out of training as validation classes (checkpoint choice, patience)
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

    @classmethod
    def of_run_folder(cls, run_dir: str | Path, *, data_root: str = "") -> TrainConfig:
        """The config a finished run folder recorded (``config.yaml``), pointed at the folder where it was found
        (``runs_root``, ``study``, ``run_name``), to be loaded again (``resume``) without bars; ``data_root``, when
        given, replaces the stored one. A key the record has but the config lacks is ignored."""
        run_dir = Path(run_dir)
        stored = identity.read_config_record(run_dir) or {}
        stored |= {"runs_root": str(run_dir.parent.parent), "study": run_dir.parent.name, "run_name": run_dir.name}
        stored |= {"resume": True, "progress": False} | ({"data_root": data_root} if data_root else {})
        return cls(**{name: stored[name] for name in cls.field_names() if name in stored})

    @property
    def resolved_run_name(self) -> str:
        """The run folder's name: ``<run_name or dataset-method-seed<seed>>-<config hash>`` (:func:`dmlstudy.run.identity.folder_name`)."""
        return identity.folder_name(self.to_dict())

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_root or runs_root()) / self.study / self.resolved_run_name


INPUT_PIPELINES = ("auto", "tensor", "files")


_SELECTION_EPOCHS = re.compile(r":? epoch \d+ of \d+ trained| \(\d+\)(?=; no validation)")


def selection_rule(selection: str) -> str:
    """A run's :meth:`TrainConfig.selection_text` without its epoch numbers: the rule, the same for every run
    that followed it."""
    return _SELECTION_EPOCHS.sub("", selection)


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
    config: TrainConfig | _EpochPlan, base_lrs: Sequence[float], names: Sequence[str], epoch: int
) -> list[float]:
    """Each optimizer group's learning rate in ``epoch`` (0-based): its base rate × the schedule, and 0 for the
    ``backbone`` group during the first ``warmup_epochs`` (only the layers the method adds train). ``config``
    gives ``lr_schedule``, ``epochs`` and ``warmup_epochs``."""
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


def run(config: TrainConfig) -> RunResult:
    """Train ``config.method`` on ``config.dataset`` and evaluate it; see the module docstring for the records.

    Under ``torchrun`` (several processes) the model is wrapped in DistributedDataParallel, each rank takes
    its share of every global P × M batch, methods gather embeddings across ranks before their pair losses,
    and only rank 0 writes records and checkpoints.
    """
    config.validate()
    guard.check_before_loading(config)
    numerics.pin_process()
    device = distributed.setup(config.device) if distributed.launched_by_torchrun() else resolve_device(config.device)
    with guard.RunGuard(config, writer=distributed.is_main_process()) as folder:
        if folder.reusable:
            result = _load_complete(config, device)
        else:
            datasets = load_datasets(config)
            guard.check_loaded_data(config, datasets)
            folder.write_start_records({**environment_info(str(device)), "world_size": distributed.world_size()})
            training = _set_up_training(config, datasets, device, resume_from=folder.resume_from)
            _train_epochs(training)
            result = _finish(training, config)
    if distributed.is_main_process():
        identity.note_used(config.run_dir)
    return result


@dataclass(frozen=True)
class _EpochPlan:
    """What the epochs of a run read of its config (:class:`TrainConfig` describes the fields): how many, when
    they are evaluated, their seeds, learning-rate schedule and warm-up, and how they show progress."""

    run_name: str  # the run folder's name (:attr:`TrainConfig.resolved_run_name`)
    epochs: int
    eval_every: int
    seed: int
    lr_schedule: str
    warmup_epochs: int
    channels_last: bool
    shows_progress: bool  # ``progress``, on the process that writes the records


@dataclass
class _Training:
    """One run between its set-up and its records: what every epoch uses, and what the epochs so far left
    (the history, the last evaluation, the validation choice)."""

    plan: _EpochPlan
    record: dict[str, Any]  # the run's config as its checkpoints store it (:meth:`TrainConfig.to_dict`)
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


def _set_up_training(
    config: TrainConfig, datasets: Mapping[str, Any], device: torch.device, *, resume_from: Path | None
) -> _Training:
    """Datasets on ``device``, the class-balanced sampler, the model (seeded by ``config.seed``), its training
    step and optimizer; then the state of the checkpoint ``resume_from`` when the run continues one."""
    datasets = place_on_device(datasets, device)
    train = datasets["train"]
    validation = validation_sets(datasets) if config.validates else None
    sampler = ClassBalancedBatchSampler(
        train.labels,
        classes_per_batch=config.classes_per_batch,
        samples_per_class=config.samples_per_class,
        num_batches=config.steps_per_epoch or None,
        seed=config.seed,
        rank=distributed.rank(),
        world_size=distributed.world_size(),
    )
    loader = file_loader(train, sampler, config, device)
    watch = TrainingWatch(config.resolved_run_name, config.lr, train, sampler)
    selection = CheckpointSelection(config.patience, config.warmup_epochs)
    method = build_model(config, train.num_classes).to(device)
    step = training_step(config, method, device)
    precision = autocast_dtype(config, device)
    optimizer, group_names = build_optimizer(config, method)
    shows_progress = config.progress and distributed.is_main_process()
    training = _Training(
        plan=_EpochPlan(
            run_name=config.resolved_run_name,
            epochs=config.epochs,
            eval_every=config.eval_every,
            seed=config.seed,
            lr_schedule=config.lr_schedule,
            warmup_epochs=config.warmup_epochs,
            channels_last=config.channels_last,
            shows_progress=shows_progress,
        ),
        record=config.to_dict(),
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
        loader=loader,
        watch=watch,
        selection=selection,
        validation=validation,
        evaluation_options={
            "batch_size": config.eval_batch_size,
            "device": device,
            "num_workers": config.num_workers,
            "autocast": precision,
            "channels_last": config.channels_last,
            "progress": shows_progress,
        },
    )
    if resume_from is not None:
        _resume(training, resume_from)
    return training


def build_optimizer(config: TrainConfig, method: Method) -> tuple[torch.optim.Optimizer, list[str]]:
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
    checkpoint = _read_checkpoint(checkpoint_path, training.device)
    if training.validation is not None and not training.selection.load(
        checkpoint["selection"], epochs_done=checkpoint["epoch"] + 1
    ):
        identity.warn(
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
    plan = training.plan
    epochs = tqdm(
        range(training.start_epoch, plan.epochs),
        desc=plan.run_name,
        disable=disabled(not plan.shows_progress),
        initial=training.start_epoch,
        total=plan.epochs,
    )
    trained_seconds = float(sum(row["train_seconds"] for row in training.history))
    for epoch in epochs:
        if training.selection.stopped:
            break
        row = _train_epoch(training, epoch)
        trained_seconds += row["train_seconds"]
        if (epoch + 1) % plan.eval_every == 0 or epoch + 1 == plan.epochs:
            row.update(_evaluate_epoch(training, epoch, trained_seconds=trained_seconds))
        training.history.append(row)
        training.watch.end_epoch(epoch)
        if distributed.is_main_process():
            _save_epoch(training, epoch)
        epochs.set_postfix(loss=f"{row['loss']:.4f}", R1=f"{training.latest.get('R@1', float('nan')):.3f}")


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch * 7_919) % 2**31


def _train_epoch(training: _Training, epoch: int) -> dict[str, float]:
    """Epoch ``epoch`` (0-based), every generator re-seeded from ``(seed, epoch)``: its history row (the mean
    loss and named parts over its steps, the learning rate, wall-clock and CPU seconds)."""
    plan, method, optimizer, sampler = training.plan, training.method, training.optimizer, training.sampler
    learning_rates = group_learning_rates(plan, training.base_lrs, training.group_names, epoch)
    for group, lr in zip(optimizer.param_groups, learning_rates):
        group["lr"] = lr
    seed_everything(_epoch_seed(plan.seed, epoch))
    sampler.set_epoch(epoch)
    training.train.set_epoch(epoch)
    method.train()
    started, started_cpu, totals, steps = time.perf_counter(), time.process_time(), {}, 0
    batches = training_batches(training.train, sampler, training.loader, training.device, plan.channels_last)
    for images, labels in transient_bar(
        batches, desc=f"epoch {epoch + 1}", total=len(sampler), disable=not plan.shows_progress
    ):
        guard.check_stop(training.run_dir, plan.epochs)
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


def _add_parts(totals: dict[str, Any], loss: torch.Tensor, parts: Mapping[str, Any]) -> None:
    """Sum the step's loss and named parts without a host sync (tensors stay tensors until the epoch ends)."""
    for name, value in {"loss": loss.detach(), **parts}.items():
        totals[name] = totals.get(name, 0.0) + (value.detach() if isinstance(value, torch.Tensor) else value)


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


def _reported_evaluation(
    training: _Training, config: TrainConfig, *, epochs_trained: int
) -> tuple[dict[str, float], dict[str, np.ndarray], dict[str, Any]]:
    """``(metrics, embeddings, choice)`` a run reports, with how its state was chosen. Without validation classes:
    the last epoch's test evaluation. With them: the best-validation state, loaded into the method, its test
    metrics and embeddings read once (``final_test``), or no metrics and that state's validation embeddings;
    with the choice's value, epoch and seconds. What a resumed run no longer holds is embedded again."""
    selection = training.selection
    if training.validation is None:
        metrics, arrays = training.latest, training.arrays
        reads = None if arrays else training.datasets
        choice = {"selection": config.selection_text(best_epoch=epochs_trained, epochs_trained=epochs_trained)}
    else:
        training.method.load_state_dict(selection.state)
        metrics, arrays = {}, selection.arrays
        reads = training.datasets if config.final_test else None if arrays else training.validation
        choice = {
            "val_R@1": selection.value,
            "best_epoch": selection.epoch,
            "epochs_trained": epochs_trained,
            "seconds_to_best": selection.seconds,
            "selection": config.selection_text(best_epoch=selection.epoch, epochs_trained=epochs_trained),
        }
    if reads is not None:
        scores, arrays = evaluate(training.method, reads, **training.evaluation_options)
        metrics = scores if reads is training.datasets else {}
    return metrics, arrays, choice


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
                "config": training.record,
                **({"selection": training.selection.to_checkpoint()} if training.validation is not None else {}),
            },
        )


def _finish(training: _Training, config: TrainConfig) -> RunResult:
    """The run's reported metrics and embeddings (:func:`_reported_evaluation`) and its final records:
    ``embeddings.npz``, ``metrics.json``, and ``checkpoint.pt`` replaced by the reported weights without the
    optimizer state."""
    method = training.method
    frame = pd.DataFrame(training.history)
    epochs_trained = int(frame["epoch"].iloc[-1]) if len(frame) else 0
    metrics, arrays, chosen = _reported_evaluation(training, config, epochs_trained=epochs_trained)
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
                "config": training.record,
            },
        )
    return RunResult(config, training.run_dir, summary, frame, method, arrays)


NON_IDENTITY_FIELDS = identity.NON_IDENTITY_FIELDS  # fields that do not change what a run computes (not hashed)


def is_complete(config: TrainConfig) -> bool:
    """Whether ``config``'s run folder holds a finished run (configuration, final metrics and checkpoint)."""
    return identity.is_complete(config.run_dir)


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


def load_reported_state(method: Method, run_dir: Path, device: torch.device) -> Method:
    """Load into ``method`` the weights a finished run reports: its ``checkpoint.pt``'s ``method`` state, or,
    in a last-epoch checkpoint that also carries a validation choice (a run finished before finished runs
    were slimmed, or one whose records were cut short), the chosen state."""
    checkpoint = _read_checkpoint(Path(run_dir) / "checkpoint.pt", device)
    chosen = checkpoint.get("selection", {}).get("state")
    method.load_state_dict(chosen if chosen is not None else checkpoint["method"])
    return method


def _read_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    """A run checkpoint; one that cannot be read names the file and the way out."""
    try:
        return torch.load(path, map_location=device, weights_only=False)
    except Exception as error:  # torch raises RuntimeError, pickle.UnpicklingError, EOFError, … for a damaged file
        raise RuntimeError(
            f"cannot read the checkpoint {path} ({type(error).__name__}: {error}); "
            "pass --overwrite (overwrite=True) to train this run again from epoch 1"
        ) from None
