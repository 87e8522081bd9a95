"""Clustering quality: NMI between seeded k-means clusters of the embeddings and the class labels.

NMI(Y, C) = I(Y; C) / ((H(Y) + H(C)) / 2), the arithmetic-mean normalisation (Manning, Raghavan & Schütze,
"Introduction to Information Retrieval", 2008, Sec. 16.3; scikit-learn's default, as used by
pytorch-metric-learning), with C the k-means clusters of the L2-normalised embeddings and k = number of
classes. k-means is Lloyd's algorithm (Lloyd, IEEE Trans. Inf. Theory 1982), seeded by k-means++ (Arthur &
Vassilvitskii, SODA 2007) in scikit-learn, by random points or k-means++ in faiss.
"""

from __future__ import annotations

import numpy as np

from .inputs import ArrayLike, as_embeddings, as_labels, l2_normalize, positive_int

NMI_BACKENDS: tuple[str, ...] = ("auto", "sklearn", "faiss")
# nmi(backend="auto") switches from scikit-learn to faiss k-means when N · k exceeds this. CUB/Cars test
# sets (≈ 6–8k images × ≈ 100 classes ≈ 6·10⁵–8·10⁵) stay on scikit-learn, as pytorch-metric-learning does;
# In-Shop queries (14,218 × 3,985 ≈ 5.7·10⁷) and SOP (60,502 × 11,316 ≈ 6.8·10⁸) use faiss.
NMI_FAISS_MIN_WORK = 10_000_000
DEFAULT_KMEANS_ITERATIONS = 20
FAISS_KMEANS_INITS: tuple[str, ...] = ("random", "kmeans++")


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
      O(n_iter · N · k · d) in BLAS calls, which is what makes k = 11,316 (SOP) practical.

    Random initialisation is the faiss default because faiss's k-means++ costs several times as much
    and both agree with scikit-learn's NMI within seed noise on overlapping classes (as in real
    embeddings); on perfectly separated clusters random initialisation can merge two of them, which
    greedy k-means++ avoids. The measurements are in ``benchmarks/results_ann.md`` and
    ``benchmarks/README.md`` ("Measurements behind docstrings").
    """
    data = as_embeddings(x, name="embeddings")
    n_clusters = positive_int(n_clusters, name="n_clusters")
    n_init, n_iter = positive_int(n_init, name="n_init"), positive_int(n_iter, name="n_iter")
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
        data.shape[1],
        n_clusters,
        niter=n_iter,
        nredo=n_init,
        seed=int(seed) % 2**31,
        verbose=False,
        min_points_per_centroid=1,
        max_points_per_centroid=int(np.ceil(len(data) / n_clusters)) + 1,
    )
    if init == "kmeans++":
        if not hasattr(faiss, "ClusteringInitMethod_KMEANS_PLUS_PLUS"):
            raise ValueError(
                f"init: 'kmeans++' needs faiss ≥ 1.12, this is faiss {faiss.__version__}; use init='random'"
            )
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
    """NMI (module docstring) between k-means clusters of the L2-normalised embeddings and the labels.

    k-means: :func:`kmeans_assignments`, seeded, ``n_init`` restarts, k = number of classes. ``backend``:
    ``"sklearn"`` (``KMeans``, k-means++), ``"faiss"`` (``faiss.Kmeans``, ``n_iter`` iterations, ``init``) or
    ``"auto"`` (:func:`nmi_backend_for`: faiss above N · k = :data:`NMI_FAISS_MIN_WORK`). scikit-learn's
    k-means++ initialisation alone costs O(N · k · d · log k), impractical for SOP (k = 11,316); the two
    backends agree closely but not exactly.
    """
    from sklearn.metrics import normalized_mutual_info_score

    x = l2_normalize(embeddings)
    y = as_labels(labels, n=len(x), name="labels")
    n_classes = len(np.unique(y))
    chosen = nmi_backend_for(len(x), n_classes, backend)
    clusters = kmeans_assignments(x, n_classes, seed=seed, n_init=n_init, backend=chosen, n_iter=n_iter, init=init)
    return float(normalized_mutual_info_score(y, clusters))
