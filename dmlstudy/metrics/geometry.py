"""Embedding-space geometry of Roth et al., "Revisiting Training Strategies and Generalization Performance in
Deep Metric Learning", ICML 2020: the embedding-space density π_intra / π_inter and the spectral decay ρ.

Both are computed on L2-normalised embeddings with the cosine distance d(x, y) = 1 − x·y, in O(N · d) for the
density (pair sums come from class sums, never from a pairwise matrix) and one SVD for ρ.
"""

from __future__ import annotations

import numpy as np

from .inputs import ArrayLike, as_labels, l2_normalize, normalize_rows


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
    """``(π_intra, π_inter)`` of the embedding-space density (Roth et al., ICML 2020), d = 1 − cos.

    π_intra = mean over classes (those with ≥ 2 items; unweighted) of the mean distance between
    different items of the class; π_inter = mean distance between different L2-normalised class
    centroids (all classes, singletons included). Centroids are means of the L2-normalised embeddings.
    """
    x = l2_normalize(embeddings).astype(np.float64)
    y = as_labels(labels, n=len(x), name="labels")
    sums, squared_norms, counts = _class_sums(x, y)
    if len(counts) < 2:
        raise ValueError(f"labels: expected at least 2 classes for π_inter, got {len(counts)}")
    multi = counts >= 2
    if not multi.any():
        raise ValueError(
            "labels: expected at least one class with 2 or more items for π_intra, every class is a singleton"
        )
    pi_intra = float(np.mean(_mean_pairwise_cosine_distance(sums[multi], squared_norms[multi], counts[multi])))
    centroids = normalize_rows(sums / counts[:, None])  # C × d
    centroid_sum = centroids.sum(axis=0, keepdims=True)
    n_classes = np.array([len(counts)], dtype=np.float64)
    centroid_squared_norms = np.einsum("cd,cd->", centroids, centroids)[None]
    pi_inter = float(_mean_pairwise_cosine_distance(centroid_sum, centroid_squared_norms, n_classes)[0])
    return pi_intra, pi_inter


def embedding_space_density(embeddings: ArrayLike, labels: ArrayLike) -> float:
    """Embedding-space density ESD = π_intra / π_inter (Roth et al., ICML 2020); see :func:`density_terms`.

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
    largest values, normalised to sum 1; m is its length and U the uniform distribution over m values.
    ρ = 0 for a flat spectrum and grows as the spectrum decays; a zero singular value gives ``inf``.
    """
    spectrum = singular_value_spectrum(embeddings)
    if (
        isinstance(drop_first, (bool, np.bool_))
        or not isinstance(drop_first, (int, np.integer))
        or not 0 <= drop_first < len(spectrum)
    ):
        raise ValueError(f"drop_first: expected an integer in [0, {len(spectrum) - 1}], got {drop_first!r}")
    tail = spectrum[drop_first:]
    total = tail.sum()
    if total <= 0.0:
        return float("inf")
    m = len(tail)
    with np.errstate(divide="ignore"):
        rho = float(np.mean(np.log((1.0 / m) / (tail / total))))
    return max(rho, 0.0)
