"""Evaluation batches of any split, whichever pipeline holds it: one path for every embedding pass.

A tensor-pipeline split (:class:`~dmlstudy.data.tensor_cache.EvaluationImages`, possibly under
``Subset``) is read as slices of its cropped tensor; a file split through a ``DataLoader`` with
:func:`resolve_num_workers` workers (none when its items are memoized in this process).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from dmlstudy.data.base import ImageListDataset
from dmlstudy.data.tensor_cache import EvaluationImages


def resolve_num_workers(num_workers: int) -> int:
    """DataLoader workers of the file pipeline: ``num_workers``, or min(8, usable cores) for -1."""
    if num_workers >= 0:
        return num_workers
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(8, cores)


def in_memory_format(images: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """``images`` (N × C × H × W) in the channels_last memory format when ``channels_last``, else as they are: the
    one conversion of every batch a run trains or evaluates on (a run that trains in it evaluates in it)."""
    return images.contiguous(memory_format=torch.channels_last) if channels_last and images.ndim == 4 else images


def evaluation_batches(
    dataset,
    indices: np.ndarray,
    *,
    batch_size: int,
    device: torch.device | str,
    num_workers: int = 0,
    channels_last: bool = False,
) -> Iterator[torch.Tensor]:
    """Image batches of ``dataset[indices]`` on ``device``, in order: slices of the cropped tensor, or a DataLoader
    over files; in the memory format :func:`in_memory_format` gives for ``channels_last``."""
    device, indices = torch.device(device), np.asarray(indices)
    base, rows = dataset, indices
    while isinstance(base, Subset):
        rows, base = np.asarray(base.indices)[rows], base.dataset
    if isinstance(base, EvaluationImages):
        for start in range(0, len(rows), batch_size):
            rows_here = torch.as_tensor(rows[start : start + batch_size], device=base.crops.device)
            yield in_memory_format(base.batch(rows_here, device), channels_last)
        return
    memoized = isinstance(base, ImageListDataset) and base.is_memoized
    loader = DataLoader(
        Subset(dataset, indices.tolist()),
        batch_size=batch_size,
        shuffle=False,
        num_workers=0 if memoized else resolve_num_workers(num_workers),
        pin_memory=device.type == "cuda",
    )
    for images, _ in loader:
        yield in_memory_format(images.to(device, non_blocking=True), channels_last)
