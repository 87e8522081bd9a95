"""The train and test transforms of :mod:`dmlstudy.data.transforms`, applied to whole uint8 batches on the
training device with **per-sample** random parameters.

Train (:func:`augment_batch`): a random resized crop with torchvision's sampling rule (area fraction in
:data:`~dmlstudy.data.transforms.CROP_SCALE`, log-uniform aspect ratio in
:data:`~dmlstudy.data.transforms.CROP_RATIO`, up to 10 attempts, then the centre fallback), an optional
horizontal flip (only for flip-invariant datasets), ImageNet normalisation. Every image gets its own crop
box and flip, expressed as one affine matrix θ per image, and the whole batch is resampled by a single
sampling grid + ``grid_sample`` call (bilinear, ``align_corners=False``: output pixel centres map to the
same input coordinates as ``torchvision``'s ``resized_crop``). Decision, measured in ``benchmarks/README.md``
(section "Training input pipeline"): this is faster than ``kornia.augmentation.RandomResizedCrop`` on our
batches and, unlike kornia's sampler (one draw from the global generator per batch), its parameters are a
pure function of the dataset index, which the determinism contract needs.
No antialiasing: the embedded datasets are stored at or below the study's ``image_size``, so every crop is
magnified or kept 1:1, and images of different sizes are cached as squares of side round(``image_size`` · 8/7)
(:mod:`dmlstudy.data.tensor_cache`), so no crop shrinks by more than 8/7; a crop shrunk by more than 2× (a
stored resolution far above ``image_size``) would alias where torchvision's per-item path low-pass filters first.

Per-sample parameters (:func:`sample_uniforms`): uniform numbers ``u[k]`` of dataset item ``index`` in
``epoch`` are a counter-based hash, ``splitmix64(key(seed, epoch, index) + (k + 1)·γ)``, so they depend on
``(seed, epoch, index, k)`` only: not on the batch an item lands in, its position there, the number of
DataLoader workers (there are none on this path) or how a global batch is split across ranks.

Test (:func:`evaluation_crop`): ``Resize(round(image_size · 8/7))`` of the shorter side (antialiased) then
``CenterCrop(image_size)``, run once per split on the cached uint8 tensor; batches are normalised as read.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF

from dmlstudy.data.transforms import (
    CROP_RATIO,
    CROP_SCALE,
    IMAGENET_MEAN,
    IMAGENET_STD,
    RESIZE_RATIO,
)

CROP_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries 10 boxes before its centre fallback
UNIFORMS_PER_SAMPLE = 2 * CROP_ATTEMPTS + 3  # (area, log-ratio) per attempt, top, left, flip

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser (Steele et al. 2014), element-wise on uint64 (arithmetic wraps mod 2⁶⁴)."""
    z = values.astype(np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def sample_uniforms(seed: int, epoch: int, indices, count: int = UNIFORMS_PER_SAMPLE) -> np.ndarray:
    """``len(indices) × count`` float64 uniforms in [0, 1); row ``r`` depends only on ``(seed, epoch, indices[r])``.

    key = splitmix64(splitmix64(splitmix64(seed) ⊕ epoch) ⊕ index); ``u[k] = splitmix64(key + (k+1)·γ) >> 11 · 2⁻⁵³``.
    """
    index = np.asarray(indices, dtype=np.int64).reshape(-1)
    if seed < 0 or epoch < 0 or (index < 0).any():
        raise ValueError(
            f"sample_uniforms: seed, epoch and indices must be >= 0, got seed={seed}, epoch={epoch}, min index={index.min() if index.size else None}"
        )
    with np.errstate(over="ignore"):
        key = _splitmix64(_splitmix64(np.array([seed], dtype=np.uint64)) ^ np.uint64(epoch))
        key = _splitmix64(key ^ index.astype(np.uint64))
        counters = key[:, None] + np.arange(1, count + 1, dtype=np.uint64)[None, :] * _GOLDEN
        bits = _splitmix64(counters)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def random_resized_crop_boxes(
    uniforms: np.ndarray, height: int, width: int, *, scale=CROP_SCALE, ratio=CROP_RATIO
) -> np.ndarray:
    """Crop boxes ``B × 4`` (top, left, box height, box width; integers) by torchvision's rule, vectorised.

    Attempt a: area = H·W·U(scale), aspect = exp(U(log ratio)), w = round(√(area·aspect)), h = round(√(area/aspect));
    the first attempt with 0 < w ≤ W and 0 < h ≤ H wins, top = ⌊u·(H−h+1)⌋, left = ⌊u·(W−w+1)⌋. No winner:
    the largest centred box whose aspect lies in ``ratio``.
    """
    batch = len(uniforms)
    attempts = uniforms[:, : 2 * CROP_ATTEMPTS].reshape(batch, CROP_ATTEMPTS, 2)
    area = height * width * (scale[0] + (scale[1] - scale[0]) * attempts[..., 0])
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(log_low + (log_high - log_low) * attempts[..., 1])
    box_w = np.round(np.sqrt(area * aspect)).astype(np.int64)
    box_h = np.round(np.sqrt(area / aspect)).astype(np.int64)
    valid = (box_w > 0) & (box_w <= width) & (box_h > 0) & (box_h <= height)
    first = valid.argmax(axis=1)
    rows = np.arange(batch)
    h, w = box_h[rows, first], box_w[rows, first]
    found = valid.any(axis=1)
    in_ratio = width / height
    if in_ratio < min(ratio):
        fallback_w, fallback_h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        fallback_h, fallback_w = height, round(height * max(ratio))
    else:
        fallback_w, fallback_h = width, height
    h = np.where(found, h, fallback_h)
    w = np.where(found, w, fallback_w)
    top = np.where(found, np.floor(uniforms[:, -3] * (height - h + 1)), (height - h) // 2).astype(np.int64)
    left = np.where(found, np.floor(uniforms[:, -2] * (width - w + 1)), (width - w) // 2).astype(np.int64)
    return np.stack([top, left, h, w], axis=1)


def crop_thetas(boxes: np.ndarray, flips: np.ndarray, height: int, width: int) -> torch.Tensor:
    """``B × 2 × 3`` affine matrices for ``affine_grid(align_corners=False)`` that resample each box to the output.

    Output x_n ∈ [−1, 1] ↦ input x_n' = (w/W)·x_n + (2·left + w)/W − 1 (likewise y); a flip negates the x scale.
    """
    top, left, h, w = (torch.as_tensor(boxes[:, k], dtype=torch.float32) for k in range(4))
    sign = 1.0 - 2.0 * torch.as_tensor(flips, dtype=torch.float32)
    theta = torch.zeros(len(boxes), 2, 3)
    theta[:, 0, 0] = sign * w / width
    theta[:, 0, 2] = (2 * left + w) / width - 1
    theta[:, 1, 1] = h / height
    theta[:, 1, 2] = (2 * top + h) / height - 1
    return theta


def axis_aligned_grid(theta: torch.Tensor, size: int) -> torch.Tensor:
    """``F.affine_grid(theta, [B, C, size, size], align_corners=False)`` for θ without rotation or shear, built by
    broadcasting (x depends on the column only, y on the row only): ≈ 10× less CPU time than the batched matmul."""
    base = (torch.arange(size, device=theta.device, dtype=theta.dtype) * 2 + 1) / size - 1  # pixel centres in [−1, 1]
    x = theta[:, 0, 0, None] * base + theta[:, 0, 2, None]  # B × size
    y = theta[:, 1, 1, None] * base + theta[:, 1, 2, None]
    return torch.stack(torch.broadcast_tensors(x[:, None, :], y[:, :, None]), dim=-1)  # B × size × size × 2


def normalize_batch(images: torch.Tensor) -> torch.Tensor:
    """uint8 (or float in [0, 255]) ``B × 3 × H × W`` → float32 ``(x/255 − mean)/std`` with ImageNet statistics."""
    mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(1, 3, 1, 1) * 255.0
    std = torch.tensor(IMAGENET_STD, device=images.device).view(1, 3, 1, 1) * 255.0
    return (images.float() - mean) / std


def augment_batch(images: torch.Tensor, indices, *, seed: int, epoch: int, image_size: int, flip: bool) -> torch.Tensor:
    """Training views of a uint8 batch ``B × 3 × H × W`` (on any device) → normalised float32 ``B × 3 × s × s``.

    ``indices`` are the dataset indices of the rows (they, with ``seed`` and ``epoch``, fix every random choice).
    """
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"augment_batch: expected uint8 images of shape B × 3 × H × W, got {tuple(images.shape)}")
    height, width = images.shape[-2:]
    uniforms = sample_uniforms(seed, epoch, indices)
    boxes = random_resized_crop_boxes(uniforms, height, width)
    flips = (uniforms[:, -1] < 0.5) if flip else np.zeros(len(uniforms), dtype=bool)
    theta = crop_thetas(boxes, flips, height, width).to(images.device, non_blocking=True)
    grid = axis_aligned_grid(theta, image_size)
    cropped = F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return normalize_batch(cropped)


def evaluation_crop(
    images: torch.Tensor, image_size: int, *, resize_ratio: float = RESIZE_RATIO, chunk: int = 1024
) -> torch.Tensor:
    """Test geometry on uint8 ``N × 3 × H × W``: shorter side → ``round(image_size · resize_ratio)`` (antialiased), centre crop; uint8 out."""
    resized = round(image_size * resize_ratio)
    parts = [
        TF.center_crop(TF.resize(images[start : start + chunk], resized, antialias=True), image_size)
        for start in range(0, len(images), chunk)
    ]
    return torch.cat(parts) if parts else images.new_zeros(0, 3, image_size, image_size)
