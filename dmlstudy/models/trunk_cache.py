"""Fine-tuning only the last stage of an ImageNet EfficientNet, on cached activations of its frozen stem.

On CPU, fine-tuning all of EfficientNet-Lite0 is slow (``benchmarks/bench_lite0.py``). Its early stages hold
generic ImageNet features; the last stage and the 1 × 1 head make the features the methods' heads read. So
the network is split in two at ``blocks[first_trainable_block]`` (6 for Lite0):

* the **stem** (``conv_stem``, ``bn1``, ``blocks[:6]``, with the backbone's input renormalisation) is frozen
  for good (parameters without gradients, BatchNorm on its running statistics), so its output for an image
  and an augmentation view never changes: it is computed once (:func:`stem_activations`) and stored in float16
  (:func:`cached_stem_activations`; 192 × 4 × 4 per image at 128 px, 6 KiB);
* the **tail** (``blocks[6:]``, ``conv_head``, ``bn2``) trains; :class:`StemCachedBackbone`'s ``forward`` takes
  the cached activations and returns the ``B × C × H × W`` feature map a method's head reads (1280 × 4 × 4 at
  128 px), exactly as :class:`~dmlstudy.models.backbones.Backbone` would from the images (eval mode).

A cache file holds the activations of one split under one view: the test view (centre crop) or one
augmentation view of the training set (the random crops and flips that
:func:`dmlstudy.data.batch_transforms.augment_batch` draws for ``(seed, epoch)``). Its name is a digest of
:class:`StemCacheKey`: the split's identity, the image size, the view, the stem's weights and the storage
type; the key is also stored in the file and checked on reading, so a changed dataset, view or stem never
reads stale activations.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
from filelock import FileLock, Timeout
from PIL import Image
from torch import nn
from tqdm.auto import tqdm

from dmlstudy import numerics
from dmlstudy.data.batch_transforms import augment_batch, evaluation_crop, normalize_batch
from dmlstudy.data.tensor_cache import BatchAugmentedTrain, EvaluationImages, TensorImageSplit
from dmlstudy.models.backbones import Backbone
from dmlstudy.progress_bars import disabled
from dmlstudy.records import write_bytes_atomically

CACHE_FORMAT = 1
LITE0_FIRST_TRAINABLE_BLOCK = 6  # Lite0's last stage: one MBConv block, 192 → 320 channels at stride 32
SPLIT_PARTS = ("conv_stem", "bn1", "blocks", "conv_head", "bn2")  # the layout of timm's EfficientNet family
ACTIVATIONS = "activations"  # the tensor's name in a cache file


class StemCachedBackbone(Backbone):
    """A :class:`~dmlstudy.models.backbones.Backbone` whose stem is frozen and whose ``forward`` starts after it.

    Args:
        name: a timm EfficientNet-family model (``conv_stem``, ``bn1``, ``blocks``, ``conv_head``, ``bn2``),
            by default ``dml_efficientnet_lite0``.
        first_trainable_block: the index into ``blocks`` where the tail starts.
        conv_head: end with EfficientNet's 1 × 1 ``conv_head`` + ``bn2`` (1,280 channels for Lite0), as the
            classifier's features do; False: the feature map is the last block's output (320 channels for Lite0),
            and ``conv_head`` / ``bn2`` take no part (their weights stay in the state dict, untrained).
        **options: :class:`~dmlstudy.models.backbones.Backbone`'s (``pretrained``, ``freeze_bn``, …); ``freeze_bn``
            concerns the tail, the stem's BatchNorm always runs on its running statistics.

    The state dict is the full backbone's (same keys as a ``Backbone`` of ``name``), so trained weights load into a
    ``Backbone`` that embeds images directly.
    """

    def __init__(
        self,
        name: str = "dml_efficientnet_lite0",
        *,
        first_trainable_block: int = LITE0_FIRST_TRAINABLE_BLOCK,
        conv_head: bool = True,
        **options,
    ) -> None:
        super().__init__(name, **options)
        missing = [part for part in SPLIT_PARTS if not hasattr(self.model, part)]
        if missing:
            raise ValueError(f"backbone {name!r} has no {missing}: the stem/tail split needs the EfficientNet layout")
        if not 0 < first_trainable_block < len(self.model.blocks):
            last = len(self.model.blocks) - 1
            raise ValueError(f"first_trainable_block must be in 1…{last} for {name!r}, got {first_trainable_block}")
        self.first_trainable_block = first_trainable_block
        self.conv_head = conv_head
        if not conv_head:  # the last block's output is the feature map; conv_head and bn2 take no part
            self.model.conv_head.requires_grad_(False)
            self.model.bn2.requires_grad_(False)
            self.num_features = int(self.model.blocks[-1][-1].conv_pwl.out_channels)
        for module in self.stem_modules():
            module.requires_grad_(False)
            module.eval()

    def idle_modules(self) -> list[nn.Module]:
        """The layers whose weights the state dict keeps but the forward pass never runs (``conv_head`` and
        ``bn2`` without ``conv_head``): not part of the network a run trains, so not counted as its parameters."""
        return [] if self.conv_head else [self.model.conv_head, self.model.bn2]

    def stem_modules(self) -> list[nn.Module]:
        """The frozen layers, in the order they run."""
        return [self.model.conv_stem, self.model.bn1, *self.model.blocks[: self.first_trainable_block]]

    def train(self, mode: bool = True) -> StemCachedBackbone:
        super().train(mode)
        for module in self.stem_modules():
            module.eval()
        return self

    @torch.no_grad()
    def stem(self, images: torch.Tensor) -> torch.Tensor:
        """Stem activations ``B × C × S/32 × S/32`` (192 channels for Lite0) of ImageNet-normalised ``images``."""
        if self.renormalise is not None:
            images = self.renormalise(images)
        for module in self.stem_modules():
            images = module(images)
        return images

    def forward(self, activations: torch.Tensor) -> torch.Tensor:
        """Feature map ``B × num_features × H × W`` of stem ``activations`` (any float type; computed in the
        tail's type), or of ImageNet-normalised images (``B × 3 × S × S``), which go through the frozen stem first."""
        if activations.shape[1] == self.model.conv_stem.in_channels:  # images: the stem runs first (figures)
            activations = self.stem(activations)
        features = activations.to(self.model.conv_head.weight.dtype)
        features = self.model.blocks[self.first_trainable_block :](features)
        return self.model.bn2(self.model.conv_head(features)) if self.conv_head else features

    def stem_digest(self) -> str:
        """SHA-256 of the stem's weights and buffers (names, shapes, types, bytes) and the split point."""
        digest = hashlib.sha256(f"{self.name} split at blocks[{self.first_trainable_block}]\n".encode())
        if self.renormalise is not None:
            digest.update(
                f"{self.renormalise.scale.flatten().tolist()} {self.renormalise.shift.flatten().tolist()}".encode()
            )
        for index, module in enumerate(self.stem_modules()):
            for key, tensor in module.state_dict().items():
                digest.update(f"\n{index}.{key} {tuple(tensor.shape)} {tensor.dtype}\n".encode())
                digest.update(tensor.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()


@dataclass(frozen=True)
class StemCacheKey:
    """What a cache file's activations depend on.

    ``dataset_digest`` identifies the split's images (e.g. :func:`dmlstudy.data.tensor_cache.cache_key`);
    ``augmentation_seed`` is None for the test view (resize and centre crop), else the seed the training
    augmentation was drawn with, and ``view`` its epoch argument (view ``v`` of the training set); ``numerics``
    the tag of the kernels that computed them (:func:`dmlstudy.numerics.observed`).
    """

    dataset_digest: str
    image_size: int
    augmentation_seed: int | None
    view: int
    stem_digest: str
    dtype: str = "float16"
    numerics: str = numerics.PINNED_TAG  # the kernels that computed them (dmlstudy.numerics): another tag, another file

    def file_name(self) -> str:
        text = json.dumps({"format": CACHE_FORMAT, **asdict(self)}, sort_keys=True)
        return f"stem-{hashlib.sha256(text.encode()).hexdigest()[:32]}.safetensors"

    def metadata(self) -> dict[str, str]:
        return {"format": str(CACHE_FORMAT), **{field: json.dumps(value) for field, value in asdict(self).items()}}


def stem_activations(
    backbone: StemCachedBackbone, batches: Iterable[torch.Tensor], *, dtype: torch.dtype = torch.float16
) -> torch.Tensor:
    """The stem's activations ``N × C × h × w`` (in ``dtype``, on the CPU) of the image ``batches``, in order."""
    parts = [backbone.stem(images).to("cpu", dtype) for images in batches]
    if not parts:
        raise ValueError("stem_activations: no batches of images")
    return torch.cat(parts)


def read_stem_cache(path: Path, key: StemCacheKey) -> torch.Tensor | None:
    """The activations stored at ``path`` under ``key``; None when there is no such file, and a warning
    when the file cannot be read or was written for another key."""
    if not path.is_file():
        return None
    try:
        with safetensors.safe_open(str(path), framework="pt") as handle:
            stored = handle.metadata() or {}
            activations = handle.get_tensor(ACTIVATIONS) if stored == key.metadata() else None
    except Exception as error:  # a truncated or foreign file: each reader raises its own type
        warnings.warn(f"stem cache {path} cannot be read ({type(error).__name__}: {error}); recomputing", stacklevel=2)
        return None
    if activations is None:
        warnings.warn(f"stem cache {path} was written for another key; recomputing", stacklevel=2)
    return activations


def cached_stem_activations(
    backbone: StemCachedBackbone,
    batches: Iterable[torch.Tensor],
    *,
    folder: str | Path,
    dataset_digest: str,
    image_size: int,
    augmentation_seed: int | None = None,
    view: int = 0,
    dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """The stem's activations of one view of a split (``batches``: its images in dataset order), read from
    ``folder`` when a file for this :class:`StemCacheKey` is there, else computed and written (atomically:
    parallel runs may compute a view twice, never read half a file). ``batches`` is only iterated on a miss."""
    numerics.pin_process()
    key = StemCacheKey(
        dataset_digest=dataset_digest,
        image_size=image_size,
        augmentation_seed=augmentation_seed,
        view=view,
        stem_digest=backbone.stem_digest(),
        dtype=str(dtype).removeprefix("torch."),
        numerics=numerics.observed()["numerics"],
    )
    path = Path(folder) / key.file_name()
    activations = read_stem_cache(path, key)
    if activations is None:
        activations = stem_activations(backbone, batches, dtype=dtype)
        write_bytes_atomically(path, safetensors.torch.save({ACTIVATIONS: activations}, metadata=key.metadata()))
    return activations


# ------------------------------------------------------------------------------------ activation-backed splits

STEM_VIEW_SEED = 0  # the seed of the cached training views: every run and seed reads the same views


class StemActivationSplit(TensorImageSplit):
    """A :class:`~dmlstudy.data.tensor_cache.TensorImageSplit` whose rows are the stem's activations instead of
    pixels: ``images`` is ``N × (V + 1) × C × h × w`` (float16), views ``0 … V − 1`` the cached training views and
    the last one the test view. :meth:`load_image` reads the image file, for figures."""

    @property
    def training_views(self) -> int:
        return self.images.shape[1] - 1

    def load_image(self, index: int) -> Image.Image:
        with Image.open(self.paths[index]) as image:
            return image.convert("RGB")


class CachedViewTrain(BatchAugmentedTrain):
    """The training side of a :class:`StemActivationSplit`: epoch ``e`` reads cached view ``e mod V``.

    It stands where :class:`~dmlstudy.data.tensor_cache.BatchAugmentedTrain` stands in the tensor pipeline
    (``batch``, ``set_epoch``, ``to``); its batches are stem activations, which only a
    :class:`StemCachedBackbone` reads."""

    def __init__(self, split: StemActivationSplit) -> None:
        super().__init__(split, seed=STEM_VIEW_SEED, image_size=0)
        if split.training_views < 1:
            raise ValueError(f"{split.name}: its activations hold no training view")

    def batch(self, indices: Sequence[int], device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.asarray(indices, dtype=np.int64)
        view = self.epoch % self.split.training_views
        activations = self.split.images[torch.as_tensor(rows, device=self.split.images.device), view]
        labels = torch.as_tensor(self.labels[rows]).to(device, non_blocking=True)
        return activations.to(device, non_blocking=True).float(), labels


class CachedViewEvaluation(EvaluationImages):
    """The test view of a :class:`StemActivationSplit`, where :class:`~dmlstudy.data.tensor_cache.EvaluationImages`
    stands in the tensor pipeline (``crops`` are the test view's activations)."""

    def __init__(self, split: StemActivationSplit) -> None:
        self.split, self.image_size = split, 0
        self.crops = split.images[:, -1]
        self.labels, self.name = split.labels, split.name

    def __getitem__(self, index: int):
        return self.crops[index].float().cpu(), int(self.labels[index])

    def batch(self, indices: Sequence[int] | slice, device: torch.device | str) -> torch.Tensor:
        return self.crops[indices].to(device, non_blocking=True).float()

    def to(self, device: torch.device | str) -> CachedViewEvaluation:
        self.split.to(device)
        self.crops = self.split.images[:, -1]
        return self


def _view_batches(split: TensorImageSplit, image_size: int, view: int | None, chunk: int) -> Iterator[torch.Tensor]:
    """Normalised float images of ``split`` in order: training view ``view`` (the augmentation of
    :func:`~dmlstudy.data.batch_transforms.augment_batch` for ``(STEM_VIEW_SEED, view)``), or the test view (None)."""
    for start in range(0, len(split), chunk):
        images = split.images[start : start + chunk]
        if view is None:
            yield normalize_batch(evaluation_crop(images, image_size))
        else:
            indices = list(range(start, start + len(images)))
            yield augment_batch(
                images, indices, seed=STEM_VIEW_SEED, epoch=view, image_size=image_size, flip=split.flip_invariant
            )


def _counted(batches: Iterable[torch.Tensor], bar: tqdm) -> Iterator[torch.Tensor]:
    """``batches`` unchanged, the bar advanced by each batch's images once the stem has taken it."""
    for images in batches:
        yield images
        bar.update(len(images))


def stem_activation_split(
    split: TensorImageSplit,
    backbone: StemCachedBackbone,
    *,
    folder: str | Path,
    dataset_digest: str,
    image_size: int,
    training_views: int,
    chunk: int = 128,
    progress: bool | None = None,
) -> StemActivationSplit:
    """``split`` as a :class:`StemActivationSplit`: ``training_views`` cached training views (0 for a split that
    is only evaluated) and the test view, each read from ``folder`` or computed once and stored there.

    Parallel runs share the work: a view another process is computing (its lock held) is left for later and
    the next one taken, so two runs that start together compute different views, then read each other's.

    Computing the views takes minutes on a CPU, so a tqdm bar counts images × views, with the time left: advanced
    as the stem takes each chunk of a view it computes, and by a whole view at once for one read from ``folder``.
    ``progress``: True shows it, False never, None (the default) when stderr is a terminal. A run passes its
    ``progress`` field; ``make study``'s caching step (:func:`dmlstudy.study.plan_inputs.prepare_stem_caches`)
    passes True, so a log shows the bar too. The bar does not touch the activations."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    views: list[int | None] = [*range(training_views), None]
    found: dict[int | None, torch.Tensor] = {}
    pending = list(views)
    blocking = False
    described = f"stem activations of {split.name or 'a split'} ({training_views} training views + the test view)"
    with tqdm(
        total=len(split) * len(views),
        desc=described,
        unit="image",
        disable=disabled(None if progress is None else not progress),
    ) as bar:
        while pending:
            waiting = []
            for view in pending:
                lock = FileLock(folder / f"{dataset_digest[:16]}-{image_size}-{view}.lock")
                try:
                    lock.acquire(timeout=-1 if blocking else 0)
                except Timeout:
                    waiting.append(view)
                    continue
                before = bar.n
                try:
                    found[view] = cached_stem_activations(
                        backbone,
                        _counted(_view_batches(split, image_size, view, chunk), bar),
                        folder=folder,
                        dataset_digest=dataset_digest,
                        image_size=image_size,
                        augmentation_seed=None if view is None else STEM_VIEW_SEED,
                        view=0 if view is None else view,
                    )
                finally:
                    lock.release()
                bar.update(before + len(split) - bar.n)  # the rest of the view: all of it when read from folder
            pending, blocking = waiting, True
    stacked = torch.stack([found[view] for view in views], dim=1)
    return StemActivationSplit(split, stacked)
