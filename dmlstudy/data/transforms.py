"""Image transforms of the standard DML protocol (torchvision ``transforms.v2``).

Train: ``RandomResizedCrop(image_size, scale=crop_scale)`` → optional ``RandomHorizontalFlip`` →
float tensor in [0, 1] → ImageNet normalisation. Test: ``Resize(round(image_size · resize_ratio))``
(shorter side; 256 for 224) → ``CenterCrop(image_size)`` → same normalisation.

These per-item transforms serve the file pipeline; :mod:`dmlstudy.data.batch_transforms` applies the same
geometry (the constants below) to whole uint8 batches on the training device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision.transforms import v2

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CROP_SCALE = (0.2, 1.0)  # RandomResizedCrop's area range (fraction of the image)
CROP_RATIO = (3 / 4, 4 / 3)  # RandomResizedCrop's aspect-ratio range (torchvision's default)
RESIZE_RATIO = 8 / 7  # test: shorter side resized to round(image_size · 8/7), then the centre crop (256 → 224)


def _check_args(image_size: int, resize_ratio: float, crop_scale: tuple[float, float]) -> None:
    if not isinstance(image_size, int) or isinstance(image_size, bool) or image_size < 1:
        raise ValueError(f"build_transforms: image_size must be a positive int, got {image_size!r}")
    if not resize_ratio >= 1.0:
        raise ValueError(
            f"build_transforms: resize_ratio must be >= 1 (resize, then crop a smaller centre), got {resize_ratio!r}"
        )
    low, high = crop_scale
    if not 0.0 < low <= high <= 1.0:
        raise ValueError(f"build_transforms: crop_scale must satisfy 0 < low <= high <= 1, got {crop_scale!r}")


def build_transforms(
    image_size: int,
    *,
    train: bool,
    hflip: bool = True,
    resize_ratio: float = RESIZE_RATIO,
    crop_scale: tuple[float, float] = CROP_SCALE,
) -> Callable:
    """PIL image (or uint8 ``C × H × W`` tensor) → normalised ``float32`` tensor ``3 × image_size × image_size``.

    ``hflip`` only affects the train pipeline (pass False for flip-sensitive data such as glyphs);
    ``crop_scale`` is RandomResizedCrop's area range (aspect ratio range left at its 3/4–4/3 default).
    """
    _check_args(image_size, resize_ratio, crop_scale)
    to_normalised = [
        v2.ToImage(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
    ]
    if train:
        geometry = [v2.RandomResizedCrop(image_size, scale=tuple(crop_scale), ratio=CROP_RATIO, antialias=True)]
        if hflip:
            geometry.append(v2.RandomHorizontalFlip(p=0.5))
    else:
        geometry = [v2.Resize(round(image_size * resize_ratio), antialias=True), v2.CenterCrop(image_size)]
    return v2.Compose(geometry + to_normalised)


def denormalize(tensor: torch.Tensor) -> torch.Tensor:
    """Invert the ImageNet normalisation, ``x · std + mean``, clamped to [0, 1] (for plotting).

    Accepts ``3 × H × W`` or ``… × 3 × H × W`` (channels third from last).
    """
    if tensor.ndim < 3 or tensor.shape[-3] != 3:
        raise ValueError(f"denormalize: expected a tensor of shape (..., 3, H, W), got {tuple(tensor.shape)}")
    mean = torch.tensor(IMAGENET_MEAN, dtype=tensor.dtype, device=tensor.device).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=tensor.dtype, device=tensor.device).view(3, 1, 1)
    return (tensor * std + mean).clamp(0.0, 1.0)
