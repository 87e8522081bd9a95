"""Retrieval, clustering and embedding-geometry metrics for deep metric learning.

Conventions shared by every function here:

* Embeddings are L2-normalised inside (unnormalised input is accepted; a zero row stays zero) and the
  similarity is the inner product, i.e. cosine similarity. Inputs may be numpy arrays, torch tensors
  (any device, gradients are detached) or nested sequences; they are converted to ``float32``.
* Exact nearest neighbours come from ``faiss.IndexFlatIP``, searched in chunks of ``chunk_size`` queries,
  so memory is ``O(chunk_size × k)`` on top of the embeddings: no N × N matrix is ever built. When faiss
  sees a GPU (``faiss.get_num_gpus() > 0``; never with the CPU-only build) the index moves to GPU 0.
* Galleries far beyond the benchmarks (millions): ``index="ivf"`` (``IndexIVFFlat``) or ``"hnsw"``
  (``IndexHNSWFlat``), both inner product, give *approximate* neighbour lists and hence approximate
  metrics (``benchmarks/results_ann.md`` measures the error). The default is ``"exact"``.
* NMI's k-means switches from scikit-learn to faiss above N · k = ``NMI_FAISS_MIN_WORK`` (SOP, In-Shop).
* Two retrieval modes. *All vs all* (``gallery=None``): every item queries all *other* items; the query
  is removed from its own result list by index, never by similarity, so exact duplicates of the query
  stay in the list. *Query → gallery* (In-Shop): separate sets, nothing removed.
* Neighbours with equal similarity are ordered by ascending gallery index, so rankings are deterministic.
* ``R_q`` is the number of gallery items sharing the query's class, the query itself excluded. Queries
  with ``R_q = 0`` cannot retrieve anything relevant and are skipped by *every* retrieval metric
  (Recall@K included, so that P@1 = Recall@1 always; the standard benchmarks have no such queries).
* All metrics are fractions in [0, 1], returned as Python floats.

Bad input (wrong shapes, mismatched lengths, non-finite embeddings, ``k`` larger than the gallery, an
empty K list) raises ``ValueError`` naming the argument and what was expected.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

ArrayLike = Any  # numpy array, torch tensor or nested sequence
_NORM_EPS = 1e-12
DEFAULT_KS: tuple[int, ...] = (1, 2, 4, 8)
DEFAULT_CHUNK_SIZE = 4096


# --------------------------------------------------------------------------------------------------
# input handling


def _to_numpy(x: ArrayLike) -> np.ndarray:
    """A numpy view/copy of ``x``; torch tensors are detached and moved to the CPU without importing torch."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.float()  # bfloat16/half have no (or a lossy) numpy counterpart
        x = x.numpy()
    return np.asarray(x)


def _as_embeddings(x: ArrayLike, *, name: str) -> np.ndarray:
    """``x`` as a C-contiguous float32 N × d array with N, d ≥ 1 and only finite values."""
    arr = _to_numpy(x)
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array of shape N × d, got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name}: expected at least one row and one column, got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{name}: expected real numbers, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    finite = np.isfinite(arr)
    if not finite.all():
        bad_rows = np.flatnonzero(~finite.all(axis=1))
        raise ValueError(
            f"{name}: expected finite values, found NaN/inf in {len(bad_rows)} row(s), first at row {bad_rows[0]}"
        )
    return arr


def _as_labels(y: ArrayLike, *, n: int, name: str) -> np.ndarray:
    """``y`` as a 1-D array of ``n`` class labels (integers or strings)."""
    arr = _to_numpy(y)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of class labels, got shape {arr.shape}")
    if len(arr) != n:
        raise ValueError(f"{name}: expected {n} labels (one per embedding row), got {len(arr)}")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ValueError(f"{name}: expected finite labels, found NaN/inf")
    if arr.dtype.kind not in "biufUS":
        raise ValueError(f"{name}: expected integer or string labels, got dtype {arr.dtype}")
    return arr


def _check_label_kinds(query_labels: np.ndarray, gallery_labels: np.ndarray) -> None:
    numeric = "biuf"
    if (query_labels.dtype.kind in numeric) != (gallery_labels.dtype.kind in numeric):
        raise ValueError(
            f"labels and gallery_labels: expected the same kind of label (both numeric or both strings), "
            f"got {query_labels.dtype} and {gallery_labels.dtype}"
        )


def _as_ks(ks: Iterable[int], *, n_gallery: int) -> tuple[int, ...]:
    """Sorted distinct K values, each an integer in [1, n_gallery]."""
    try:
        values = list(ks)
    except TypeError as error:
        raise ValueError(f"ks: expected a non-empty sequence of positive integers, got {ks!r}") from error
    if not values:
        raise ValueError("ks: expected a non-empty sequence of positive integers, got an empty one")
    for value in values:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"ks: expected positive integers, got {value!r} in {values!r}")
        if value > n_gallery:
            raise ValueError(f"ks: K={value} is larger than the {n_gallery} retrievable gallery items")
    return tuple(sorted({int(v) for v in values}))


def _as_chunk_size(chunk_size: int) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive integer, got {chunk_size!r}")
    return int(chunk_size)


def _prepare_sets(
    embeddings: ArrayLike, labels: ArrayLike, gallery: ArrayLike | None, gallery_labels: ArrayLike | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Validated, L2-normalised (queries, query labels, gallery, gallery labels); gallery None = all vs all."""
    queries = l2_normalize(embeddings)
    query_labels = _as_labels(labels, n=len(queries), name="labels")
    if (gallery is None) != (gallery_labels is None):
        raise ValueError("gallery and gallery_labels: expected both (query → gallery mode) or neither (all vs all)")
    if gallery is None:
        return queries, query_labels, None, None
    gallery_arr = _as_embeddings(gallery, name="gallery")
    if gallery_arr.shape[1] != queries.shape[1]:
        raise ValueError(
            f"gallery: expected embedding dimension {queries.shape[1]} (as in embeddings), got {gallery_arr.shape[1]}"
        )
    gallery_labels_arr = _as_labels(gallery_labels, n=len(gallery_arr), name="gallery_labels")
    _check_label_kinds(query_labels, gallery_labels_arr)
    return queries, query_labels, _normalize_rows(gallery_arr), gallery_labels_arr


def _n_retrievable(n_queries: int, gallery: np.ndarray | None) -> int:
    """Largest usable k: the gallery size, or N − 1 in all-vs-all mode (the query is excluded)."""
    return n_queries - 1 if gallery is None else len(gallery)


# --------------------------------------------------------------------------------------------------
# normalisation and neighbour search


def _normalize_rows(x: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm (norm floored at 1e-12, so zero rows stay zero); keeps the dtype."""
    norms = np.sqrt(np.einsum("nd,nd->n", x, x, dtype=np.float64))
    return (x / np.maximum(norms, _NORM_EPS)[:, None].astype(x.dtype)).astype(x.dtype, copy=False)


def l2_normalize(x: ArrayLike) -> np.ndarray:
    """Row-wise L2-normalised copy of an N × d array as float32 (norms computed in float64).

    Rows of norm zero stay zero (they then have similarity 0 to everything).
    """
    return np.ascontiguousarray(_normalize_rows(_as_embeddings(x, name="embeddings")))


def _drop_self(sims: np.ndarray, idx: np.ndarray, query_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Remove each query's own index from its (k+1)-long result row, giving k columns.

    If the query is not among its k+1 results (only possible when > k items tie with it), the last
    column is dropped instead: the remaining k are then still the k best items other than the query.
    """
    n, k_plus_one = idx.shape
    is_self = idx == query_ids[:, None]  # n × (k+1)
    is_self[~is_self.any(axis=1), -1] = True
    keep = ~is_self
    return sims[keep].reshape(n, k_plus_one - 1), idx[keep].reshape(n, k_plus_one - 1)


def _sort_ties_by_index(sims: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reorder each row by (similarity descending, index ascending); only tied entries move."""
    order = np.lexsort((idx, -sims), axis=1)
    return np.take_along_axis(sims, order, axis=1), np.take_along_axis(idx, order, axis=1)


# --------------------------------------------------------------------------------------------------
# search indexes: exact (flat), IVF and HNSW, on the CPU or (exact / IVF) on a faiss GPU


INDEX_KINDS: tuple[str, ...] = ("exact", "ivf", "hnsw")
# Parameters each index kind accepts, with their defaults (None: chosen from the gallery size).
INDEX_PARAMETERS: dict[str, dict[str, int | None]] = {
    "exact": {},
    "ivf": {"nlist": None, "nprobe": 32},
    "hnsw": {"M": 32, "ef_construction": 40, "ef_search": 128},
}
GPU_MAX_K = 2048  # faiss GPU indexes return at most 2048 neighbours per query; larger k runs on the CPU
_GPU_STATE: dict[str, Any] = {}  # the process's one faiss.StandardGpuResources, created on first use


def index_parameters(index: str = "exact", index_params: Mapping[str, int | None] | None = None) -> dict[str, int | None]:
    """The validated parameters of an index kind: its defaults (:data:`INDEX_PARAMETERS`) updated by
    ``index_params``.

    * ``exact``: faiss ``IndexFlatIP``, no parameters.
    * ``ivf``: ``IndexIVFFlat`` with inner product. ``nlist`` inverted lists (default
      :func:`default_nlist` of the gallery size), ``nprobe`` lists visited per query (32).
    * ``hnsw``: ``IndexHNSWFlat`` with inner product. ``M`` graph neighbours per node (32),
      ``ef_construction`` (40, faiss's default; build time grows with it) and ``ef_search`` (128;
      raised to k when k is larger, since HNSW cannot return more than ``ef_search`` results). HNSW
      graph construction is multi-threaded and not bit-for-bit reproducible across thread counts.

    Unknown kinds or parameter names raise ``ValueError`` listing the valid ones.
    """
    if not isinstance(index, str) or index not in INDEX_KINDS:
        raise ValueError(f"index: expected one of {', '.join(repr(k) for k in INDEX_KINDS)}, got {index!r}")
    params = dict(INDEX_PARAMETERS[index])
    given = dict(index_params or {})
    unknown = sorted(set(given) - set(params))
    if unknown:
        valid = ", ".join(params) if params else "none"
        raise ValueError(f"index_params: {unknown} not accepted by index {index!r}; valid parameters: {valid}")
    for name, value in given.items():
        if value is None and INDEX_PARAMETERS[index][name] is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"index_params[{name!r}]: expected a positive integer, got {value!r}")
        params[name] = int(value)
    return params


def default_nlist(n_items: int) -> int:
    """IVF lists for ``n_items`` gallery vectors: ≈ 4·√N (faiss's rule of thumb), at most N / 39 so that
    k-means has the 39 training points per centroid faiss asks for, and at least 1."""
    return max(1, min(int(round(4.0 * np.sqrt(n_items))), n_items // 39))


def _faiss_gpu_count(faiss: Any) -> int:
    """GPUs faiss can use: 0 for CPU-only builds (which may lack ``get_num_gpus`` or the GPU classes)."""
    if not hasattr(faiss, "StandardGpuResources") or not hasattr(faiss, "index_cpu_to_gpu"):
        return 0
    return int(getattr(faiss, "get_num_gpus", lambda: 0)())


def _gpu_resources(faiss: Any) -> Any:
    if "resources" not in _GPU_STATE:
        _GPU_STATE["resources"] = faiss.StandardGpuResources()
    return _GPU_STATE["resources"]


def _resolve_gpu(use_gpu: bool | None, *, kind: str, k: int | None, faiss: Any) -> bool:
    """Whether to build on GPU 0. ``None`` (auto): yes iff faiss sees a GPU, the kind has a GPU version
    (not HNSW) and k ≤ :data:`GPU_MAX_K`. ``True`` raises when any of these fails; ``False``: never."""
    if use_gpu is not None and not isinstance(use_gpu, (bool, np.bool_)):
        raise ValueError(f"use_gpu: expected True, False or None (auto), got {use_gpu!r}")
    if use_gpu is False:
        return False
    reasons = []
    if _faiss_gpu_count(faiss) == 0:
        reasons.append("faiss sees no GPU (faiss.get_num_gpus() == 0 or a CPU-only faiss build)")
    if kind == "hnsw":
        reasons.append("faiss has no GPU version of IndexHNSWFlat")
    if k is not None and k > GPU_MAX_K:
        reasons.append(f"k={k} exceeds the {GPU_MAX_K} neighbours faiss GPU indexes can return")
    if use_gpu and reasons:
        raise ValueError(f"use_gpu=True: cannot search on the GPU: {'; '.join(reasons)}")
    return not reasons


class NeighborIndex:
    """A faiss index over L2-normalised gallery rows, searched by inner product (= cosine similarity).

    Build it with :func:`build_neighbor_index`. Approximate kinds (``ivf``, ``hnsw``) may return fewer
    than k results for a query; the missing entries have index −1 and similarity −inf (they sort last).
    ``params`` holds the parameters it was built with; its search-time ones (``nprobe``, ``ef_search``) are
    read at every search, so changing them there re-tunes the search without rebuilding.
    """

    def __init__(self, index: Any, *, kind: str, params: Mapping[str, int | None], size: int, on_gpu: bool) -> None:
        self.index, self.kind, self.params, self.size, self.on_gpu = index, kind, dict(params), size, on_gpu

    def _raw_search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """faiss search of normalised float32 rows: (similarities, indices), both Q × k, −1/−inf if missing."""
        if self.on_gpu and k > GPU_MAX_K:
            raise ValueError(f"k: k={k} exceeds the {GPU_MAX_K} neighbours a faiss GPU index returns; build with use_gpu=False")
        if self.kind == "ivf":
            self.index.nprobe = int(self.params["nprobe"])
        elif self.kind == "hnsw":
            self.index.hnsw.efSearch = max(int(self.params["ef_search"]), k)
        sims, idx = self.index.search(queries, k)
        return np.where(idx >= 0, sims, -np.inf).astype(np.float32, copy=False), idx

    def search_chunks(
        self, queries: np.ndarray, *, k: int, chunk_size: int = DEFAULT_CHUNK_SIZE, exclude_self: bool = False
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Yield ``(start, indices, similarities)`` (each chunk × k) for consecutive chunks of ``queries``.

        ``queries`` must be L2-normalised float32. ``exclude_self=True`` means the queries *are* the
        indexed rows (all vs all): each query's own row is removed by index (k + 1 are searched).
        Rows are ordered by similarity descending, ties by index ascending.
        """
        k_search = k + 1 if exclude_self else k
        for start in range(0, len(queries), chunk_size):
            stop = min(start + chunk_size, len(queries))
            sims, idx = self._raw_search(queries[start:stop], k_search)
            if exclude_self:
                sims, idx = _drop_self(sims, idx, np.arange(start, stop))
            sims, idx = _sort_ties_by_index(sims, idx)
            yield start, idx.astype(np.int64, copy=False), sims.astype(np.float32, copy=False)

    def search(
        self, queries: ArrayLike, *, k: int, chunk_size: int = DEFAULT_CHUNK_SIZE, exclude_self: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, similarities)``, Q × k, of ``queries`` (L2-normalised here); see :meth:`search_chunks`."""
        q = _normalize_rows(_as_embeddings(queries, name="queries"))
        if q.shape[1] != self.index.d:
            raise ValueError(f"queries: expected embedding dimension {self.index.d} (as the index), got {q.shape[1]}")
        if exclude_self and len(q) != self.size:
            raise ValueError(f"queries: exclude_self=True expects the {self.size} indexed rows themselves, got {len(q)} rows")
        k = _as_k(k, n_retrievable=self.size - 1 if exclude_self else self.size)
        return _collect(self.search_chunks(q, k=k, chunk_size=_as_chunk_size(chunk_size), exclude_self=exclude_self), len(q), k)


def _collect(chunks: Iterator[tuple[int, np.ndarray, np.ndarray]], n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    indices = np.empty((n, k), dtype=np.int64)
    similarities = np.empty((n, k), dtype=np.float32)
    for start, idx, sims in chunks:
        indices[start : start + len(idx)] = idx
        similarities[start : start + len(idx)] = sims
    return indices, similarities


def _build_index(base: np.ndarray, *, kind: str, params: Mapping[str, int | None], use_gpu: bool | None, k: int | None) -> NeighborIndex:
    """Index the normalised float32 rows ``base``. IVF trains its coarse quantizer on ``base`` with faiss's
    IVF defaults (spherical k-means, 10 iterations, fixed seed, at most 256 training points per list)."""
    import faiss  # lazily: keeps torch/faiss OpenMP runtimes from loading together unless needed

    n, d = base.shape
    on_gpu = _resolve_gpu(use_gpu, kind=kind, k=k, faiss=faiss)
    params = dict(params)
    if kind == "exact":
        index = faiss.IndexFlatIP(d)
    elif kind == "ivf":
        params["nlist"] = params["nlist"] or default_nlist(n)
        if params["nlist"] > n:
            raise ValueError(f"index_params['nlist']: expected at most the {n} indexed items, got {params['nlist']}")
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, params["nlist"], faiss.METRIC_INNER_PRODUCT)
        index.cp.min_points_per_centroid = 1  # small galleries: no warning, the list count is already capped
    else:
        index = faiss.IndexHNSWFlat(d, params["M"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params["ef_construction"]
    if on_gpu:
        index = faiss.index_cpu_to_gpu(_gpu_resources(faiss), 0, index)
    if kind == "ivf":
        index.train(base)
    index.add(base)
    return NeighborIndex(index, kind=kind, params=params, size=n, on_gpu=on_gpu)


def build_neighbor_index(
    gallery: ArrayLike,
    *,
    index: str = "exact",
    index_params: Mapping[str, int | None] | None = None,
    use_gpu: bool | None = None,
) -> NeighborIndex:
    """A :class:`NeighborIndex` over the L2-normalised rows of ``gallery`` (G × d).

    Args:
        gallery: the vectors to index.
        index: ``"exact"``, ``"ivf"`` or ``"hnsw"`` (see :func:`index_parameters`).
        index_params: overrides of that kind's parameters.
        use_gpu: ``None`` (auto): GPU 0 through ``faiss.StandardGpuResources`` / ``index_cpu_to_gpu`` when
            ``faiss.get_num_gpus() > 0`` and the kind has a GPU version (exact, IVF); ``True``: require it;
            ``False``: CPU. A GPU index cannot return more than :data:`GPU_MAX_K` neighbours.
    """
    params = index_parameters(index, index_params)
    g = _normalize_rows(_as_embeddings(gallery, name="gallery"))
    return _build_index(g, kind=index, params=params, use_gpu=use_gpu, k=None)


def _search_chunks(
    queries: np.ndarray,
    gallery: np.ndarray | None,
    *,
    k: int,
    chunk_size: int,
    index: str = "exact",
    params: Mapping[str, int | None] | None = None,
    use_gpu: bool | None = None,
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield ``(start, indices, similarities)`` for consecutive query chunks, each chunk × k.

    ``queries``/``gallery`` must already be normalised float32; ``gallery=None`` searches the queries
    themselves with the query excluded by index. ``params`` must come from :func:`index_parameters`.
    """
    exclude_self = gallery is None
    base = queries if exclude_self else gallery
    k_search = k + 1 if exclude_self else k
    searcher = _build_index(base, kind=index, params=params or {}, use_gpu=use_gpu, k=k_search)
    yield from searcher.search_chunks(queries, k=k, chunk_size=chunk_size, exclude_self=exclude_self)


def nearest_neighbors(
    queries: ArrayLike,
    gallery: ArrayLike | None = None,
    *,
    k: int,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    index: str = "exact",
    index_params: Mapping[str, int | None] | None = None,
    use_gpu: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """k nearest neighbours by cosine similarity (faiss inner product on L2-normalised rows).

    Args:
        queries: Q × d embeddings.
        gallery: G × d embeddings, or None for all-vs-all (queries searched against themselves, each
            query excluded from its own list by index, so its duplicates are kept).
        k: neighbours per query, 1 ≤ k ≤ G (or ≤ Q − 1 in all-vs-all mode).
        chunk_size: queries per faiss search call (bounds the temporary memory).
        index: ``"exact"`` (``IndexFlatIP``, the default), or an approximate index for very large
            galleries: ``"ivf"`` (``IndexIVFFlat``) or ``"hnsw"`` (``IndexHNSWFlat``); see
            :func:`index_parameters`.
        index_params: that index's parameters (``nlist``/``nprobe``; ``M``/``ef_construction``/``ef_search``).
        use_gpu: None (auto), True or False; see :func:`build_neighbor_index`.

    Returns:
        ``(indices, similarities)``: int64 and float32 arrays of shape Q × k, sorted by similarity
        descending, ties by gallery index ascending. Indices point into ``gallery`` (or ``queries``).
        Approximate indexes may miss results: those entries are −1 with similarity −inf, at the end.
    """
    params = index_parameters(index, index_params)
    q = _normalize_rows(_as_embeddings(queries, name="queries"))
    g = None
    if gallery is not None:
        g = _as_embeddings(gallery, name="gallery")
        if g.shape[1] != q.shape[1]:
            raise ValueError(f"gallery: expected embedding dimension {q.shape[1]} (as in queries), got {g.shape[1]}")
        g = _normalize_rows(g)
    k = _as_k(k, n_retrievable=_n_retrievable(len(q), g))
    chunk_size = _as_chunk_size(chunk_size)
    chunks = _search_chunks(q, g, k=k, chunk_size=chunk_size, index=index, params=params, use_gpu=use_gpu)
    return _collect(chunks, len(q), k)


def _as_k(k: int, *, n_retrievable: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k: expected a positive integer, got {k!r}")
    if k > n_retrievable:
        raise ValueError(f"k: k={k} is larger than the {n_retrievable} retrievable gallery items")
    return int(k)

# --------------------------------------------------------------------------------------------------
# retrieval metrics


def relevant_counts(query_labels: ArrayLike, gallery_labels: ArrayLike | None = None) -> np.ndarray:
    """``R_q`` per query: gallery items of the query's class, the query itself excluded (int64, length Q).

    ``gallery_labels=None`` is the all-vs-all mode: ``R_q`` = (size of the query's class) − 1.
    """
    q_labels = _to_numpy(query_labels)
    if q_labels.ndim != 1:
        raise ValueError(f"query_labels: expected a 1-D array of class labels, got shape {q_labels.shape}")
    if gallery_labels is None:
        _, inverse, counts = np.unique(q_labels, return_inverse=True, return_counts=True)
        return (counts[inverse.reshape(-1)] - 1).astype(np.int64)
    g_labels = _to_numpy(gallery_labels)
    if g_labels.ndim != 1:
        raise ValueError(f"gallery_labels: expected a 1-D array of class labels, got shape {g_labels.shape}")
    _check_label_kinds(q_labels, g_labels)
    classes, counts = np.unique(g_labels, return_counts=True)
    if len(classes) == 0:
        return np.zeros(len(q_labels), dtype=np.int64)
    pos = np.minimum(np.searchsorted(classes, q_labels), len(classes) - 1)
    return np.where(classes[pos] == q_labels, counts[pos], 0).astype(np.int64)


def _per_query_stats(
    hits: np.ndarray, r: np.ndarray, *, with_r: bool
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Per-query rank of the first hit (k if none), R-Precision and AP@R from an n × k hit matrix.

    ``hits[i, j]`` says whether the j-th neighbour of query i shares its class; ``r`` holds R_q > 0.
    RP_q = Σ_{j≤R_q} rel_j / R_q and AP@R_q = (1/R_q) Σ_{j≤R_q} P@j · rel_j, P@j = Σ_{i≤j} rel_i / j
    (Musgrave et al., "A Metric Learning Reality Check", ECCV 2020, eq. for MAP@R).
    """
    n, k = hits.shape
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


def _retrieval(
    queries: np.ndarray,
    query_labels: np.ndarray,
    gallery: np.ndarray | None,
    gallery_labels: np.ndarray | None,
    *,
    ks: tuple[int, ...],
    with_r: bool,
    chunk_size: int,
    index: str = "exact",
    params: Mapping[str, int | None] | None = None,
    use_gpu: bool | None = None,
) -> dict[str, float]:
    """One chunked neighbour search with k = max(max ks, max R_q if ``with_r``) and all metrics from it.

    With an approximate index, a missing neighbour (index −1) counts as a miss.
    """
    target_labels = query_labels if gallery_labels is None else gallery_labels
    r = relevant_counts(query_labels, gallery_labels)
    valid = _valid_queries(r)
    k = max(max(ks, default=1), int(r.max()) if with_r else 1)
    k = _as_k(k, n_retrievable=_n_retrievable(len(queries), gallery))
    first_hit = np.empty(len(queries), dtype=np.int64)
    rp = np.empty(len(queries), dtype=np.float64) if with_r else None
    ap = np.empty(len(queries), dtype=np.float64) if with_r else None
    chunks = _search_chunks(queries, gallery, k=k, chunk_size=chunk_size, index=index, params=params, use_gpu=use_gpu)
    for start, idx, _ in chunks:
        stop = start + len(idx)
        hits = _hits(idx, target_labels, query_labels[start:stop])  # chunk × k
        r_chunk = np.maximum(r[start:stop], 1)  # R_q = 0 rows are dropped below; avoid 0-division here
        f, p, a = _per_query_stats(hits, r_chunk, with_r=with_r)
        first_hit[start:stop] = f
        if with_r:
            rp[start:stop] = p
            ap[start:stop] = a
    return _summarize(first_hit[valid], None if rp is None else rp[valid], None if ap is None else ap[valid], ks=ks)


def _hits(idx: np.ndarray, target_labels: np.ndarray, query_labels: np.ndarray) -> np.ndarray:
    """``hits[i, j]``: neighbour j of query i exists (index ≥ 0) and has the query's class."""
    present = idx >= 0
    return present & (target_labels[np.where(present, idx, 0)] == query_labels[:, None])


def retrieval_metrics_from_neighbors(
    neighbor_indices: ArrayLike,
    query_labels: ArrayLike,
    *,
    gallery_labels: ArrayLike | None = None,
    ks: Sequence[int] = DEFAULT_KS,
) -> dict[str, float]:
    """R@K, P@1, RP and MAP@R from given (e.g. re-ranked) neighbour lists.

    Args:
        neighbor_indices: Q × k gallery indices, best first. In all-vs-all mode (``gallery_labels=None``)
            they index the query set and must not contain the query itself. −1 marks a missing
            neighbour (as returned by approximate indexes) and counts as a miss.
        query_labels: Q labels.
        gallery_labels: G labels, or None for all-vs-all.
        ks: the K values of Recall@K; k must be ≥ max(max ks, max R_q) so RP and MAP@R are exact.

    Returns:
        ``{"R@1": …, …, "P@1": …, "RP": …, "MAP@R": …}``, the same definitions as :func:`retrieval_metrics`.
    """
    idx = _to_numpy(neighbor_indices)
    if idx.ndim != 2 or idx.dtype.kind not in "iu":
        raise ValueError(f"neighbor_indices: expected a 2-D integer array Q × k, got shape {idx.shape} and dtype {idx.dtype}")
    q_labels = _as_labels(query_labels, n=len(idx), name="query_labels")
    if gallery_labels is None:
        target = q_labels
    else:
        g_arr = _to_numpy(gallery_labels)
        target = _as_labels(g_arr, n=len(g_arr), name="gallery_labels")
    if idx.size and (idx.min() < -1 or idx.max() >= len(target)):
        raise ValueError(f"neighbor_indices: expected indices in [0, {len(target)}) or −1 (missing), got [{idx.min()}, {idx.max()}]")
    ks = _as_ks(ks, n_gallery=idx.shape[1])
    r = relevant_counts(q_labels, None if gallery_labels is None else target)
    if gallery_labels is None and (idx == np.arange(len(idx))[:, None]).any():
        raise ValueError("neighbor_indices: all-vs-all mode expects each query to be excluded from its own list")
    valid = _valid_queries(r)
    if idx.shape[1] < r.max():
        raise ValueError(
            f"neighbor_indices: expected at least max R_q = {r.max()} neighbours per query for RP/MAP@R, got {idx.shape[1]}"
        )
    hits = _hits(idx, target, q_labels)
    first_hit, rp, ap = _per_query_stats(hits, np.maximum(r, 1), with_r=True)
    return _summarize(first_hit[valid], rp[valid], ap[valid], ks=ks)


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
    """Recall@K, P@1, R-Precision and MAP@R from ONE neighbour search with k = max(max ks, max R_q).

    * Recall@K: share of queries with at least one same-class item among their K nearest neighbours.
    * P@1: precision of the first neighbour, equal to Recall@1.
    * RP (R-Precision): hits among the first R_q neighbours divided by R_q.
    * MAP@R: (1/R_q) Σ_{i ≤ R_q} P@i · rel_i (Musgrave et al., ECCV 2020).

    ``R_q`` counts the *other* items of the query's class in the gallery (the query itself excluded),
    the convention of pytorch-metric-learning's ``AccuracyCalculator``. DIML's evaluation code counts
    the query in R instead; its RP/MAP@R numbers are therefore not comparable with these. Queries with
    R_q = 0 are skipped by all metrics.

    Args:
        embeddings, labels: the queries (and the gallery too in all-vs-all mode).
        ks: K values for Recall@K (non-empty, each ≤ the number of retrievable items).
        gallery, gallery_labels: a separate gallery (query → gallery mode), or None for all vs all.
        chunk_size: queries per faiss search call.
        index, index_params, use_gpu: the search index (default exact; ``"ivf"``/``"hnsw"`` approximate
            the neighbour lists and hence every metric), see :func:`nearest_neighbors`.

    Returns:
        ``{"R@1": …, "R@2": …, …, "P@1": …, "RP": …, "MAP@R": …}`` as fractions in [0, 1].
    """
    params = index_parameters(index, index_params)
    queries, q_labels, g, g_labels = _prepare_sets(embeddings, labels, gallery, gallery_labels)
    ks = _as_ks(ks, n_gallery=_n_retrievable(len(queries), g))
    return _retrieval(
        queries, q_labels, g, g_labels, ks=ks, with_r=True, chunk_size=_as_chunk_size(chunk_size),
        index=index, params=params, use_gpu=use_gpu,
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
    """Recall@K for each K: share of queries (R_q > 0) with a same-class item among their K nearest.

    Searches only max(ks) neighbours. See :func:`retrieval_metrics` for the modes, conventions and the
    index options.
    """
    params = index_parameters(index, index_params)
    queries, q_labels, g, g_labels = _prepare_sets(embeddings, labels, gallery, gallery_labels)
    ks = _as_ks(ks, n_gallery=_n_retrievable(len(queries), g))
    out = _retrieval(
        queries, q_labels, g, g_labels, ks=ks, with_r=False, chunk_size=_as_chunk_size(chunk_size),
        index=index, params=params, use_gpu=use_gpu,
    )
    return {k: out[f"R@{k}"] for k in ks}


def precision_at_1(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    gallery: ArrayLike | None = None,
    gallery_labels: ArrayLike | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> float:
    """P@1 = Recall@1: share of queries (R_q > 0) whose nearest neighbour has their class."""
    return recall_at_k(embeddings, labels, (1,), gallery=gallery, gallery_labels=gallery_labels, chunk_size=chunk_size)[1]


def _r_metrics(
    embeddings: ArrayLike,
    labels: ArrayLike,
    gallery: ArrayLike | None,
    gallery_labels: ArrayLike | None,
    chunk_size: int,
) -> dict[str, float]:
    queries, q_labels, g, g_labels = _prepare_sets(embeddings, labels, gallery, gallery_labels)
    return _retrieval(queries, q_labels, g, g_labels, ks=(1,), with_r=True, chunk_size=_as_chunk_size(chunk_size))


def r_precision(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    gallery: ArrayLike | None = None,
    gallery_labels: ArrayLike | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> float:
    """R-Precision: mean over queries of (hits among the first R_q neighbours) / R_q.

    R_q excludes the query itself (pytorch-metric-learning convention; DIML's code counts the query).
    """
    return _r_metrics(embeddings, labels, gallery, gallery_labels, chunk_size)["RP"]


def map_at_r(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    gallery: ArrayLike | None = None,
    gallery_labels: ArrayLike | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> float:
    """MAP@R: mean over queries of (1/R_q) Σ_{i ≤ R_q} P@i · rel_i (Musgrave et al., ECCV 2020).

    R_q excludes the query itself (pytorch-metric-learning convention; DIML's code counts the query).
    """
    return _r_metrics(embeddings, labels, gallery, gallery_labels, chunk_size)["MAP@R"]


# --------------------------------------------------------------------------------------------------
# clustering and geometry


NMI_BACKENDS: tuple[str, ...] = ("auto", "sklearn", "faiss")
# nmi(backend="auto") switches from scikit-learn to faiss k-means when N · k exceeds this. CUB/Cars test
# sets (≈ 6–8k images × ≈ 100 classes ≈ 6·10⁵–8·10⁵) stay on scikit-learn, as pytorch-metric-learning does;
# In-Shop queries (14,218 × 3,985 ≈ 5.7·10⁷) and SOP (60,502 × 11,316 ≈ 6.8·10⁸) use faiss.
NMI_FAISS_MIN_WORK = 10_000_000
DEFAULT_KMEANS_ITERATIONS = 20
FAISS_KMEANS_INITS: tuple[str, ...] = ("random", "kmeans++")


def _positive_int(value: int, *, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def nmi_backend_for(n_items: int, n_classes: int, backend: str = "auto") -> str:
    """The k-means implementation :func:`nmi` uses: ``backend`` itself, or for ``"auto"`` faiss when
    ``n_items · n_classes > NMI_FAISS_MIN_WORK`` and scikit-learn otherwise."""
    if backend not in NMI_BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(repr(b) for b in NMI_BACKENDS)}, got {backend!r}")
    if backend != "auto":
        return backend
    return "faiss" if n_items * n_classes > NMI_FAISS_MIN_WORK else "sklearn"


def kmeans_assignments(
    x: ArrayLike,
    n_clusters: int,
    *,
    seed: int = 0,
    n_init: int = 1,
    backend: str = "sklearn",
    n_iter: int = DEFAULT_KMEANS_ITERATIONS,
    init: str = "random",
) -> np.ndarray:
    """Cluster index (int64, length N) of each row of ``x`` (used as given, float32) by seeded k-means.

    * ``"sklearn"``: ``KMeans(n_clusters, n_init=n_init, random_state=seed)`` (k-means++ init, Lloyd
      iterations until converged or 300); ``n_iter`` is not used.
    * ``"faiss"``: ``faiss.Kmeans`` (initial centroids: ``init="random"``, k random points, or
      ``"kmeans++"`` where the faiss build has it (≥ 1.12); ``n_iter`` Lloyd iterations;
      ``n_init`` restarts keeping the lowest objective; ``seed``), trained on all N points (no
      subsampling, no minimum points per centroid), then each point goes to its nearest centroid. Cost
      O(n_iter · N · k · d) in BLAS calls, which is what makes k = 11,316 (SOP) practical. Random
      initialisation is the default: on overlapping classes (as in real embeddings) both gave NMI within
      0.05 of scikit-learn's per seed (0.025 on average), and faiss's k-means++ took 3× as long as 20
      iterations (15k points, k = 2,000; ``benchmarks/results_ann.md``).
      On perfectly separated clusters random initialisation can merge two of them (NMI ≈ 0.90–0.97 where
      scikit-learn's greedy k-means++ and faiss's ``"kmeans++"`` reach 1).
    """
    data = np.ascontiguousarray(_as_embeddings(x, name="embeddings"))
    n_clusters = _positive_int(n_clusters, name="n_clusters")
    n_init, n_iter = _positive_int(n_init, name="n_init"), _positive_int(n_iter, name="n_iter")
    if n_clusters > len(data):
        raise ValueError(f"n_clusters: expected at most the {len(data)} points, got {n_clusters}")
    if init not in FAISS_KMEANS_INITS:
        raise ValueError(f"init: expected one of {', '.join(repr(i) for i in FAISS_KMEANS_INITS)}, got {init!r}")
    if backend == "sklearn":
        from sklearn.cluster import KMeans

        return KMeans(n_clusters=n_clusters, n_init=n_init, random_state=seed).fit_predict(data).astype(np.int64)
    if backend != "faiss":
        raise ValueError(f"backend: expected 'sklearn' or 'faiss', got {backend!r}")
    import faiss

    kmeans = faiss.Kmeans(
        data.shape[1], n_clusters, niter=n_iter, nredo=n_init, seed=int(seed) % 2**31, verbose=False,
        min_points_per_centroid=1, max_points_per_centroid=int(np.ceil(len(data) / n_clusters)) + 1,
    )
    if init == "kmeans++":
        if not hasattr(faiss, "ClusteringInitMethod_KMEANS_PLUS_PLUS"):
            raise ValueError(f"init: 'kmeans++' needs faiss ≥ 1.12, this is faiss {faiss.__version__}; use init='random'")
        kmeans.cp.init_method = faiss.ClusteringInitMethod_KMEANS_PLUS_PLUS
    kmeans.train(data)
    _, assignment = kmeans.index.search(data, 1)
    return assignment[:, 0].astype(np.int64)


def nmi(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    seed: int = 0,
    n_init: int = 1,
    backend: str = "auto",
    n_iter: int = DEFAULT_KMEANS_ITERATIONS,
    init: str = "random",
) -> float:
    """Normalised mutual information between k-means clusters and class labels.

    k-means (:func:`kmeans_assignments`, seeded, ``n_init`` restarts) runs on the L2-normalised embeddings
    with k = number of classes; NMI uses the arithmetic-mean normalisation (scikit-learn's default, as in
    pytorch-metric-learning). ``backend``: ``"sklearn"`` (``KMeans``, k-means++), ``"faiss"``
    (``faiss.Kmeans``, ``n_iter`` iterations, ``init``) or ``"auto"`` (:func:`nmi_backend_for`: faiss above
    N · k = :data:`NMI_FAISS_MIN_WORK`). scikit-learn's k-means++ initialisation alone costs
    O(N · k · d · log k), impractical for SOP (k = 11,316); the two backends agree closely but not exactly.
    """
    from sklearn.metrics import normalized_mutual_info_score

    x = l2_normalize(embeddings)
    y = _as_labels(labels, n=len(x), name="labels")
    n_classes = len(np.unique(y))
    chosen = nmi_backend_for(len(x), n_classes, backend)
    clusters = kmeans_assignments(x, n_classes, seed=seed, n_init=n_init, backend=chosen, n_iter=n_iter, init=init)
    return float(normalized_mutual_info_score(y, clusters))


def _class_sums(x: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per class: sum of rows (C × d), sum of squared row norms (C) and item count (C), in float64."""
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    sums = np.add.reduceat(x[order], starts, axis=0)
    squared_norms = np.bincount(inverse, weights=np.einsum("nd,nd->n", x, x), minlength=len(counts))
    return sums, squared_norms, counts


def _mean_pairwise_cosine_distance(sums: np.ndarray, squared_norms: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Mean of 1 − x_i·x_j over ordered pairs i ≠ j of each group, from the group's Σx and Σ‖x‖².

    Uses Σ_{i≠j} x_i·x_j = ‖Σ x_i‖² − Σ ‖x_i‖², so no pairwise matrix is built. Groups need ≥ 2 items.
    """
    off_diagonal = np.einsum("cd,cd->c", sums, sums) - squared_norms
    return np.maximum(1.0 - off_diagonal / (counts * (counts - 1.0)), 0.0)


def density_terms(embeddings: ArrayLike, labels: ArrayLike) -> tuple[float, float]:
    """``(π_intra, π_inter)`` of the embedding-space density, cosine distance d = 1 − cos.

    π_intra = mean over classes (those with ≥ 2 items; unweighted) of the mean distance between
    different items of the class; π_inter = mean distance between different L2-normalised class
    centroids (all classes, singletons included). Centroids are means of the L2-normalised embeddings.
    Runs in O(N · d): pair sums come from class sums, never from a pairwise matrix.
    """
    x = l2_normalize(embeddings).astype(np.float64)
    y = _as_labels(labels, n=len(x), name="labels")
    sums, squared_norms, counts = _class_sums(x, y)
    if len(counts) < 2:
        raise ValueError(f"labels: expected at least 2 classes for π_inter, got {len(counts)}")
    multi = counts >= 2
    if not multi.any():
        raise ValueError("labels: expected at least one class with 2 or more items for π_intra, every class is a singleton")
    pi_intra = float(np.mean(_mean_pairwise_cosine_distance(sums[multi], squared_norms[multi], counts[multi])))
    centroids = _normalize_rows(sums / counts[:, None])  # C × d
    centroid_sum = centroids.sum(axis=0, keepdims=True)
    n_classes = np.array([len(counts)], dtype=np.float64)
    pi_inter = float(
        _mean_pairwise_cosine_distance(centroid_sum, np.einsum("cd,cd->", centroids, centroids)[None], n_classes)[0]
    )
    return pi_intra, pi_inter


def embedding_space_density(embeddings: ArrayLike, labels: ArrayLike) -> float:
    """Embedding-space density ESD = π_intra / π_inter (Roth et al., "Revisiting Training Strategies and
    Generalization Performance in Deep Metric Learning", ICML 2020); see :func:`density_terms`.

    Returns ``inf`` when π_inter = 0 < π_intra and ``nan`` when both are 0 (fully collapsed embeddings).
    """
    pi_intra, pi_inter = density_terms(embeddings, labels)
    if pi_inter > 0.0:
        return pi_intra / pi_inter
    return float("inf") if pi_intra > 0.0 else float("nan")


def singular_value_spectrum(embeddings: ArrayLike) -> np.ndarray:
    """Singular values (float64, descending, min(N, d) of them) of the uncentred N × d matrix of
    L2-normalised embeddings."""
    x = l2_normalize(embeddings).astype(np.float64)
    return np.sort(np.linalg.svd(x, compute_uv=False))[::-1]


def spectral_decay(embeddings: ArrayLike, *, drop_first: int = 0) -> float:
    """Spectral decay ρ = KL(U ‖ s̃) = Σ_i (1/m) log((1/m) / s̃_i) (Roth et al., ICML 2020).

    s̃ is the singular-value spectrum (:func:`singular_value_spectrum`) without its ``drop_first``
    largest values, normalised to sum 1; m is its length. ρ = 0 for a flat spectrum and grows as the
    spectrum decays; a zero singular value gives ``inf``.
    """
    spectrum = singular_value_spectrum(embeddings)
    if isinstance(drop_first, bool) or not isinstance(drop_first, (int, np.integer)) or not 0 <= drop_first < len(spectrum):
        raise ValueError(f"drop_first: expected an integer in [0, {len(spectrum) - 1}], got {drop_first!r}")
    tail = spectrum[drop_first:]
    total = tail.sum()
    if total <= 0.0:
        return float("inf")
    m = len(tail)
    with np.errstate(divide="ignore"):
        rho = float(np.mean(np.log((1.0 / m) / (tail / total))))
    return max(rho, 0.0)


def evaluate(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    gallery: ArrayLike | None = None,
    gallery_labels: ArrayLike | None = None,
    with_nmi: bool = True,
    with_geometry: bool = True,
    drop_first: int = 0,
    seed: int = 0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    index: str = "exact",
    index_params: Mapping[str, int | None] | None = None,
    use_gpu: bool | None = None,
    nmi_backend: str = "auto",
) -> dict[str, float]:
    """:func:`retrieval_metrics` plus ``"NMI"`` (:func:`nmi`, if ``with_nmi``) and ``"ESD"``
    (:func:`embedding_space_density`) and ``"rho"`` (:func:`spectral_decay`) if ``with_geometry``.

    NMI and the geometry are computed on ``embeddings``/``labels`` (the query set in query → gallery mode).

    Large test sets: memory stays bounded by ``chunk_size`` for the exact search (SOP's 60,502 × 60,502
    and In-Shop's 14,218 × 12,612 are searched chunk by chunk, on the GPU when faiss sees one);
    ``index="ivf"``/``"hnsw"`` trade exactness for speed on galleries of millions. NMI uses faiss k-means
    automatically above N · k = :data:`NMI_FAISS_MIN_WORK` (``nmi_backend="auto"``; SOP, In-Shop);
    ``with_nmi=False`` skips it. ESD and ρ are O(N · d).
    """
    out = retrieval_metrics(
        embeddings, labels, ks=ks, gallery=gallery, gallery_labels=gallery_labels, chunk_size=chunk_size,
        index=index, index_params=index_params, use_gpu=use_gpu,
    )
    if with_nmi:
        out["NMI"] = nmi(embeddings, labels, seed=seed, backend=nmi_backend)
    if with_geometry:
        out["ESD"] = embedding_space_density(embeddings, labels)
        out["rho"] = spectral_decay(embeddings, drop_first=drop_first)
    return out
