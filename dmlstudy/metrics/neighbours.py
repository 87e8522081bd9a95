"""k-nearest-neighbour search by cosine similarity with faiss: exact, IVF and HNSW indexes, CPU or GPU.

Rows are L2-normalised and searched by inner product, so similarity = cosine similarity. Queries are searched
in chunks of ``chunk_size``: memory is O(chunk_size × k) on top of the embeddings and no N × N matrix is built.

* ``"exact"``: ``faiss.IndexFlatIP``, the default.
* ``"ivf"``: ``IndexIVFFlat``, the inverted file of Jégou, Douze & Schmid ("Product quantization for nearest
  neighbor search", TPAMI 2011) storing full vectors instead of PQ codes; inner product.
* ``"hnsw"``: ``IndexHNSWFlat`` (Malkov & Yashunin, "Efficient and robust approximate nearest neighbor
  search using Hierarchical Navigable Small World graphs", TPAMI 2018), inner product.

IVF and HNSW return *approximate* neighbour lists (``benchmarks/results_ann.md`` measures the error). When
faiss sees a GPU (never with the CPU-only build), exact and IVF indexes move to GPU 0.

Two modes. *All vs all* (``gallery=None``): every query searches all *other* queries; the query is removed
from its own list by index, never by similarity, so exact duplicates of it stay. *Query → gallery*: separate
sets, nothing removed. Neighbours of equal similarity are ordered by ascending index (deterministic ranks).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .inputs import ArrayLike, as_embeddings, as_k, as_query_gallery, normalize_rows, positive_int

DEFAULT_CHUNK_SIZE = 4096
INDEX_KINDS: tuple[str, ...] = ("exact", "ivf", "hnsw")
# Parameters each index kind accepts, with their defaults (None: chosen from the gallery size).
INDEX_PARAMETERS: dict[str, dict[str, int | None]] = {
    "exact": {},
    "ivf": {"nlist": None, "nprobe": 32},
    "hnsw": {"M": 32, "ef_construction": 40, "ef_search": 128},
}
GPU_MAX_K = 2048  # faiss GPU indexes return at most 2048 neighbours per query; larger k runs on the CPU
_GPU_STATE: dict[str, Any] = {}  # the process's one faiss.StandardGpuResources, created on first use

Chunks = Iterator[tuple[int, np.ndarray, np.ndarray]]  # (first query row, indices, similarities) per chunk


def index_parameters(
    index: str = "exact", index_params: Mapping[str, int | None] | None = None
) -> dict[str, int | None]:
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
        params[name] = positive_int(value, name=f"index_params[{name!r}]")
    return params


def default_nlist(n_items: int) -> int:
    """IVF lists for ``n_items`` gallery vectors: ≈ 4·√N (faiss's rule of thumb), at most N / 39 so that
    k-means has the 39 training points per centroid faiss asks for, and at least 1."""
    return max(1, min(int(round(4.0 * np.sqrt(n_items))), n_items // 39))


def n_retrievable(n_queries: int, gallery: np.ndarray | None) -> int:
    """Largest usable k: the gallery size, or N − 1 in all-vs-all mode (the query is excluded)."""
    return n_queries - 1 if gallery is None else len(gallery)


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
            raise ValueError(
                f"k: k={k} exceeds the {GPU_MAX_K} neighbours a faiss GPU index returns; build with use_gpu=False"
            )
        if self.kind == "ivf":
            self.index.nprobe = int(self.params["nprobe"])
        elif self.kind == "hnsw":
            self.index.hnsw.efSearch = max(int(self.params["ef_search"]), k)
        sims, idx = self.index.search(queries, k)
        return np.where(idx >= 0, sims, -np.inf).astype(np.float32, copy=False), idx

    def search_chunks(
        self, queries: np.ndarray, *, k: int, chunk_size: int = DEFAULT_CHUNK_SIZE, exclude_self: bool = False
    ) -> Chunks:
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
        q = normalize_rows(as_embeddings(queries, name="queries"))
        if q.shape[1] != self.index.d:
            raise ValueError(f"queries: expected embedding dimension {self.index.d} (as the index), got {q.shape[1]}")
        if exclude_self and len(q) != self.size:
            raise ValueError(
                f"queries: exclude_self=True expects the {self.size} indexed rows themselves, got {len(q)} rows"
            )
        k = as_k(k, n_retrievable=self.size - 1 if exclude_self else self.size)
        chunk_size = positive_int(chunk_size, name="chunk_size")
        return _collect(self.search_chunks(q, k=k, chunk_size=chunk_size, exclude_self=exclude_self), len(q), k)


def _collect(chunks: Chunks, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    indices = np.empty((n, k), dtype=np.int64)
    similarities = np.empty((n, k), dtype=np.float32)
    for start, idx, sims in chunks:
        indices[start : start + len(idx)] = idx
        similarities[start : start + len(idx)] = sims
    return indices, similarities


def _build_index(
    base: np.ndarray, *, kind: str, params: Mapping[str, int | None], use_gpu: bool | None, k: int | None
) -> NeighborIndex:
    """Index the normalised float32 rows ``base``; ``k`` (if known) decides whether a GPU index can serve it.

    IVF trains its coarse quantizer on ``base`` with faiss's IVF defaults (spherical k-means, 10 iterations,
    fixed seed, at most 256 training points per list).
    """
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
    g = normalize_rows(as_embeddings(gallery, name="gallery"))
    return _build_index(g, kind=index, params=params, use_gpu=use_gpu, k=None)


def search_in_chunks(
    queries: np.ndarray,
    gallery: np.ndarray | None,
    *,
    k: int,
    chunk_size: int,
    index: str = "exact",
    params: Mapping[str, int | None] | None = None,
    use_gpu: bool | None = None,
) -> Chunks:
    """Index ``gallery`` (or, if None, the queries themselves, each query excluded from its own list by
    index) and yield ``(start, indices, similarities)`` for consecutive query chunks, each chunk × k.

    The inputs must already be validated: normalised float32 rows, ``k`` and ``chunk_size`` checked,
    ``params`` from :func:`index_parameters`.
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
    q, g = as_query_gallery(queries, gallery, query_name="queries")
    k = as_k(k, n_retrievable=n_retrievable(len(q), g))
    chunk_size = positive_int(chunk_size, name="chunk_size")
    chunks = search_in_chunks(q, g, k=k, chunk_size=chunk_size, index=index, params=params, use_gpu=use_gpu)
    return _collect(chunks, len(q), k)
