"""Datasets as tensors: a split decoded once into ``uint8`` N × 3 × H × W, cached on disk, read as batches.

Decisions:

* **Which datasets, at which size.** Every image of a split must share one size to stack into one tensor.
  :func:`tensor_layout` reads the image headers (nothing decoded): when they share one stored size (the
  embedded sets, 128 px squares) the images are stacked as stored, bit for bit. When they differ (CUB, Cars,
  SOP, In-Shop) and the run asks for a square ``side`` (:func:`stored_side`), every image is decoded, its
  shorter side resized to ``side`` (PIL bilinear, antialiased: the file pipeline's ``Resize``) and the centre
  ``side × side`` square cut out, so the split stacks as N × 3 × side × side. The rule, with
  ``side = round(image_size · 8/7)`` (146 px at 128, 256 at 224): the test view
  (:func:`dmlstudy.data.batch_transforms.evaluation_crop`: shorter side → round(image_size · 8/7), centre crop)
  then resizes nothing and cuts the same centre as the per-item test transform on the photo (to one pixel of
  rounding); the random resized crop draws its boxes (area 20–100 %, aspect 3/4–4/3) from that square, as
  on the embedded sets, whose crops come from the whole stored square, and no crop shrinks by more than
  8/7, so the batched crop's bilinear resampling (no low-pass filter) does not alias. What differs from the
  file pipeline: its training crops range over the whole photo, these over the central square (for CUB's
  photos, mostly 4:3 to 3:2, the square keeps 67–75 % of the longer side). Without a ``side``, images
  of different sizes raise :class:`DifferentImageSizes`; the resized cache is its own file and key, so a
  dataset whose images share one size keeps its cache and key unchanged.
* **Memory.** A resized split holds 3 · side² bytes per image: 63,948 B at 128 px (side 146), so all
  11,788 CUB images take 753.8 MB (0.70 GiB; 196,608 B and 2.16 GiB at 224 px, over the default
  ``tensor_budget_gib`` of 2). The imagenet regime's stem activations add 192 × 4 × 4 float16 = 6,144 B per
  image and view (:mod:`dmlstudy.models.trunk_cache`): 5,864 training images × (4 training views + the test
  view) + 5,924 test images × 1 view = 35,244 views, 216.5 MB. Decoding holds a split's array and its
  ``.npy`` bytes twice more while writing (≤ 1.2 GB for CUB's larger split), well inside a 24 GiB machine.
* **Budget.** The caller compares the :attr:`TensorLayout.nbytes` of all the splits of a run with its budget
  (``TrainConfig.tensor_budget_gib``) before anything is decoded.
* **Cache files.** ``<dataset root>/.tensor-cache/<split>.npy`` (the array, written with ``np.save``) and
  ``<split>.json`` (key, shape, CRC-32 of the bytes); resized to a square, ``<split>-<side>px.npy`` and
  ``.json``. Each is written to a temporary file and renamed, the
  JSON last, under a file lock (``<split>.lock``) so that parallel runs decode a split once. The key is a SHA-256
  over the cache format, the split's name, the square side when resized, every file's path (relative to
  the root), size and modification time, and the generator marker ``GENERATED.json`` of an embedded set
  (generator name, version, seed, configuration). A key that differs (files or generator changed) or an
  array that cannot be read, has the wrong shape or fails its CRC is rebuilt with a :class:`UserWarning`;
  nothing else in the folder is touched. A folder that cannot be written is warned about and the decoded
  tensor is used from memory.
* **Reading.** The ``.npy`` is opened memory-mapped and copied into one tensor (CPU), which
  :meth:`TensorImageSplit.to` moves to the training device once; there are no per-batch host copies.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock
from PIL import Image
from torchvision.transforms.v2 import functional as TF

from dmlstudy.data.base import ImageListDataset
from dmlstudy.data.batch_transforms import (
    augment_batch,
    evaluation_crop,
    normalize_batch,
)
from dmlstudy.data.transforms import RESIZE_RATIO
from dmlstudy.progress_bars import transient_bar
from dmlstudy.records import write_bytes_atomically

CACHE_FORMAT = 1
CACHE_FOLDER = ".tensor-cache"
GENERATOR_MARKER = "GENERATED.json"  # written by dmlstudy.data.embedded.ensure_generated
logger = logging.getLogger(__name__)


class DifferentImageSizes(ValueError):
    """The images of a split do not all have the same stored size, so they cannot stack into one tensor."""


def stored_size(dataset: ImageListDataset) -> tuple[int, int]:
    """``(height, width)`` shared by every image of ``dataset`` (read from the file headers, nothing decoded)."""
    sizes: set[tuple[int, int]] = set()
    for path in dataset.paths:
        with Image.open(path) as handle:
            sizes.add((handle.height, handle.width))
        if len(sizes) > 1:
            raise DifferentImageSizes(
                f"{dataset.name}: images differ in size ({sorted(sizes)[:2]} …), so they cannot stack into one tensor"
            )
    if not sizes:
        raise DifferentImageSizes(f"{dataset.name}: no images")
    return sizes.pop()


def stored_side(image_size: int) -> int:
    """The square side images of different sizes are cached at for ``image_size`` crops: the test transform's
    resize, ``round(image_size · RESIZE_RATIO)`` (146 px for 128, 256 for 224); see the module docstring."""
    return round(image_size * RESIZE_RATIO)


@dataclass(frozen=True)
class TensorLayout:
    """How a split stacks into one tensor: ``count`` images of ``height × width``, as stored (``side`` None) or
    resized to a ``side`` square; ``key`` identifies those pixels (the cache's key, also the stem cache's)."""

    key: str
    count: int
    height: int
    width: int
    side: int | None

    @property
    def nbytes(self) -> int:
        """Bytes of the uint8 tensor."""
        return self.count * 3 * self.height * self.width


def cache_key(dataset: ImageListDataset, root: Path, *, side: int | None = None) -> str:
    """SHA-256 over the cache format, the split's name, the square ``side`` (only when resized), (relative path,
    size, mtime) of every file, and the generator marker."""
    digest = hashlib.sha256(f"format {CACHE_FORMAT}\n{dataset.name}\n".encode())
    if side is not None:
        digest.update(f"shorter side resized to {side}, centre {side} x {side}\n".encode())
    marker = root / GENERATOR_MARKER
    digest.update(marker.read_bytes() if marker.is_file() else b"no generator marker")
    for path in dataset.paths:
        stat = path.stat()
        try:
            relative = path.relative_to(root).as_posix()
        except ValueError:
            relative = str(path)
        digest.update(f"\n{relative} {stat.st_size} {stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def _cached_shape(meta_file: Path, key: str) -> list[int] | None:
    """The shape recorded in ``meta_file`` when it exists and holds ``key`` (the array itself is checked on reading)."""
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    shape = meta.get("shape") if isinstance(meta, dict) and meta.get("key") == key else None
    return shape if isinstance(shape, list) and len(shape) == 4 else None


def tensor_layout(dataset: ImageListDataset, root: str | Path, *, side: int | None = None) -> TensorLayout:
    """The :class:`TensorLayout` of ``dataset``: as stored when its images share one size, else resized to a
    ``side`` square. A current cache file answers without opening an image; otherwise the headers are read.

    Raises :class:`DifferentImageSizes` when the sizes differ and ``side`` is None, or the split has no image.
    """
    root = Path(root)
    as_stored = cache_key(dataset, root)
    shape = _cached_shape(_cache_files(dataset, root)[1], as_stored)
    if shape is not None:
        return TensorLayout(as_stored, len(dataset), shape[2], shape[3], None)
    if side is not None:
        resized = cache_key(dataset, root, side=side)
        if _cached_shape(_cache_files(dataset, root, side)[1], resized) is not None:
            return TensorLayout(resized, len(dataset), side, side, side)
    try:
        height, width = stored_size(dataset)
    except DifferentImageSizes:
        if side is None or not len(dataset):
            raise
        return TensorLayout(cache_key(dataset, root, side=side), len(dataset), side, side, side)
    return TensorLayout(as_stored, len(dataset), height, width, None)


def _square(image: Image.Image, side: int) -> Image.Image:
    """Shorter side resized to ``side`` (antialiased, as the per-item ``Resize``), then the centre ``side`` square."""
    return TF.center_crop(TF.resize(image, side, antialias=True), side)


def _decode(dataset: ImageListDataset, layout: TensorLayout) -> np.ndarray:
    """Every image of ``dataset`` as ``N × 3 × H × W`` uint8, in order (resized to the layout's square when it has
    one); a bar over the images on a terminal (a real benchmark's split takes minutes to decode once)."""
    height, width = layout.height, layout.width
    array = np.empty((len(dataset), 3, height, width), dtype=np.uint8)
    for index in transient_bar(range(len(dataset)), desc=f"decoding {dataset.name}", unit="image", disable=None):
        image = dataset.read_image(index)
        pixels = np.asarray(image if layout.side is None else _square(image, layout.side))
        if pixels.shape != (height, width, 3):
            raise DifferentImageSizes(
                f"{dataset.name}: {dataset.paths[index]} is {pixels.shape[1]}×{pixels.shape[0]}, the others {width}×{height}"
            )
        array[index] = pixels.transpose(2, 0, 1)
    return array


def _checksum(array: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(array)).cast("B"))


def _cache_files(dataset: ImageListDataset, root: Path, side: int | None = None) -> tuple[Path, Path]:
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in (dataset.name or "split"))
    stem += "" if side is None else f"-{side}px"
    folder = root / CACHE_FOLDER
    return folder / f"{stem}.npy", folder / f"{stem}.json"


def _read_cache(array_file: Path, meta_file: Path, key: str) -> np.ndarray | None:
    """The cached array when present, current and intact; ``None`` (with a warning unless simply absent) otherwise."""
    if not meta_file.is_file():
        return None
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        warnings.warn(f"tensor cache {meta_file} is unreadable ({error}); rebuilding it", stacklevel=3)
        return None
    if meta.get("key") != key:
        warnings.warn(
            f"tensor cache {array_file} is stale (the image files or the generator changed); rebuilding it",
            stacklevel=3,
        )
        return None
    try:
        array = np.load(array_file, mmap_mode="r")
        if list(array.shape) != meta.get("shape") or array.dtype != np.uint8 or _checksum(array) != meta.get("crc32"):
            raise ValueError(f"shape {array.shape}, dtype {array.dtype} or checksum differ from {meta_file}")
        return np.array(array)
    except (OSError, ValueError) as error:
        warnings.warn(f"tensor cache {array_file} is corrupt ({error}); rebuilding it", stacklevel=3)
        return None


def cached_images(dataset: ImageListDataset, root: str | Path, layout: TensorLayout | None = None) -> np.ndarray:
    """``uint8`` N × 3 × H × W of ``dataset`` as ``layout`` stacks it (by default :func:`tensor_layout` without a
    side: as stored), from ``root/.tensor-cache`` or decoded (and cached) now.

    Raises :class:`DifferentImageSizes` when the images cannot stack; see the module docstring for the key.
    """
    root = Path(root)
    layout = layout or tensor_layout(dataset, root)
    array_file, meta_file = _cache_files(dataset, root, layout.side)
    lock: FileLock | None = FileLock(array_file.with_suffix(".lock"))
    try:
        array_file.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()  # concurrent runs of a study: one decodes, the others then read its file
    except OSError:
        lock = None  # a folder we cannot write: decode into memory (the write below warns)
    try:
        return _read_or_build(dataset, layout, array_file, meta_file)
    finally:
        if lock is not None:
            lock.release()


def _read_or_build(dataset: ImageListDataset, layout: TensorLayout, array_file: Path, meta_file: Path) -> np.ndarray:
    key = layout.key
    array = _read_cache(array_file, meta_file, key)
    if array is not None:
        return array
    array = _decode(dataset, layout)
    meta = {
        "key": key,
        "shape": list(array.shape),
        "crc32": _checksum(array),
        "format": CACHE_FORMAT,
        "name": dataset.name,
    }
    if layout.side is not None:
        meta["resized"] = f"shorter side to {layout.side}, centre {layout.side} x {layout.side}"
    try:
        buffer = io.BytesIO()
        np.save(buffer, array)
        write_bytes_atomically(array_file, buffer.getvalue())
        write_bytes_atomically(meta_file, json.dumps(meta, indent=1).encode())
    except OSError as error:
        warnings.warn(
            f"cannot write the tensor cache {array_file} ({error}); using the decoded images from memory", stacklevel=2
        )
    return array


class TensorImageSplit(torch.utils.data.Dataset):
    """A split as one ``uint8`` tensor ``images`` (N × 3 × H × W) with the metadata of its :class:`ImageListDataset`.

    ``split[i]`` is ``(uint8 3 × H × W, label)``; :meth:`load_image` gives the RGB picture (for figures).
    """

    def __init__(
        self,
        source: ImageListDataset | Any,
        images: torch.Tensor,
        *,
        labels: np.ndarray | None = None,
        paths: Sequence[Path] | None = None,
    ) -> None:
        self.images = images
        self.labels = np.asarray(source.labels if labels is None else labels, dtype=np.int64)
        self.paths = list(source.paths if paths is None else paths)
        self.class_names, self.name, self.flip_invariant = source.class_names, source.name, source.flip_invariant
        if len(self.images) != len(self.labels):
            raise ValueError(f"{self.name}: {len(self.images)} images but {len(self.labels)} labels")

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.images[index], int(self.labels[index])

    def load_image(self, index: int) -> Image.Image:
        return Image.fromarray(self.images[index].permute(1, 2, 0).cpu().numpy())

    def subset(self, indices: Sequence[int], *, num_classes: int | None = None) -> TensorImageSplit:
        """The images at ``indices`` (a copy), e.g. the first n classes; ``num_classes`` keeps only that many names."""
        rows = np.asarray(indices, dtype=np.int64)
        part = type(self)(
            self,
            self.images[torch.as_tensor(rows, device=self.images.device)],
            labels=self.labels[rows],
            paths=[self.paths[i] for i in rows],
        )
        if num_classes is not None:
            part.class_names = self.class_names[:num_classes]
        return part

    def to(self, device: torch.device | str) -> TensorImageSplit:
        """Move the images to ``device`` once (in place); returns ``self``."""
        self.images = self.images.to(device)
        return self


class EvaluationImages(torch.utils.data.Dataset):
    """The test view of a :class:`TensorImageSplit`: resized and centre-cropped once (uint8 ``crops``);
    ``view[i]`` is the normalised float image as the per-item test transform gives it, :meth:`batch` a whole batch."""

    def __init__(self, split: TensorImageSplit, image_size: int) -> None:
        self.split, self.image_size = split, image_size
        self.crops = evaluation_crop(split.images, image_size)
        self.labels, self.name = split.labels, split.name

    @property
    def num_classes(self) -> int:
        return self.split.num_classes

    @property
    def paths(self) -> list[Path]:
        return self.split.paths

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int):
        return normalize_batch(self.crops[index][None].cpu())[0], int(self.labels[index])

    def load_image(self, index: int) -> Image.Image:
        return self.split.load_image(index)

    def batch(self, indices: Sequence[int] | slice, device: torch.device | str) -> torch.Tensor:
        """Normalised float32 images of ``indices`` on ``device``."""
        return normalize_batch(self.crops[indices].to(device, non_blocking=True))

    def to(self, device: torch.device | str) -> EvaluationImages:
        self.crops = self.crops.to(device)
        self.split.to(device)
        return self


class BatchAugmentedTrain(torch.utils.data.Dataset):
    """The training view of a :class:`TensorImageSplit`: :meth:`batch` augments a whole batch on the images'
    device (random resized crop, flip only when the split is flip-invariant) with per-sample parameters
    fixed by ``(seed, epoch, index)`` (:func:`dmlstudy.data.batch_transforms.sample_uniforms`). ``view[i]`` is
    row i of the batch ``[i]`` (the same image any batch containing ``i`` would give)."""

    def __init__(self, split: TensorImageSplit, *, seed: int, image_size: int) -> None:
        self.split, self.seed, self.image_size, self.epoch = split, seed, image_size, 0
        self.labels = split.labels

    @property
    def num_classes(self) -> int:
        return self.split.num_classes

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int):
        images, labels = self.batch([index], self.split.images.device)
        return images[0].cpu(), int(labels[0])

    def load_image(self, index: int) -> Image.Image:
        return self.split.load_image(index)

    def batch(self, indices: Sequence[int], device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """Augmented, normalised float32 images ``B × 3 × s × s`` and int64 labels of ``indices``, on ``device``."""
        rows = torch.as_tensor(np.asarray(indices, dtype=np.int64), device=self.split.images.device)
        images = augment_batch(
            self.split.images[rows].to(device, non_blocking=True),
            indices,
            seed=self.seed,
            epoch=self.epoch,
            image_size=self.image_size,
            flip=self.split.flip_invariant,
        )
        labels = torch.as_tensor(self.labels[np.asarray(indices, dtype=np.int64)]).to(device, non_blocking=True)
        return images, labels

    def to(self, device: torch.device | str) -> BatchAugmentedTrain:
        self.split.to(device)
        return self
