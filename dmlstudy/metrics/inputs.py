"""What every metric takes, validated once: embeddings, labels, K values, positive integers.

Embeddings become C-contiguous float32 N × d arrays with finite values; labels become 1-D arrays of integers
or strings. Inputs may be numpy arrays, torch tensors (any device; gradients are detached, torch is never
imported here) or nested sequences. Bad input raises ``ValueError`` naming the argument and what was expected.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

ArrayLike = Any  # numpy array, torch tensor or nested sequence
NORM_EPS = 1e-12  # norms below this are floored, so zero rows stay zero after normalisation


def to_numpy(x: ArrayLike) -> np.ndarray:
    """A numpy view or copy of ``x``; a torch tensor is detached and moved to the CPU."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.float()  # bfloat16/half have no (or a lossy) numpy counterpart
        x = x.numpy()
    return np.asarray(x)


def positive_int(value: int, *, name: str) -> int:
    """``value`` as an int, which must be a positive integer (``bool`` is rejected)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def as_k(k: int, *, n_retrievable: int) -> int:
    """A neighbour count k with 1 ≤ k ≤ ``n_retrievable``."""
    k = positive_int(k, name="k")
    if k > n_retrievable:
        raise ValueError(f"k: k={k} is larger than the {n_retrievable} retrievable gallery items")
    return k


def as_ks(ks: Iterable[int], *, n_gallery: int) -> tuple[int, ...]:
    """Sorted distinct K values of Recall@K, each an integer in [1, ``n_gallery``]."""
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


def as_embeddings(x: ArrayLike, *, name: str) -> np.ndarray:
    """``x`` as a C-contiguous float32 N × d array with N, d ≥ 1 and only finite values."""
    arr = to_numpy(x)
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


def as_labels(y: ArrayLike, *, name: str, n: int | None = None) -> np.ndarray:
    """``y`` as a 1-D array of class labels (integers or strings); ``n``: the length it must have."""
    arr = to_numpy(y)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of class labels, got shape {arr.shape}")
    if n is not None and len(arr) != n:
        raise ValueError(f"{name}: expected {n} labels (one per embedding row), got {len(arr)}")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ValueError(f"{name}: expected finite labels, found NaN/inf")
    if arr.dtype.kind not in "biufUS":
        raise ValueError(f"{name}: expected integer or string labels, got dtype {arr.dtype}")
    return arr


def check_label_kinds(query_labels: np.ndarray, gallery_labels: np.ndarray) -> None:
    """Query and gallery labels must both be numeric or both strings (else no class could ever match)."""
    numeric = "biuf"
    if (query_labels.dtype.kind in numeric) != (gallery_labels.dtype.kind in numeric):
        raise ValueError(
            "labels and gallery_labels: expected the same kind of label (both numeric or both strings), "
            f"got {query_labels.dtype} and {gallery_labels.dtype}"
        )


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` divided by their L2 norm, computed in float64 and floored at :data:`NORM_EPS` (a zero
    row stays zero); keeps the dtype. ``x`` must already be validated."""
    norms = np.sqrt(np.einsum("nd,nd->n", x, x, dtype=np.float64))
    return (x / np.maximum(norms, NORM_EPS)[:, None].astype(x.dtype)).astype(x.dtype, copy=False)


def l2_normalize(x: ArrayLike, *, name: str = "embeddings") -> np.ndarray:
    """Row-wise L2-normalised copy of an N × d array, float32: x_i / max(‖x_i‖₂, 1e-12).

    Rows of norm zero stay zero (they then have cosine similarity 0 to everything). ``name`` is the
    argument named in error messages.
    """
    return np.ascontiguousarray(normalize_rows(as_embeddings(x, name=name)))


def as_query_gallery(
    queries: ArrayLike, gallery: ArrayLike | None, *, query_name: str, gallery_name: str = "gallery"
) -> tuple[np.ndarray, np.ndarray | None]:
    """L2-normalised float32 ``(queries, gallery)``; ``gallery`` None (all vs all) stays None, otherwise its
    embedding dimension must equal the queries'."""
    q = l2_normalize(queries, name=query_name)
    if gallery is None:
        return q, None
    g = as_embeddings(gallery, name=gallery_name)
    if g.shape[1] != q.shape[1]:
        raise ValueError(
            f"{gallery_name}: expected embedding dimension {q.shape[1]} (as in {query_name}), got {g.shape[1]}"
        )
    return q, normalize_rows(g)
