"""Distributed training on PyTorch's own engine (torchrun + DistributedDataParallel).

``torchrun --nproc_per_node=N -m dmlstudy train ...`` sets RANK/WORLD_SIZE/LOCAL_RANK; :func:`setup` joins
the process group (nccl on GPU, gloo on CPU). Pair-based losses need the *global* batch, so methods call
:func:`gather_with_grad` on their embeddings before building similarity matrices: an all-gather whose
backward sums the gradients over ranks. Every rank then computes the same global loss L; the gradient a
rank receives for its own samples is W·∂L/∂(its part), and DDP's average over W ranks gives exactly ∂L/∂θ of
one process with the whole batch (tested in ``tests/test_distributed.py``).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main_process() -> bool:
    return rank() == 0


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1


def setup(device: str = "auto") -> torch.device:
    """Join the process group when launched by torchrun; return this process's device."""
    use_cuda = torch.cuda.is_available() and device in ("auto", "cuda")
    if launched_by_torchrun() and not is_distributed():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    if use_cuda:
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu") if device == "auto" else torch.device(device)


class _GatherWithGrad(torch.autograd.Function):
    """All-gather along dim 0; backward sums the incoming gradients over ranks and returns this rank's slice."""

    @staticmethod
    def forward(context, tensor: torch.Tensor) -> torch.Tensor:
        context.rows = tensor.shape[0]
        parts = [torch.empty_like(tensor) for _ in range(world_size())]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(context, gradient: torch.Tensor) -> torch.Tensor:
        gradient = gradient.contiguous()
        dist.all_reduce(gradient, op=dist.ReduceOp.SUM)
        start = rank() * context.rows
        return gradient[start : start + context.rows]


def gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` (equal size on every rank) from all ranks along dim 0 in rank order, keeping the
    autograd graph; the identity in a single process."""
    if not is_distributed() or world_size() == 1:
        return tensor
    return _GatherWithGrad.apply(tensor)


def gather_without_grad(tensor: torch.Tensor) -> torch.Tensor:
    """All-gather for labels and evaluation embeddings (no gradient); the identity in a single process."""
    if not is_distributed() or world_size() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim=0)
