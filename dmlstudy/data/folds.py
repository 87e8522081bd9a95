"""Validation classes: class-disjoint folds of the training classes (Musgrave et al., "A Metric Learning
Reality Check", 2020, §4.2: hyperparameters and checkpoints are chosen on held-out *classes* of the
training split; the test classes are read once, by the final run).

``class_folds(n, folds)`` deals a fixed permutation of the ``n`` training classes round-robin into ``folds``
folds (sizes differ by at most one). The permutation is seeded by :data:`FOLD_SEED` alone, never by a run's
seed, so every method and every seed of a study holds out the same classes. ``split_by_classes`` cuts a
split into the images of some classes with labels renumbered 0 … k−1 in class order (what proxy and
classifier heads need) and the class names kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dmlstudy.data.base import ImageListDataset

FOLD_SEED = 0  # the one permutation of classes behind every fold split of the study


def class_folds(num_classes: int, folds: int, *, seed: int = FOLD_SEED) -> np.ndarray:
    """The fold (0 … folds−1) of each of ``num_classes`` classes; class-disjoint by construction."""
    if folds < 2:
        raise ValueError(f"validation folds must be ≥ 2, got {folds}")
    if folds > num_classes:
        raise ValueError(f"{folds} validation folds need at least {folds} training classes, got {num_classes}")
    order = np.random.default_rng(seed).permutation(num_classes)
    fold = np.empty(num_classes, dtype=np.int64)
    fold[order] = np.arange(num_classes) % folds
    return fold


def fold_classes(num_classes: int, folds: int, fold: int) -> tuple[np.ndarray, np.ndarray]:
    """``(training classes, validation classes)``: the classes outside and inside fold ``fold``, sorted."""
    if not 0 <= fold < folds:
        raise ValueError(f"validation fold must be in 0 … {folds - 1}, got {fold}")
    assignment = class_folds(num_classes, folds)
    return np.flatnonzero(assignment != fold), np.flatnonzero(assignment == fold)


def split_by_classes(dataset, classes: Sequence[int], *, role: str):
    """The images of ``classes`` of ``dataset`` (an :class:`ImageListDataset` or a tensor split with
    ``subset``), labels renumbered to 0 … len(classes)−1 in the order of ``classes``; ``role`` names the part
    in messages (e.g. "validation classes")."""
    classes = np.asarray(classes, dtype=np.int64)
    renumber = np.full(dataset.num_classes, -1, dtype=np.int64)
    renumber[classes] = np.arange(len(classes))
    rows = np.flatnonzero(renumber[dataset.labels] >= 0)
    labels = renumber[dataset.labels[rows]]
    names = [dataset.class_names[c] for c in classes]
    if isinstance(dataset, ImageListDataset):
        return ImageListDataset(
            [dataset.paths[i] for i in rows],
            labels,
            class_names=names,
            transform=dataset.transform,
            name=f"{dataset.name} ({role})",
            flip_invariant=dataset.flip_invariant,
        )
    part = dataset.subset(rows)
    part.labels, part.class_names = labels, names
    return part
