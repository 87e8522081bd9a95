"""Retrieval, clustering and embedding-space-geometry metrics for deep metric learning.

One module per concept, every public name re-exported here (``from dmlstudy.metrics import nmi``):

* :mod:`~dmlstudy.metrics.inputs`: validation and L2 normalisation of embeddings, labels and K values.
* :mod:`~dmlstudy.metrics.neighbours`: cosine k-nearest-neighbour search with faiss (exact, IVF, HNSW).
* :mod:`~dmlstudy.metrics.retrieval`: Recall@K, P@1, R-Precision, MAP@R.
* :mod:`~dmlstudy.metrics.clustering`: NMI of k-means clusters (scikit-learn or faiss).
* :mod:`~dmlstudy.metrics.geometry`: embedding-space density and spectral decay ρ.
* :mod:`~dmlstudy.metrics.relatives`: R@1 with each query's relative family (a near copy) out of its gallery.
* :mod:`~dmlstudy.metrics.evaluation`: all of them in one call.

Conventions shared by every function:

* Metrics are pure functions: arrays in, Python floats (fractions in [0, 1] for retrieval and NMI) out.
* Embeddings are L2-normalised inside (unnormalised input is accepted; a zero row stays zero) and the
  similarity is the inner product, i.e. cosine similarity. Inputs may be numpy arrays, torch tensors
  (any device, gradients are detached) or nested sequences; they are converted to ``float32``.
* Exact nearest neighbours come from ``faiss.IndexFlatIP`` searched in chunks of ``chunk_size`` queries: no
  N × N matrix is ever built. ``index="ivf"``/``"hnsw"`` give approximate neighbour lists, hence
  approximate metrics, for galleries far beyond the benchmarks.
* Two retrieval modes. *All vs all* (``gallery=None``): every item queries all *other* items, the query
  removed from its own list by index (its exact duplicates stay). *Query → gallery* (In-Shop): separate sets.
* Bad input (wrong shapes, mismatched lengths, non-finite embeddings, ``k`` larger than the gallery, an
  empty K list) raises ``ValueError`` naming the argument and what was expected.

The submodules import only :mod:`~dmlstudy.metrics.inputs` and each other in the order above, never this
package, so there are no import cycles (``tests/test_metrics.py`` checks it).
"""

from .clustering import (
    DEFAULT_KMEANS_ITERATIONS,
    FAISS_KMEANS_INITS,
    NMI_BACKENDS,
    NMI_FAISS_MIN_WORK,
    kmeans_assignments,
    nmi,
    nmi_backend_for,
)
from .evaluation import evaluate
from .geometry import density_terms, embedding_space_density, singular_value_spectrum, spectral_decay
from .inputs import ArrayLike, l2_normalize
from .neighbours import (
    DEFAULT_CHUNK_SIZE,
    GPU_MAX_K,
    INDEX_KINDS,
    INDEX_PARAMETERS,
    NeighborIndex,
    build_neighbor_index,
    default_nlist,
    index_parameters,
    nearest_neighbors,
)
from .relatives import masked_cosine, relative_mask, relatives_out_recall
from .retrieval import (
    DEFAULT_KS,
    class_subset_recall,
    recall_at_k,
    relevant_counts,
    retrieval_metrics,
    retrieval_metrics_from_neighbors,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_KMEANS_ITERATIONS",
    "DEFAULT_KS",
    "FAISS_KMEANS_INITS",
    "GPU_MAX_K",
    "INDEX_KINDS",
    "INDEX_PARAMETERS",
    "NMI_BACKENDS",
    "NMI_FAISS_MIN_WORK",
    "ArrayLike",
    "NeighborIndex",
    "build_neighbor_index",
    "class_subset_recall",
    "default_nlist",
    "density_terms",
    "embedding_space_density",
    "evaluate",
    "index_parameters",
    "kmeans_assignments",
    "l2_normalize",
    "masked_cosine",
    "nearest_neighbors",
    "nmi",
    "nmi_backend_for",
    "recall_at_k",
    "relative_mask",
    "relatives_out_recall",
    "relevant_counts",
    "retrieval_metrics",
    "retrieval_metrics_from_neighbors",
    "singular_value_spectrum",
    "spectral_decay",
]
