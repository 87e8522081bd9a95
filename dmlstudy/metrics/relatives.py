"""Retrieval with each query's relatives out of its gallery: items drawn by a related family (two versions of one
designer's set) are removed from the query's gallery, so that a match by a near copy does not count."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .inputs import l2_normalize


def relative_mask(families: Sequence[str], *, relatives: Mapping[str, str]) -> np.ndarray:
    """``Q × Q`` boolean: item j is removed from query i's gallery (itself, or drawn by i's relative family, as
    ``relatives`` maps a family to its relative)."""
    families = np.asarray(families, dtype=object)
    partner = np.asarray([relatives.get(f, "") for f in families], dtype=object)
    mask = partner[:, None] == families[None, :]
    np.fill_diagonal(mask, True)
    return mask


def masked_cosine(embeddings: np.ndarray, families: Sequence[str], *, relatives: Mapping[str, str]) -> np.ndarray:
    """``Q × Q`` cosine similarities of the L2-normalised embeddings, ``-inf`` where :func:`relative_mask` removes
    the item from the query's gallery."""
    normed = l2_normalize(embeddings)
    cosine = normed @ normed.T
    cosine[relative_mask(families, relatives=relatives)] = -np.inf
    return cosine


def relatives_out_recall(
    embeddings: np.ndarray, labels: Sequence[int], families: Sequence[str], *, relatives: Mapping[str, str]
) -> float:
    """R@1 in points, all against all (the query excluded), each query's relative family out of its gallery:
    the label of the most cosine-similar remaining item equals the query's."""
    labels = np.asarray(labels)
    return float(
        100.0 * np.mean(labels[masked_cosine(embeddings, families, relatives=relatives).argmax(axis=1)] == labels)
    )
