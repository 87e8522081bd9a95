"""DIML's test-time re-ranking (supplement A.2 of Zhao et al., ICCV 2021): the cosine top-K candidates of
each query re-ranked by ``cos + s_struct``.

Works on embeddings only, so on *any* model whose grid embeddings can be computed
(:func:`dmlstudy.methods.diml.embed_grid_dataset`: a ``backbone`` and a linear ``embedding`` layer, the plain
baseline included, its embedding layer applied per cell). The cosine lists come from
:func:`dmlstudy.metrics.nearest_neighbors`, the structural similarities of their first K candidates from
:func:`dmlstudy.structural.transport.candidate_structural_similarity` (a chunk of queries × all their K candidates per
Sinkhorn call); :func:`rerank_top_k` re-orders the lists and :func:`reranked_retrieval_metrics` scores them for
several K at once; :func:`rerank_cost` times the structural similarities per query.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dmlstudy import metrics as metric_functions
from dmlstudy.structural.transport import TransportOptions, candidate_structural_similarity

DEFAULT_TOP_K = 100


def rerank_top_k(indices: np.ndarray, cosine: np.ndarray, structural: np.ndarray, *, top_k: int) -> np.ndarray:
    """Re-rank the first ``top_k`` columns of cosine neighbour lists by ``cos + s_struct`` (supplement A.2).

    A true top-K re-rank: positions past K keep their cosine order, nothing is duplicated or dropped, and
    ties keep the cosine order (stable sort). ``top_k = 0`` returns the cosine ranking.

    Args:
        indices: ``Q × n`` gallery indices sorted by cosine similarity (best first).
        cosine: ``Q × n`` their cosine similarities.
        structural: ``Q × K'`` structural similarities of the first K' ≥ top_k columns.
    """
    indices, cosine, structural = np.asarray(indices), np.asarray(cosine), np.asarray(structural)
    if indices.shape != cosine.shape or indices.ndim != 2:
        raise ValueError(
            f"rerank_top_k: expected indices and cosine of one shape Q × n, got {indices.shape} and {cosine.shape}"
        )
    if (
        top_k < 0
        or top_k > indices.shape[1]
        or (top_k and (structural.ndim != 2 or structural.shape[0] != len(indices) or structural.shape[1] < top_k))
    ):
        raise ValueError(
            f"rerank_top_k: top_k={top_k} needs 0 ≤ top_k ≤ n = {indices.shape[1]} and structural Q × ≥ top_k, got {structural.shape}"
        )
    reranked = indices.copy()
    if top_k == 0:
        return reranked
    score = cosine[:, :top_k].astype(np.float64) + structural[:, :top_k]
    order = np.argsort(-score, axis=1, kind="stable")
    reranked[:, :top_k] = np.take_along_axis(indices[:, :top_k], order, axis=1)
    return reranked


@dataclass
class Reranking:
    """Re-ranked neighbour lists ``Q × n`` and what they came from: the cosine lists and the structural
    similarities of their first K columns."""

    indices: np.ndarray
    cosine_indices: np.ndarray
    cosine: np.ndarray
    structural: np.ndarray
    top_k: int


def diml_rerank(
    global_queries: Any,
    local_queries: Any,
    global_gallery: Any | None = None,
    local_gallery: Any | None = None,
    *,
    top_k: int = DEFAULT_TOP_K,
    num_neighbors: int | None = None,
    options: TransportOptions | None = None,
    query_chunk: int | None = None,
    device: torch.device | str | None = None,
) -> Reranking:
    """Cosine top-``num_neighbors`` lists (faiss, :func:`dmlstudy.metrics.nearest_neighbors`) whose first
    ``top_k`` positions are re-ranked by ``cos + s_struct``. Gallery None = all vs all (query excluded)."""
    all_vs_all = global_gallery is None
    if all_vs_all != (local_gallery is None):
        raise ValueError(
            "diml_rerank: give both global_gallery and local_gallery (query → gallery) or neither (all vs all)"
        )
    n = max(num_neighbors or top_k, top_k, 1)
    indices, cosine = metric_functions.nearest_neighbors(global_queries, global_gallery, k=n)
    structural = np.zeros((len(indices), top_k), dtype=np.float32)
    if top_k:
        structural = candidate_structural_similarity(
            global_queries,
            local_queries,
            global_queries if all_vs_all else global_gallery,
            local_queries if all_vs_all else local_gallery,
            indices[:, :top_k],
            options=options,
            query_chunk=query_chunk,
            device=device,
        )
    return Reranking(rerank_top_k(indices, cosine, structural, top_k=top_k), indices, cosine, structural, top_k)


def reranked_retrieval_metrics(
    global_queries: Any,
    local_queries: Any,
    labels: Any,
    *,
    top_ks: Sequence[int] = (0, DEFAULT_TOP_K),
    global_gallery: Any | None = None,
    local_gallery: Any | None = None,
    gallery_labels: Any | None = None,
    ks: Sequence[int] = (1,),
    options: TransportOptions | None = None,
    query_chunk: int | None = None,
    device: torch.device | str | None = None,
) -> dict[int, dict[str, float]]:
    """P@1, RP, MAP@R (and R@K for ``ks``) after re-ranking the top K, for every K of ``top_ks``.

    The structural similarities are computed once for the largest K and reused for the smaller ones (the
    similarity of a pair does not depend on K). K = 0 is the plain cosine ranking. Lists are long enough
    for exact RP/MAP@R: ``n = max(max R_q, max K, max ks)``. Metrics as :mod:`dmlstudy.metrics`
    (R_q excludes the query itself; DIML's own evaluation counts it).
    """
    top_ks = sorted({int(k) for k in top_ks})
    if not top_ks or top_ks[0] < 0:
        raise ValueError(f"top_ks: expected non-negative integers, got {top_ks}")
    relevant = metric_functions.relevant_counts(
        _numpy(labels), None if gallery_labels is None else _numpy(gallery_labels)
    )
    n = max(int(relevant.max()), top_ks[-1], max(ks), 1)
    reranking = diml_rerank(
        global_queries,
        local_queries,
        global_gallery,
        local_gallery,
        top_k=top_ks[-1],
        num_neighbors=n,
        options=options,
        query_chunk=query_chunk,
        device=device,
    )
    results = {}
    for top_k in top_ks:
        ranked = rerank_top_k(reranking.cosine_indices, reranking.cosine, reranking.structural, top_k=top_k)
        results[top_k] = metric_functions.retrieval_metrics_from_neighbors(
            ranked, _numpy(labels), gallery_labels=None if gallery_labels is None else _numpy(gallery_labels), ks=ks
        )
    return results


def rerank_cost(
    query: Any,
    *,
    top_ks: Sequence[int],
    grid_sizes: Sequence[int],
    queries: int = 64,
    options: TransportOptions | None = None,
) -> list[dict[str, Any]]:
    """Measured milliseconds per query of the structural similarities of its top-K candidates (the re-ranking's
    cost beyond the cosine search), one row per (K, G), on the first ``queries`` queries of ``query`` (a test set's
    grid embeddings, :class:`dmlstudy.methods.diml.GridEmbeddings`) searched among all of them."""
    n = min(queries, len(query.global_))
    rows = []
    for top_k in top_ks:
        candidates, _ = metric_functions.nearest_neighbors(
            query.global_[:n], query.global_, k=min(top_k + 1, len(query.global_) - 1)
        )
        candidates = np.stack([row[row != q][:top_k] for q, row in enumerate(candidates)])
        for grid in [g for g in grid_sizes if g in query.local]:
            local = query.local[grid]
            started = time.perf_counter()
            candidate_structural_similarity(
                query.global_[:n], local[:n], query.global_, local, candidates, options=options
            )
            seconds = time.perf_counter() - started
            rows.append({"K": top_k, "G": grid, "pairs": candidates.size, "ms per query": 1000 * seconds / n})
    return rows


def _numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
