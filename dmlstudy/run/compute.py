"""Where and how a run computes: its device (:func:`resolve_device`), the autocast dtype of its training steps
and test embeddings (:func:`autocast_dtype`, :func:`autocast_context`), and its training step as a module,
wrapped for DistributedDataParallel under torchrun and prepared for the compute fast path (:func:`training_step`)."""

from __future__ import annotations

import os
from typing import Protocol

import torch
from torch import nn

from dmlstudy import distributed
from dmlstudy.methods import Method


class ComputeConfig(Protocol):
    """The fields of a run's config (:class:`dmlstudy.run.train.TrainConfig`, which describes them) that set how it
    computes."""

    autocast: str
    sync_bn: bool
    channels_last: bool
    compile: bool


def is_device_name(name: str) -> bool:
    """Whether :func:`resolve_device` understands ``name``: auto, cpu, cuda or cuda:<i>."""
    return name in ("auto", "cpu", "cuda") or name.startswith("cuda:")


def resolve_device(name: str) -> torch.device:
    """``auto``: the device the engine assigned to this worker process (``DMLSTUDY_DEVICE``, e.g. ``cuda:1``
    on a multi-GPU machine, see :mod:`dmlstudy.study.engine`), else CUDA when present, else the CPU."""
    if name == "auto":
        name = os.environ.get("DMLSTUDY_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available on this machine")
    return torch.device(name)


def autocast_dtype(config: ComputeConfig, device: torch.device) -> torch.dtype | None:
    """bfloat16 when ``autocast`` is bf16, or auto on CUDA (on CPUs without bf16 units it is ~11× slower); else None."""
    if config.autocast == "bf16" or (config.autocast == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def autocast_context(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    """Autocast to ``dtype`` on ``device``'s type (:func:`autocast_dtype`), or float32 when ``dtype`` is None: the
    one precision context of training steps and of every test embedding (a run's, and DIML's grid embeddings)."""
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def training_step(config: ComputeConfig, method: Method, device: torch.device) -> nn.Module:
    """``method.loss`` as a module: wrapped in DistributedDataParallel under torchrun (SyncBatchNorm with
    ``sync_bn``), then prepared for the compute fast path (:func:`prepare_compute`)."""
    step = _LossStep(method)
    if distributed.world_size() > 1:
        if config.sync_bn:
            step = nn.SyncBatchNorm.convert_sync_batchnorm(step)
        step = nn.parallel.DistributedDataParallel(step, find_unused_parameters=True)
    return prepare_compute(config, method, step, device)


class _LossStep(nn.Module):
    """``forward(images, labels) = method.loss(images, labels)``, so DistributedDataParallel (which hooks a
    module's forward) can wrap a method's training loss."""

    def __init__(self, method: Method) -> None:
        super().__init__()
        self.method = method

    def forward(self, images: torch.Tensor, labels: torch.Tensor):
        return self.method.loss(images, labels)


def prepare_compute(config: ComputeConfig, method: Method, step: nn.Module, device: torch.device) -> nn.Module:
    """The compute fast path: channels_last weights, cuDNN autotuning on CUDA, and ``torch.compile`` of the
    training step when ``config.compile`` (measured in ``benchmarks/README.md``: on this project's CPUs its
    compile time exceeds what it saves in a study-sized run). Returns the step to call."""
    if config.channels_last:
        method.to(memory_format=torch.channels_last)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    return torch.compile(step) if config.compile else step
