"""Training engine: ``run(TrainConfig) -> RunResult``.

One typed config (whose fields the ``parameters`` cell of ``notebooks/01_train.ipynb`` mirrors one to one),
class-balanced batches, any registered method, evaluation on the test classes every ``eval_every``
epochs, and a run folder ``runs/<study>/<run_name>/`` with ``config.yaml``, ``history.csv``,
``metrics.json``, ``embeddings.npz``, ``environment.json`` and an atomically written ``checkpoint.pt``.

Determinism: every epoch re-seeds all generators from ``(seed, epoch)``, so a run resumed from the
checkpoint of epoch e continues exactly as the uninterrupted run (on CPU).
"""
from __future__ import annotations

import dataclasses
import json
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Subset
from tqdm.auto import tqdm

from dmlstudy import metrics as metric_functions
from dmlstudy.data import ClassBalancedBatchSampler, ImageListDataset, build_dataset, build_transforms, evaluation_protocol
from dmlstudy.methods import Method, build_method
from dmlstudy.models import build_backbone
from dmlstudy.paths import data_root, runs_root
from dmlstudy.records import environment_info, save_torch, seed_everything, write_json, write_yaml


@dataclass
class TrainConfig:
    """Everything one training run depends on. Field names match the notebook's ``parameters`` cell.

    The defaults are a CI-sized run (well under a minute on 2 CPU cores); plans override them.
    """

    study: str = "scratch"  # runs are written to <runs_root>/<study>/<run_name>/
    run_name: str = ""  # default: <dataset>-<method>-seed<seed>
    runs_root: str = ""  # default: <project>/runs
    data_root: str = ""  # default: <project>/data; a dataset lives in <data_root>/<dataset>
    dataset: str = "synbirds"  # a registered dataset name (dmlstudy.data.list_datasets())
    method: str = "ms"  # a registered method name (dmlstudy.methods.list_methods())
    method_kwargs: dict = field(default_factory=dict)  # keyword arguments of the method (e.g. {"K1": 16})
    backbone: str = "dml_convnet"  # any timm model name
    pretrained: bool = False  # timm pretrained weights (must be available locally)
    checkpoint_path: str = ""  # local backbone weights file, loaded after construction
    freeze_bn: bool = False  # freeze BatchNorm statistics and affine parameters of the backbone
    output_stride: int = 0  # 0: the backbone's own; 8/16 for dilated ResNets (larger feature grid)
    embedding_dim: int = 128  # d, the inference embedding size
    image_size: int = 64  # training crop and test centre-crop size in pixels
    classes_per_batch: int = 16  # P of a P × M class-balanced batch
    samples_per_class: int = 4  # M of a P × M class-balanced batch
    epochs: int = 2  # training epochs
    steps_per_epoch: int = 0  # 0: len(train) // (P·M) batches per epoch
    train_classes: int = 0  # 0: all training classes; n: only the first n (CI-sized runs)
    test_classes: int = 0  # 0: all test classes; n: only the first n
    optimizer: str = "adamw"  # adam, adamw or sgd
    lr: float = 1e-3  # learning rate of the backbone and embedding
    head_lr: float = 1e-2  # learning rate of proxies / class centres
    weight_decay: float = 1e-4  # weight decay of the backbone and embedding
    lr_schedule: str = "cosine"  # constant or cosine (per epoch, to 1 % of lr)
    eval_every: int = 1  # evaluate on the test classes every n epochs (and always after the last)
    recall_ks: list = field(default_factory=list)  # [] = the dataset's standard K list
    eval_batch_size: int = 256  # batch size when embedding the test set
    num_workers: int = 0  # DataLoader worker processes
    seed: int = 0  # seeds model init, batches and augmentation
    device: str = "auto"  # auto (CUDA when present), cpu or cuda
    resume: bool = False  # continue from the run folder's checkpoint; a complete run is loaded, not retrained
    progress: bool = True  # tqdm progress bars

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_namespace(cls, namespace: Mapping[str, Any]) -> "TrainConfig":
        """Build from a notebook's globals (the injected ``parameters``); unknown names are ignored."""
        return cls(**{name: namespace[name] for name in cls.field_names() if name in namespace})

    def validate(self) -> None:
        """Check every field's type and range; the message names the offending parameter."""
        hints = typing.get_type_hints(type(self))
        for name in self.field_names():
            value, expected = getattr(self, name), hints[name]
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                setattr(self, name, float(value))
                continue
            if expected is int and isinstance(value, bool) or not isinstance(value, expected):
                raise TypeError(f"parameter {name!r} must be of type {expected.__name__}, got {type(value).__name__} {value!r}")
        positive = ("embedding_dim", "image_size", "classes_per_batch", "samples_per_class", "epochs", "eval_every", "eval_batch_size")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"parameter {name!r} must be positive, got {getattr(self, name)}")
        if self.samples_per_class < 2:
            raise ValueError("parameter 'samples_per_class' must be ≥ 2: pair losses need a positive per anchor")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"parameter 'optimizer' must be one of {sorted(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.lr_schedule not in SCHEDULES:
            raise ValueError(f"parameter 'lr_schedule' must be one of {sorted(SCHEDULES)}, got {self.lr_schedule!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"parameter 'device' must be auto, cpu or cuda[:i], got {self.device!r}")

    @property
    def resolved_run_name(self) -> str:
        return self.run_name or f"{self.dataset}-{self.method}-seed{self.seed}"

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_root or runs_root()) / self.study / self.resolved_run_name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": lambda groups, **kw: torch.optim.SGD(groups, momentum=0.9, **kw)}
SCHEDULES = {
    "constant": lambda epoch, epochs: 1.0,
    "cosine": lambda epoch, epochs: 0.01 + 0.99 * 0.5 * (1 + np.cos(np.pi * epoch / epochs)),
}


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


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available on this machine")
    return torch.device(name)


def _first_classes(dataset: ImageListDataset, count: int) -> ImageListDataset | Subset:
    """The images of the first ``count`` classes (all when ``count`` is 0)."""
    if count <= 0 or count >= dataset.num_classes:
        return dataset
    indices = np.flatnonzero(dataset.labels < count)
    subset = Subset(dataset, indices.tolist())
    subset.labels = dataset.labels[indices]
    subset.num_classes = count
    return subset


def load_datasets(config: TrainConfig) -> dict[str, Any]:
    """Train split (train transforms) and the evaluation splits (test transforms) of ``config.dataset``."""
    root = Path(config.data_root or data_root()) / config.dataset
    protocol = evaluation_protocol(config.dataset)
    train = build_dataset(config.dataset, root, "train")
    train.transform = build_transforms(config.image_size, train=True, hflip=train.flip_invariant)
    test_transform = build_transforms(config.image_size, train=False)
    query = build_dataset(config.dataset, root, protocol.query_split, transform=test_transform)
    gallery = build_dataset(config.dataset, root, protocol.gallery_split, transform=test_transform) if protocol.gallery_split else None
    return {
        "train": _first_classes(train, config.train_classes),
        "query": _first_classes(query, config.test_classes),
        "gallery": _first_classes(gallery, config.test_classes) if gallery is not None else None,
        "recall_ks": tuple(config.recall_ks) or protocol.recall_ks,
    }


@torch.no_grad()
def embed(method: Method, dataset, *, batch_size: int = 256, device: torch.device | str = "cpu", num_workers: int = 0) -> np.ndarray:
    """Inference embeddings (``N × d``, float32) of a dataset, in dataset order."""
    was_training = method.training
    method.eval()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    chunks = [method(images.to(device)).float().cpu() for images, _ in loader]
    method.train(was_training)
    return torch.cat(chunks).numpy()


def evaluate(method: Method, datasets: Mapping[str, Any], *, batch_size: int, device: torch.device, num_workers: int = 0) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Metrics of the spine on the evaluation splits, and the embeddings they were computed from."""
    query = embed(method, datasets["query"], batch_size=batch_size, device=device, num_workers=num_workers)
    arrays = {"embeddings": query, "labels": np.asarray(datasets["query"].labels)}
    gallery_kwargs = {}
    if datasets.get("gallery") is not None:
        gallery = embed(method, datasets["gallery"], batch_size=batch_size, device=device, num_workers=num_workers)
        arrays.update(gallery_embeddings=gallery, gallery_labels=np.asarray(datasets["gallery"].labels))
        gallery_kwargs = {"gallery": gallery, "gallery_labels": arrays["gallery_labels"]}
    values = metric_functions.evaluate(query, arrays["labels"], ks=datasets["recall_ks"], **gallery_kwargs)
    return {key: float(value) for key, value in values.items()}, arrays


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch * 7_919) % 2**31


def build_model(config: TrainConfig, num_classes: int) -> Method:
    """The method of ``config`` around its backbone (seeded by ``config.seed``)."""
    seed_everything(config.seed)
    backbone = build_backbone(
        config.backbone,
        pretrained=config.pretrained,
        checkpoint_path=config.checkpoint_path or None,
        freeze_bn=config.freeze_bn,
        image_size=config.image_size,
        output_stride=config.output_stride or None,
    )
    return build_method(config.method, backbone=backbone, embedding_dim=config.embedding_dim, num_classes=num_classes, **config.method_kwargs)


def _load_complete(config: TrainConfig, datasets: Mapping[str, Any], device: torch.device) -> RunResult:
    run_dir = config.run_dir
    method = build_model(config, datasets["train"].num_classes).to(device)
    checkpoint = torch.load(run_dir / "checkpoint.pt", map_location=device, weights_only=False)
    method.load_state_dict(checkpoint["method"])
    with np.load(run_dir / "embeddings.npz") as stored:
        embeddings = dict(stored)
    return RunResult(config, run_dir, json.loads((run_dir / "metrics.json").read_text()), pd.read_csv(run_dir / "history.csv"), method, embeddings)


def run(config: TrainConfig) -> RunResult:
    """Train ``config.method`` on ``config.dataset`` and evaluate it; see the module docstring for the records."""
    config.validate()
    device = resolve_device(config.device)
    run_dir = config.run_dir
    datasets = load_datasets(config)
    checkpoint_path = run_dir / "checkpoint.pt"
    if config.resume and (run_dir / "metrics.json").is_file() and checkpoint_path.is_file():
        return _load_complete(config, datasets, device)

    run_dir.mkdir(parents=True, exist_ok=True)
    write_yaml(run_dir / "config.yaml", config.to_dict())
    write_json(run_dir / "environment.json", environment_info(str(device)))
    (run_dir / "metrics.json").unlink(missing_ok=True)

    train = datasets["train"]
    method = build_model(config, train.num_classes).to(device)
    groups = method.parameter_groups(lr=config.lr, head_lr=config.head_lr, weight_decay=config.weight_decay)
    optimizer = OPTIMIZERS[config.optimizer]([{k: v for k, v in g.items() if k != "name"} for g in groups])
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    sampler = ClassBalancedBatchSampler(
        train.labels,
        classes_per_batch=config.classes_per_batch,
        samples_per_class=config.samples_per_class,
        num_batches=config.steps_per_epoch or None,
        seed=config.seed,
    )
    history: list[dict[str, float]] = []
    start_epoch = 0
    if config.resume and checkpoint_path.is_file():
        checkpoint = torch.load(checkpoint_path, map_location=device, weights_only=False)
        method.load_state_dict(checkpoint["method"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        history, start_epoch = checkpoint["history"], checkpoint["epoch"] + 1

    latest: dict[str, float] = next((row for row in reversed(history) if "R@1" in row), {})
    arrays: dict[str, np.ndarray] = {}
    epochs = tqdm(range(start_epoch, config.epochs), desc=config.resolved_run_name, disable=not config.progress, initial=start_epoch, total=config.epochs)
    for epoch in epochs:
        seed_everything(_epoch_seed(config.seed, epoch))
        sampler.set_epoch(epoch)
        scale = SCHEDULES[config.lr_schedule](epoch, config.epochs)
        for group, base_lr in zip(optimizer.param_groups, base_lrs):
            group["lr"] = base_lr * scale
        method.train()
        loader = DataLoader(train, batch_sampler=sampler, num_workers=config.num_workers)
        started, totals, steps = time.perf_counter(), {}, 0
        for images, labels in tqdm(loader, desc=f"epoch {epoch + 1}", leave=False, disable=not config.progress):
            loss, parts = method.loss(images.to(device), labels.to(device))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"run {config.resolved_run_name}: loss became {loss.item()} at epoch {epoch + 1}, step {steps + 1}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            for name, value in {"loss": float(loss.detach()), **parts}.items():
                totals[name] = totals.get(name, 0.0) + value
        row = {"epoch": epoch + 1, **{name: value / max(steps, 1) for name, value in totals.items()}, "lr": base_lrs[0] * scale, "train_seconds": time.perf_counter() - started}
        if (epoch + 1) % config.eval_every == 0 or epoch + 1 == config.epochs:
            eval_started = time.perf_counter()
            latest, arrays = evaluate(method, datasets, batch_size=config.eval_batch_size, device=device, num_workers=config.num_workers)
            row.update(latest, eval_seconds=time.perf_counter() - eval_started)
        history.append(row)
        pd.DataFrame(history).to_csv(run_dir / "history.csv", index=False)
        save_torch(checkpoint_path, {"epoch": epoch, "method": method.state_dict(), "optimizer": optimizer.state_dict(), "history": history, "config": config.to_dict()})
        epochs.set_postfix(loss=f"{row['loss']:.4f}", R1=f"{latest.get('R@1', float('nan')):.3f}")

    if not arrays:  # resumed after the last epoch's checkpoint but before the records were written
        latest, arrays = evaluate(method, datasets, batch_size=config.eval_batch_size, device=device, num_workers=config.num_workers)
    frame = pd.DataFrame(history)
    summary = {
        **latest,
        "epochs": config.epochs,
        "train_seconds": float(frame["train_seconds"].sum()),
        "seconds_per_epoch": float(frame["train_seconds"].mean()),
        "parameters": int(sum(p.numel() for p in method.parameters())),
    }
    np.savez(run_dir / "embeddings.npz", **arrays)
    write_json(run_dir / "metrics.json", summary)
    return RunResult(config, run_dir, summary, frame, method, arrays)
