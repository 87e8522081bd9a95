"""Supervised pretraining of a backbone on a source set (default: ``shapes``), with a model card.

``dmlstudy pretrain`` (``make pretrain``) trains ``timm.create_model(backbone, num_classes=C)`` with softmax
cross-entropy on every class of the source set, then writes the backbone's state dict *without* its
classifier as ``.safetensors`` (exactly the keys of :class:`dmlstudy.models.backbones.Backbone`'s model, so
``build_backbone(name, checkpoint_path=...)`` loads it) and a model card beside it
(:mod:`dmlstudy.models.cards`: source set and generator version, configuration, held-out source accuracy,
seconds, torch version, SHA-256, and the command that rebuilds it).

Decisions:

* **The source set** is :mod:`dmlstudy.data.shapes` (200 classes × 100 images, 10 held out per class). The
  first source, :mod:`dmlstudy.data.fractals` (IFS attractors, FractalDB-style), did not train in the budget:
  200 classes × 25 images, 4 epochs: held-out top-1 0.5 % (chance); 100 classes × 190 images, 8 epochs: 2.2 %
  (chance 1 %); 50 classes, 40 epochs: training loss 2.7 but held-out 3.6 % (memorised). It is kept,
  registered, for anyone who wants a longer run.
* **Data in memory, augmented on tensors.** The source set (20,000 images of 64 px ≈ 250 MB as uint8) is
  decoded once; each batch gets a per-image random resized crop (area :data:`CROP_AREA`, aspect ±25 %)
  and horizontal flip through ``affine_grid``/``grid_sample``, then the study's ImageNet normalisation
  (:mod:`dmlstudy.data.transforms`), so the pretrained features see the same input scale as fine-tuning.
* **Held-out accuracy**: the last ``holdout_per_class`` images of every class are never trained on; their
  top-1 accuracy (centre view) is the card's ``source_accuracy``.
* **AdamW** (the study's optimizer; weight decay on weights only, label smoothing 0.1) with a linear warm-up
  over the first epoch and cosine decay. SGD at lr 0.1 (Nesterov) stayed at chance loss for two epochs on
  400 fractal classes; AdamW started learning sooner in a 60-step side-by-side on 50 classes (loss 4.00 → 3.86
  vs 3.97 → 3.91). 30 epochs fit the 15-minute budget on 2 cores (the loss is still falling at the end).
* **Determinism**: every random draw comes from generators seeded by ``seed``; with a fixed ``threads`` count
  and ``torch.use_deterministic_algorithms`` the file is bit-identical on one machine type and torch version.
  Across CPUs (other SIMD kernels) float sums can round differently, so :func:`verify` compares the hash
  and, if it differs, the held-out accuracy within :data:`ACCURACY_TOLERANCE`.
* **On a GPU** (``device``; meant for a resnet18 backbone at 128 px): the source set and the
  model live on the device; the batch order and every augmentation parameter are still drawn from the CPU
  generator (the same draws as a CPU build); cuBLAS gets a fixed workspace and deterministic algorithms
  warn instead of failing where CUDA has none. The CPU path is the tested one; the GPU path has not been run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import timm
import torch
import torch.nn.functional as F

from dmlstudy.config import TypedConfig
from dmlstudy.data import build_dataset
from dmlstudy.data.tensor_cache import cached_images
from dmlstudy.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from dmlstudy.models.backbones import build_backbone
from dmlstudy.models.cards import read_card, sha256_file, write_card
from dmlstudy.paths import data_root, project_root
from dmlstudy.run.compute import is_device_name, resolve_device

CROP_AREA = (0.35, 1.0)
ASPECT_JITTER = 0.25
LABEL_SMOOTHING = 0.1
ACCURACY_TOLERANCE = 0.02  # absolute held-out accuracy difference accepted when the bytes differ across machines
DEFAULT_WEIGHTS = "weights/dml_convnet_shapes.safetensors"


@dataclass
class PretrainConfig(TypedConfig):
    """Every setting of a pretraining run; the card stores it and :func:`verify` rebuilds from it."""

    backbone: str = "dml_convnet"  # the backbone to pretrain (a timm model name)
    dataset: str = "shapes"  # a registered generated dataset taking num_classes / images_per_class / image_size
    dataset_seed: int = 0  # seed of the generated source set
    num_classes: int = 200  # classes the source set is generated with
    images_per_class: int = 100  # images per source class
    source_classes: int = 0  # train on the first n classes of the set (0: all), to fit the time budget
    holdout_per_class: int = 10  # the last n images of each class measure the source accuracy on the card
    image_size: int = 64  # pixels
    epochs: int = 30  # passes over the training images
    batch_size: int = 128  # images per step
    lr: float = 3e-3  # AdamW learning rate (warm-up, then cosine)
    weight_decay: float = 1e-4  # AdamW weight decay of weights (not of biases and norms)
    seed: int = 0  # seeds initialisation, batches and augmentation
    threads: int = 2  # torch threads (the same count on the same machine type: bit-identical rebuilds)
    device: str = (
        "cpu"  # cpu, cuda, cuda:<i> or auto; a GPU build is reproducible on that GPU type, not bit-identical to CPU
    )
    out: str = DEFAULT_WEIGHTS  # relative paths are taken from the project root
    data_root: str = ""  # default <project>/data/<dataset>; a non-default source set needs its own folder

    def __post_init__(self) -> None:
        self.check_types()
        positive = ("num_classes", "images_per_class", "image_size", "epochs", "batch_size", "threads")
        bad = [f"{key}={getattr(self, key)!r}" for key in positive if getattr(self, key) < 1]
        if not 0 <= self.source_classes <= self.num_classes:
            bad.append(f"source_classes={self.source_classes} (must be in [0, num_classes])")
        if not 0 <= self.holdout_per_class < self.images_per_class:
            bad.append(f"holdout_per_class={self.holdout_per_class} (must be in [0, images_per_class))")
        if not self.lr > 0:
            bad.append(f"lr={self.lr}")
        if not is_device_name(self.device):
            bad.append(f"device={self.device!r} (must be cpu, cuda, cuda:<i> or auto)")
        if not Path(self.out).suffix == ".safetensors":
            bad.append(f"out={self.out!r} (must end in .safetensors)")
        if bad:
            raise ValueError(f"PretrainConfig: invalid {', '.join(bad)}")

    def command(self) -> str:
        """The ``dmlstudy pretrain`` command line that reproduces this configuration."""
        default = PretrainConfig()
        options = [
            f"--{f.name.replace('_', '-')} {getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        ]
        return " ".join(["dmlstudy pretrain", *options])


@dataclass
class PretrainResult:
    weights: Path
    card: Path
    sha256: str
    source_accuracy: float
    seconds: float


def load_source(config: PretrainConfig) -> tuple[torch.Tensor, torch.Tensor, int, dict[str, Any]]:
    """All images of the source set as ``N × 3 × S × S`` uint8, their labels over every class, the class
    count and the generator marker (name, version, seed, config)."""
    root = Path(config.data_root) if config.data_root else data_root() / config.dataset
    options = {
        "seed": config.dataset_seed,
        "num_classes": config.num_classes,
        "images_per_class": config.images_per_class,
        "image_size": config.image_size,
    }
    splits = [build_dataset(config.dataset, root, split, **options) for split in ("train", "test")]
    images, labels, offset = [], [], 0
    for split in splits:
        images.append(cached_images(split, root))  # decoded once, kept in <root>/.tensor-cache like the study's sets
        labels.append(split.labels + offset)
        offset += split.num_classes
    pixels = torch.from_numpy(np.concatenate(images))
    marker = json.loads((root / "GENERATED.json").read_text(encoding="utf-8"))
    return pixels, torch.from_numpy(np.concatenate(labels)), offset, marker


def holdout_mask(labels: torch.Tensor, holdout_per_class: int) -> torch.Tensor:
    """True for the last ``holdout_per_class`` images (in dataset order) of every class."""
    mask = torch.zeros(len(labels), dtype=torch.bool)
    for label in labels.unique():
        members = (labels == label).nonzero().flatten()
        if holdout_per_class:
            mask[members[-holdout_per_class:]] = True
    return mask


def normalise(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 ``B × 3 × H × W`` → float, ImageNet-normalised as in :func:`dmlstudy.data.build_transforms`."""
    mean = torch.tensor(IMAGENET_MEAN, device=pixels.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=pixels.device).view(1, 3, 1, 1)
    return (pixels.float() / 255.0 - mean) / std


def augment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Per-image random resized crop (area in :data:`CROP_AREA`, aspect ±:data:`ASPECT_JITTER`) and
    horizontal flip, by one affine sampling grid per image (bilinear, reflection padding never needed:
    the crop stays inside the image)."""
    count = images.shape[0]
    area = torch.empty(count).uniform_(*CROP_AREA, generator=generator)
    aspect = torch.exp(
        torch.empty(count).uniform_(math.log(1 - ASPECT_JITTER), -math.log(1 - ASPECT_JITTER), generator=generator)
    )
    width = torch.sqrt(area * aspect).clamp(max=1.0)
    height = torch.sqrt(area / aspect).clamp(max=1.0)
    centre_x = (torch.rand(count, generator=generator) * 2 - 1) * (1 - width)
    centre_y = (torch.rand(count, generator=generator) * 2 - 1) * (1 - height)
    flip = torch.where(torch.rand(count, generator=generator) < 0.5, -1.0, 1.0)
    theta = torch.zeros(count, 2, 3)
    theta[:, 0, 0] = width * flip
    theta[:, 0, 2] = centre_x
    theta[:, 1, 1] = height
    theta[:, 1, 2] = centre_y
    grid = F.affine_grid(theta.to(images.device), list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)


def evaluate(model: torch.nn.Module, pixels: torch.Tensor, labels: torch.Tensor, batch_size: int) -> float:
    """Top-1 accuracy of ``model`` on ``pixels`` (no augmentation)."""
    if len(labels) == 0:
        return float("nan")
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(labels), batch_size):
            logits = model(normalise(pixels[start : start + batch_size]))
            correct += int((logits.argmax(1) == labels[start : start + batch_size]).sum())
    return correct / len(labels)


def backbone_state(model: torch.nn.Module, backbone: str, image_size: int) -> dict[str, torch.Tensor]:
    """The entries of ``model``'s state dict that :class:`~dmlstudy.models.backbones.Backbone` has (no classifier)."""
    keys = build_backbone(backbone, image_size=image_size).model.state_dict().keys()
    state = model.state_dict()
    return {key: state[key].detach().cpu().clone().contiguous() for key in keys}


def pretrain(config: PretrainConfig, *, log=print) -> PretrainResult:
    """Train, write the weights and the card, return where and what (see the module docstring)."""
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    deterministic = torch.are_deterministic_algorithms_enabled()
    on_gpu = device.type == "cuda"
    if on_gpu:  # deterministic cuBLAS needs a fixed workspace, set before the first cuBLAS call
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=on_gpu)
    try:
        return _pretrain(config, device, log=log)
    finally:
        torch.set_num_threads(previous_threads)
        torch.use_deterministic_algorithms(deterministic)


def _pretrain(config: PretrainConfig, device: torch.device, *, log) -> PretrainResult:
    start, cpu_start = time.perf_counter(), time.process_time()
    pixels, labels, num_classes, marker = load_source(config)
    pixels, labels = pixels.to(device), labels.to(device)
    if config.source_classes:
        keep = labels < config.source_classes
        pixels, labels, num_classes = pixels[keep], labels[keep], config.source_classes
    held_out = holdout_mask(labels, config.holdout_per_class)
    train_pixels, train_labels = pixels[~held_out], labels[~held_out]
    log(
        f"source {config.dataset} v{marker['version']}: {num_classes} classes, {len(train_labels)} training / "
        f"{int(held_out.sum())} held-out images (loaded in {time.perf_counter() - start:.1f} s)"
    )

    model = timm.create_model(config.backbone, num_classes=num_classes).to(device)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
    )
    steps_per_epoch = len(train_labels) // config.batch_size
    if steps_per_epoch < 1:
        raise ValueError(
            f"pretrain: {len(train_labels)} training images are fewer than one batch of {config.batch_size}"
        )
    total = steps_per_epoch * config.epochs
    warmup = steps_per_epoch

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    generator = torch.Generator().manual_seed(config.seed)
    for epoch in range(config.epochs):
        model.train()
        order = torch.randperm(len(train_labels), generator=generator).to(device)
        running = 0.0
        for step in range(steps_per_epoch):
            index = order[step * config.batch_size : (step + 1) * config.batch_size]
            images = augment(normalise(train_pixels[index]), generator)
            loss = F.cross_entropy(model(images), train_labels[index], label_smoothing=LABEL_SMOOTHING)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            running += float(loss.detach())
        log(
            f"epoch {epoch + 1}/{config.epochs}: loss {running / steps_per_epoch:.3f} ({time.perf_counter() - start:.0f} s)"
        )

    accuracy = evaluate(model, pixels[held_out], labels[held_out], 256)
    seconds = time.perf_counter() - start
    out = Path(config.out) if Path(config.out).is_absolute() else project_root() / config.out
    out.parent.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(backbone_state(model, config.backbone, config.image_size), str(out))
    digest = sha256_file(out)
    fields = {
        "backbone": config.backbone,
        "file": out.name,
        "sha256": digest,
        "source_dataset": config.dataset,
        "source_generator": marker["generator"],
        "source_generator_version": marker["version"],
        "source_seed": marker["seed"],
        "source_config": marker["config"],
        "source_classes": num_classes,
        "source_train_images": len(train_labels),
        "source_heldout_images": int(held_out.sum()),
        "source_accuracy": round(accuracy, 4),
        "image_size": config.image_size,
        "epochs": config.epochs,
        "seed": config.seed,
        "config": dataclasses.asdict(config),
        "seconds": round(seconds, 1),
        "cpu_seconds": round(time.process_time() - cpu_start, 1),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip()
        + f", {config.threads} torch thread(s)"
        + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""),
        "torch_version": str(torch.__version__),
        "timm_version": str(timm.__version__),
        "command": config.command(),
    }
    card = write_card(out, fields, card_body(fields))
    log(f"held-out source accuracy {accuracy:.3f}; wrote {out} (sha256 {digest[:16]}…) and {card} in {seconds:.0f} s")
    return PretrainResult(out, card, digest, accuracy, seconds)


def card_body(fields: dict[str, Any]) -> str:
    """The human-readable part of the card."""
    return f"""# {fields["backbone"]} pretrained on {fields["source_dataset"]}

Supervised softmax pretraining (``dmlstudy.run.pretrain``) of the backbone ``{fields["backbone"]}`` on the
generated source set ``{fields["source_dataset"]}`` (generator version {fields["source_generator_version"]},
{fields["source_classes"]} classes, {fields["source_train_images"]} training images of {fields["image_size"]} px),
{fields["epochs"]} epochs, seed {fields["seed"]}. Held-out source top-1 accuracy: {fields["source_accuracy"]:.1%}
on {fields["source_heldout_images"]} images. Trained in {fields["seconds"]:.0f} s wall,
{fields["cpu_seconds"]:.0f} s CPU ({fields["machine"]}), torch {fields["torch_version"]}.

The file is the backbone's state dict without the classifier; load it with
``build_backbone("{fields["backbone"]}", checkpoint_path="weights/{fields["file"]}")`` or
``dmlstudy train --checkpoint-path weights/{fields["file"]}``. Loading checks the SHA-256 above.

Rebuild: ``{fields["command"]}`` (``make pretrain``); check a rebuild against this card with
``dmlstudy pretrain --verify weights/{Path(fields["file"]).with_suffix(".md").name}`` (``make pretrain-check``).
"""


def verify(card: str | Path, *, log=print) -> bool:
    """Rebuild the weights a card describes into a temporary folder and compare.

    True when the SHA-256 is equal, or when it differs but the held-out accuracy is within
    :data:`ACCURACY_TOLERANCE` (bit-identity holds on one machine type only; see the module docstring).
    """
    fields = read_card(card, required=("sha256", "config", "source_accuracy"))
    with tempfile.TemporaryDirectory() as folder:
        config = PretrainConfig(**(fields["config"] | {"out": str(Path(folder) / Path(fields["config"]["out"]).name)}))
        result = pretrain(config, log=log)
    if result.sha256 == fields["sha256"]:
        log(f"verified: the rebuild is bit-identical to {card} (sha256 {result.sha256})")
        return True
    gap = abs(result.source_accuracy - float(fields["source_accuracy"]))
    within = gap <= ACCURACY_TOLERANCE
    log(
        f"the rebuild's sha256 {result.sha256} differs from {fields['sha256']} in {card}; held-out accuracy {result.source_accuracy:.4f} "
        f"vs {fields['source_accuracy']:.4f} (|Δ| {gap:.4f} {'≤' if within else '>'} tolerance {ACCURACY_TOLERANCE})"
    )
    return within


__all__ = ["ACCURACY_TOLERANCE", "PretrainConfig", "PretrainResult", "pretrain", "verify"]
