"""Every metric of one evaluation in one call: retrieval, NMI and the embedding-space geometry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .clustering import nmi
from .geometry import embedding_space_density, spectral_decay
from .inputs import ArrayLike
from .neighbours import DEFAULT_CHUNK_SIZE
from .retrieval import DEFAULT_KS, retrieval_metrics


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
    """:func:`~dmlstudy.metrics.retrieval_metrics` plus ``"NMI"`` (:func:`~dmlstudy.metrics.nmi`, if
    ``with_nmi``) and ``"ESD"`` (:func:`~dmlstudy.metrics.embedding_space_density`) and ``"rho"``
    (:func:`~dmlstudy.metrics.spectral_decay`) if ``with_geometry``.

    NMI and the geometry are computed on ``embeddings``/``labels`` (the query set in query → gallery mode).

    Large test sets: memory stays bounded by ``chunk_size`` for the exact search (SOP's 60,502 × 60,502
    and In-Shop's 14,218 × 12,612 are searched chunk by chunk, on the GPU when faiss sees one);
    ``index="ivf"``/``"hnsw"`` trade exactness for speed on galleries of millions. NMI uses faiss k-means
    automatically above N · k = :data:`~dmlstudy.metrics.NMI_FAISS_MIN_WORK` (``nmi_backend="auto"``; SOP,
    In-Shop); ``with_nmi=False`` skips it. ESD and ρ are O(N · d) and one SVD.
    """
    out = retrieval_metrics(
        embeddings,
        labels,
        ks=ks,
        gallery=gallery,
        gallery_labels=gallery_labels,
        chunk_size=chunk_size,
        index=index,
        index_params=index_params,
        use_gpu=use_gpu,
    )
    if with_nmi:
        out["NMI"] = nmi(embeddings, labels, seed=seed, backend=nmi_backend)
    if with_geometry:
        out["ESD"] = embedding_space_density(embeddings, labels)
        out["rho"] = spectral_decay(embeddings, drop_first=drop_first)
    return out
