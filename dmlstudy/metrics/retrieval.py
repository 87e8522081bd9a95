"""Retrieval metrics from cosine nearest neighbours: Recall@K, P@1, R-Precision and MAP@R.

For a query q with neighbours ranked 1, 2, … and rel_j = 1 if neighbour j has q's class:

* Recall@K = 1 if some rel_j = 1 with j ≤ K, else 0 (Song et al., "Deep Metric Learning via Lifted
  Structured Feature Embedding", CVPR 2016, the DML protocol's recall@K); P@1 = rel_1 = Recall@1.
* RP_q = (1/R_q) Σ_{j ≤ R_q} rel_j and MAP@R_q = (1/R_q) Σ_{j ≤ R_q} P@j · rel_j with P@j = (1/j) Σ_{i ≤ j} rel_i
  (Musgrave, Belongie & Lim, "A Metric Learning Reality Check", ECCV 2020, the definitions of R-Precision
  and MAP@R).

``R_q`` is the number of gallery items sharing the query's class, the query itself excluded (the convention
of pytorch-metric-learning's ``AccuracyCalculator``; DIML's evaluation code counts the query, so its RP and
MAP@R are not comparable with these). Queries with ``R_q = 0`` cannot retrieve anything relevant and are
skipped by *every* metric (Recall@K included, so that P@1 = Recall@1 always; the standard benchmarks have no
such queries). Each metric is the mean over the remaining queries, a Python float in [0, 1].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .inputs import (
    ArrayLike,
    as_k,
    as_ks,
    as_labels,
    as_query_gallery,
    check_label_kinds,
    positive_int,
    to_numpy,
)
from .neighbours import DEFAULT_CHUNK_SIZE, index_parameters, n_retrievable, search_in_chunks

DEFAULT_KS: tuple[int, ...] = (1, 2, 4, 8)


def relevant_counts(query_labels: ArrayLike, gallery_labels: ArrayLike | None = None) -> np.ndarray:
    """``R_q`` per query: gallery items of the query's class, the query itself excluded (int64, length Q).

    ``gallery_labels=None`` is the all-vs-all mode: ``R_q`` = (size of the query's class) − 1.
    """
    q_labels = as_labels(query_labels, name="query_labels")
    if gallery_labels is None:
        _, inverse, counts = np.unique(q_labels, return_inverse=True, return_counts=True)
        return (counts[inverse.reshape(-1)] - 1).astype(np.int64)
    g_labels = as_labels(gallery_labels, name="gallery_labels")
    check_label_kinds(q_labels, g_labels)
    classes, counts = np.unique(g_labels, return_counts=True)
    if len(classes) == 0:
        return np.zeros(len(q_labels), dtype=np.int64)
    pos = np.minimum(np.searchsorted(classes, q_labels), len(classes) - 1)
    return np.where(classes[pos] == q_labels, counts[pos], 0).astype(np.int64)


def _hits(idx: np.ndarray, target_labels: np.ndarray, query_labels: np.ndarray) -> np.ndarray:
    """``hits[i, j]``: neighbour j of query i exists (index ≥ 0) and has the query's class."""
    present = idx >= 0
    return present & (target_labels[np.where(present, idx, 0)] == query_labels[:, None])


def _per_query_stats(
    hits: np.ndarray, r: np.ndarray, *, with_r: bool
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Per query: rank of the first hit (k if none), and RP_q and AP@R_q (module docstring) if ``with_r``.

    ``hits`` is the n × k relevance matrix rel, ``r`` holds R_q > 0 (k ≥ max R_q for exact RP and AP@R).
    """
    k = hits.shape[1]
    first_hit = np.where(hits.any(axis=1), hits.argmax(axis=1), k)
    if not with_r:
        return first_hit, None, None
    rel = hits & (np.arange(k)[None, :] < r[:, None])  # n × k, hits within the first R_q ranks
    r_float = r.astype(np.float64)
    rp = rel.sum(axis=1) / r_float
    precision_at_j = np.cumsum(rel, axis=1) / np.arange(1, k + 1, dtype=np.float64)  # n × k
    ap = np.einsum("nk,nk->n", precision_at_j, rel.astype(np.float64)) / r_float
    return first_hit, rp, ap


def _summarize(
    first_hit: np.ndarray, rp: np.ndarray | None, ap: np.ndarray | None, *, ks: Sequence[int]
) -> dict[str, float]:
    """Means over the valid queries: ``R@K`` for each K, ``P@1``, and ``RP``/``MAP@R`` when computed."""
    out = {f"R@{k}": float(np.mean(first_hit < k)) for k in ks}
    out["P@1"] = float(np.mean(first_hit < 1))
    if rp is not None and ap is not None:
        out["RP"] = float(np.mean(rp))
        out["MAP@R"] = float(np.mean(ap))
    return out


def _valid_queries(r: np.ndarray) -> np.ndarray:
    valid = r > 0
    if not valid.any():
        raise ValueError(
            "labels: expected at least one query whose class has another item in the gallery (R_q > 0); none has"
        )
    return valid


def _prepare_sets(
    embeddings: ArrayLike, labels: ArrayLike, gallery: ArrayLike | None, gallery_labels: ArrayLike | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Validated, L2-normalised (queries, query labels, gallery, gallery labels); gallery None = all vs all."""
    if (gallery is None) != (gallery_labels is None):
        raise ValueError("gallery and gallery_labels: expected both (query → gallery mode) or neither (all vs all)")
    queries, gallery_arr = as_query_gallery(embeddings, gallery, query_name="embeddings")
    query_labels = as_labels(labels, n=len(queries), name="labels")
    if gallery_arr is None:
        return queries, query_labels, None, None
    gallery_labels_arr = as_labels(gallery_labels, n=len(gallery_arr), name="gallery_labels")
    check_label_kinds(query_labels, gallery_labels_arr)
    return queries, query_labels, gallery_arr, gallery_labels_arr


def _retrieval(
    embeddings: ArrayLike,
    labels: ArrayLike,
    gallery: ArrayLike | None,
    gallery_labels: ArrayLike | None,
    *,
    ks: Sequence[int],
    with_r: bool,
    chunk_size: int,
    index: str,
    index_params: Mapping[str, int | None] | None,
    use_gpu: bool | None,
) -> dict[str, float]:
    """Validate, then run ONE chunked neighbour search with k = max(max ks, max R_q if ``with_r``) and compute
    every metric from it. With an approximate index, a missing neighbour (index −1) counts as a miss."""
    params = index_parameters(index, index_params)
    queries, query_labels, gallery_arr, gallery_labels_arr = _prepare_sets(embeddings, labels, gallery, gallery_labels)
    n_items = n_retrievable(len(queries), gallery_arr)
    ks = as_ks(ks, n_gallery=n_items)
    chunk_size = positive_int(chunk_size, name="chunk_size")
    target_labels = query_labels if gallery_labels_arr is None else gallery_labels_arr
    r = relevant_counts(query_labels, gallery_labels_arr)
    valid = _valid_queries(r)
    k = as_k(max(max(ks), int(r.max()) if with_r else 1), n_retrievable=n_items)
    first_hit = np.empty(len(queries), dtype=np.int64)
    rp = np.empty(len(queries), dtype=np.float64) if with_r else None
    ap = np.empty(len(queries), dtype=np.float64) if with_r else None
    chunks = search_in_chunks(
        queries, gallery_arr, k=k, chunk_size=chunk_size, index=index, params=params, use_gpu=use_gpu
    )
    for start, idx, _ in chunks:
        stop = start + len(idx)
        hits = _hits(idx, target_labels, query_labels[start:stop])  # chunk × k
        r_chunk = np.maximum(r[start:stop], 1)  # R_q = 0 rows are dropped below; avoid 0-division here
        first_hit[start:stop], p, a = _per_query_stats(hits, r_chunk, with_r=with_r)
        if with_r:
            rp[start:stop], ap[start:stop] = p, a
    return _summarize(first_hit[valid], None if rp is None else rp[valid], None if ap is None else ap[valid], ks=ks)


def retrieval_metrics(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    gallery: ArrayLike | None = None,
    gallery_labels: ArrayLike | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    index: str = "exact",
    index_params: Mapping[str, int | None] | None = None,
    use_gpu: bool | None = None,
) -> dict[str, float]:
    """Recall@K, P@1, R-Precision and MAP@R (module docstring) from ONE neighbour search with
    k = max(max ks, max R_q). For a single metric, index the result (``["MAP@R"]``): it costs the same.

    Args:
        embeddings, labels: the queries (and the gallery too in all-vs-all mode).
        ks: K values for Recall@K (non-empty, each ≤ the number of retrievable items).
        gallery, gallery_labels: a separate gallery (query → gallery mode), or None for all vs all.
        chunk_size: queries per faiss search call.
        index, index_params, use_gpu: the search index (default exact; ``"ivf"``/``"hnsw"`` approximate
            the neighbour lists and hence every metric), see :func:`~dmlstudy.metrics.nearest_neighbors`.

    Returns:
        ``{"R@1": …, "R@2": …, …, "P@1": …, "RP": …, "MAP@R": …}`` as fractions in [0, 1].
    """
    return _retrieval(
        embeddings,
        labels,
        gallery,
        gallery_labels,
        ks=ks,
        with_r=True,
        chunk_size=chunk_size,
        index=index,
        index_params=index_params,
        use_gpu=use_gpu,
    )


def recall_at_k(
    embeddings: ArrayLike,
    labels: ArrayLike,
    ks: Sequence[int] = DEFAULT_KS,
    *,
    gallery: ArrayLike | None = None,
    gallery_labels: ArrayLike | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    index: str = "exact",
    index_params: Mapping[str, int | None] | None = None,
    use_gpu: bool | None = None,
) -> dict[int, float]:
    """``{K: Recall@K}``, searching only max(ks) neighbours (cheaper than :func:`retrieval_metrics` when
    classes are large). Same modes, conventions and index options as :func:`retrieval_metrics`."""
    out = _retrieval(
        embeddings,
        labels,
        gallery,
        gallery_labels,
        ks=ks,
        with_r=False,
        chunk_size=chunk_size,
        index=index,
        index_params=index_params,
        use_gpu=use_gpu,
    )
    return {int(key[2:]): value for key, value in out.items() if key.startswith("R@")}


def class_subset_recall(
    embeddings: ArrayLike, labels: ArrayLike, *, classes: int, k: int = 1, draws: int = 20, seed: int = 0
) -> np.ndarray:
    """Recall@``k`` on ``draws`` random subsets of ``classes`` of the classes, one value per draw: query = gallery
    = every item of the drawn classes, each query excluding itself (:func:`recall_at_k`).

    Recall@K falls as a gallery holds more classes (more near neighbours of other classes): this reads a split at
    the class count of a smaller one, e.g. the test classes at the validation fold's count, so that the two are
    compared on the same scale. Draw i takes ``classes`` distinct labels with ``numpy.random.default_rng([seed,
    i])``, uniformly without replacement."""
    labels = as_labels(labels, name="labels")
    embeddings = to_numpy(embeddings)
    present = np.unique(labels)
    classes, draws = positive_int(classes, name="classes"), positive_int(draws, name="draws")
    if classes > len(present):
        raise ValueError(f"parameter 'classes' ({classes}) exceeds the {len(present)} classes in 'labels'")
    values = np.empty(draws)
    for i in range(draws):
        drawn = np.random.default_rng([seed, i]).choice(present, size=classes, replace=False)
        kept = np.isin(labels, drawn)
        values[i] = recall_at_k(embeddings[kept], labels[kept], ks=(k,))[k]
    return values


def retrieval_metrics_from_neighbors(
    neighbor_indices: ArrayLike,
    query_labels: ArrayLike,
    *,
    gallery_labels: ArrayLike | None = None,
    ks: Sequence[int] = DEFAULT_KS,
) -> dict[str, float]:
    """R@K, P@1, RP and MAP@R from given (e.g. re-ranked) neighbour lists, same definitions as
    :func:`retrieval_metrics`.

    Args:
        neighbor_indices: Q × k gallery indices, best first. In all-vs-all mode (``gallery_labels=None``)
            they index the query set and must not contain the query itself. −1 marks a missing
            neighbour (as returned by approximate indexes) and counts as a miss.
        query_labels: Q labels.
        gallery_labels: G labels, or None for all-vs-all.
        ks: the K values of Recall@K; k must be ≥ max(max ks, max R_q) so RP and MAP@R are exact.

    Returns:
        ``{"R@1": …, …, "P@1": …, "RP": …, "MAP@R": …}``.
    """
    idx = to_numpy(neighbor_indices)
    if idx.ndim != 2 or idx.dtype.kind not in "iu":
        raise ValueError(
            f"neighbor_indices: expected a 2-D integer array Q × k, got shape {idx.shape} and dtype {idx.dtype}"
        )
    q_labels = as_labels(query_labels, n=len(idx), name="query_labels")
    target = q_labels if gallery_labels is None else as_labels(gallery_labels, name="gallery_labels")
    if idx.size and (idx.min() < -1 or idx.max() >= len(target)):
        raise ValueError(
            f"neighbor_indices: expected indices in [0, {len(target)}) or −1 (missing), got [{idx.min()}, {idx.max()}]"
        )
    ks = as_ks(ks, n_gallery=idx.shape[1])
    r = relevant_counts(q_labels, None if gallery_labels is None else target)
    if gallery_labels is None and (idx == np.arange(len(idx))[:, None]).any():
        raise ValueError("neighbor_indices: all-vs-all mode expects each query to be excluded from its own list")
    valid = _valid_queries(r)
    if idx.shape[1] < r.max():
        raise ValueError(
            f"neighbor_indices: expected at least max R_q = {r.max()} neighbours per query for RP/MAP@R, "
            f"got {idx.shape[1]}"
        )
    first_hit, rp, ap = _per_query_stats(_hits(idx, target, q_labels), np.maximum(r, 1), with_r=True)
    return _summarize(first_hit[valid], rp[valid], ap[valid], ks=ks)
