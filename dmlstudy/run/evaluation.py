"""Evaluation of a model on a run's evaluation splits: its inference embeddings (:func:`embed`) and the
retrieval, clustering and geometry metrics computed from them (:func:`evaluate`, :mod:`dmlstudy.metrics`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from dmlstudy import distributed
from dmlstudy import metrics as metric_functions
from dmlstudy.data.loading import evaluation_batches
from dmlstudy.methods import EVAL_BATCH_SIZE, Method
from dmlstudy.progress_bars import transient_bar
from dmlstudy.run.compute import autocast_context


@torch.no_grad()
def embed(
    method: Method,
    dataset,
    *,
    batch_size: int = EVAL_BATCH_SIZE,
    device: torch.device | str = "cpu",
    num_workers: int = 0,
    autocast: torch.dtype | None = None,
    channels_last: bool = False,
    progress: bool = False,
) -> np.ndarray:
    """Inference embeddings (``N × d``, float32) of a dataset, in dataset order.

    Tensor-pipeline splits are read as slices of their cropped tensor (large batches, no per-item work).
    Under torchrun each rank embeds one contiguous shard and the shards are gathered once. ``progress``: a
    tqdm bar over the batches (a large gallery takes minutes to embed).
    """
    device = torch.device(device)
    was_training = method.training
    method.eval()
    shard = np.array_split(np.arange(len(dataset)), distributed.world_size())[distributed.rank()]
    size = int(np.ceil(len(dataset) / distributed.world_size()))
    chunks = []
    with autocast_context(device, autocast):
        for images in transient_bar(
            evaluation_batches(
                dataset,
                shard,
                batch_size=batch_size,
                device=device,
                num_workers=num_workers,
                channels_last=channels_last,
            ),
            desc=f"embedding {len(shard)} images",
            total=-(-len(shard) // batch_size),
            unit="batch",
            disable=not progress,
        ):
            chunks.append(method(images).float())
    local = torch.cat(chunks) if chunks else torch.zeros(0, method.embedding_dim, device=device)
    method.train(was_training)
    if distributed.world_size() == 1:
        return local.cpu().numpy()
    padded = torch.cat([local, local.new_zeros(size - len(local), local.shape[1])])
    gathered = distributed.gather_without_grad(padded).reshape(distributed.world_size(), size, -1)
    return (
        torch.cat(
            [
                part[: len(rows)]
                for part, rows in zip(gathered, np.array_split(np.arange(len(dataset)), distributed.world_size()))
            ]
        )
        .cpu()
        .numpy()
    )


def evaluate(
    method: Method,
    datasets: Mapping[str, Any],
    *,
    batch_size: int,
    device: torch.device,
    num_workers: int = 0,
    autocast: torch.dtype | None = None,
    channels_last: bool = False,
    progress: bool = False,
    full: bool = True,
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Metrics of the spine on the evaluation splits, and the embeddings they were computed from
    (``progress``: a bar over each split's embedding batches). ``full=False`` (the per-epoch validation
    evaluations) computes the retrieval metrics only: no k-means NMI, no geometry."""
    options = {
        "batch_size": batch_size,
        "device": device,
        "num_workers": num_workers,
        "autocast": autocast,
        "channels_last": channels_last,
        "progress": progress,
    }
    query = embed(method, datasets["query"], **options)
    arrays = {"embeddings": query, "labels": np.asarray(datasets["query"].labels)}
    gallery_kwargs = {}
    if datasets.get("gallery") is not None:
        gallery = embed(method, datasets["gallery"], **options)
        arrays.update(gallery_embeddings=gallery, gallery_labels=np.asarray(datasets["gallery"].labels))
        gallery_kwargs = {"gallery": gallery, "gallery_labels": arrays["gallery_labels"]}
    values = metric_functions.evaluate(
        query, arrays["labels"], ks=datasets["recall_ks"], with_nmi=full, with_geometry=full, **gallery_kwargs
    )
    return {key: float(value) for key, value in values.items()}, arrays
