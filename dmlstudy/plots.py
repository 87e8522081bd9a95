"""Figures drawn from run records (history, embeddings, datasets); each function returns a matplotlib Figure.

``save_figure`` writes PNGs into ``figures/`` (the default study's figures are committed).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle

from dmlstudy import metrics as metric_functions
from dmlstudy.paths import study_outputs

CORRECT, WRONG = "#1a9850", "#d73027"


def save_figure(figure: plt.Figure, name: str, *, study: str, folder: str | Path | None = None, dpi: int = 120) -> Path:
    """Save ``figure`` as ``<folder>/<name>.png`` and return the path; ``folder`` defaults to the study's
    figures folder (:func:`~dmlstudy.paths.study_outputs`: ``<project>/figures`` for the published study)."""
    folder = Path(folder) if folder else study_outputs(study, "figures")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    figure.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def source_image(dataset, index: int) -> np.ndarray:
    """The untransformed RGB image (H × W × 3 uint8) of item ``index`` of a dataset or a Subset of one."""
    while hasattr(dataset, "indices") and hasattr(dataset, "dataset"):
        index, dataset = dataset.indices[index], dataset.dataset
    return np.asarray(dataset.load_image(index))


def training_curves(history: pd.DataFrame, *, metric: str = "R@1", title: str = "") -> plt.Figure:
    """Training loss per epoch and the test ``metric`` at each evaluation."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    left.plot(history["epoch"], history["loss"], marker="o")
    left.set(xlabel="epoch", ylabel="training loss", title="loss")
    evaluated = history.dropna(subset=[metric]) if metric in history else history.iloc[0:0]
    right.plot(evaluated["epoch"], 100 * evaluated[metric], marker="o", color="C1")
    right.set(xlabel="epoch", ylabel=f"{metric} (%)", title=f"test {metric}")
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def recall_curve(metrics: dict[str, float], *, title: str = "") -> plt.Figure:
    """Recall@K against K from a metrics dict (keys ``R@K``)."""
    ks = sorted(int(key[2:]) for key in metrics if key.startswith("R@"))
    figure, axis = plt.subplots(figsize=(4, 3))
    axis.plot(ks, [100 * metrics[f"R@{k}"] for k in ks], marker="o")
    axis.set(xscale="log", xticks=ks, xticklabels=[str(k) for k in ks], xlabel="K", ylabel="Recall@K (%)", title=title or "Recall@K")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def _framed(axis: plt.Axes, image: np.ndarray, colour: str | None, title: str = "") -> None:
    axis.imshow(image)
    axis.set_xticks([])
    axis.set_yticks([])
    if colour:
        height, width = image.shape[:2]
        axis.add_patch(Rectangle((0, 0), width - 1, height - 1, fill=False, edgecolor=colour, linewidth=4))
    axis.set_title(title, fontsize=8)


def retrieval_grid(dataset, embeddings: np.ndarray, labels: np.ndarray, *, queries: Sequence[int] | None = None, num_queries: int = 5, top_k: int = 5, seed: int = 0, ranking: np.ndarray | None = None) -> plt.Figure:
    """Queries (left column) and their top-``top_k`` retrievals, framed green (same class) or red.

    ``ranking`` (queries × ≥ top_k gallery indices) overrides the cosine ranking, e.g. a re-ranked list.
    """
    labels = np.asarray(labels)
    if queries is None:
        queries = np.random.default_rng(seed).choice(len(labels), size=min(num_queries, len(labels)), replace=False)
    queries = np.asarray(queries)
    if ranking is None:
        ranking, _ = metric_functions.nearest_neighbors(np.asarray(embeddings)[queries], np.asarray(embeddings), k=top_k + 1)
        ranking = np.stack([row[row != q][:top_k] for row, q in zip(ranking, queries)])
    figure, axes = plt.subplots(len(queries), top_k + 1, figsize=(1.4 * (top_k + 1), 1.5 * len(queries)), squeeze=False)
    for row, query in enumerate(queries):
        _framed(axes[row, 0], source_image(dataset, query), None, "query" if row == 0 else "")
        for column, hit in enumerate(ranking[row][:top_k], start=1):
            colour = CORRECT if labels[hit] == labels[query] else WRONG
            _framed(axes[row, column], source_image(dataset, hit), colour, f"#{column}" if row == 0 else "")
    figure.tight_layout()
    return figure


def spectrum(embeddings_by_name: dict[str, np.ndarray], *, drop_first: int = 0, top: int | None = None, title: str = "") -> plt.Figure:
    """Normalised singular-value spectra (after dropping ``drop_first``) with ρ in the legend."""
    figure, axis = plt.subplots(figsize=(5, 3.2))
    for name, embeddings in embeddings_by_name.items():
        values = metric_functions.singular_value_spectrum(embeddings)[drop_first:]
        values = values / values.sum()
        rho = metric_functions.spectral_decay(embeddings, drop_first=drop_first)
        shown = values[:top] if top else values
        axis.plot(np.arange(1 + drop_first, 1 + drop_first + len(shown)), shown, label=f"{name} (ρ = {rho:.3f})")
    axis.set(yscale="log", xlabel="singular value index", ylabel="normalised singular value", title=title or f"spectrum (drop_first = {drop_first})")
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def image_grid(images: Sequence[np.ndarray], *, columns: int, titles: Sequence[str] | None = None, row_labels: Sequence[str] | None = None, size: float = 1.2) -> plt.Figure:
    """Images in a grid, optionally with titles per image and labels per row."""
    rows = int(np.ceil(len(images) / columns))
    figure, axes = plt.subplots(rows, columns, figsize=(size * columns, size * rows), squeeze=False)
    for axis in axes.flat:
        axis.axis("off")
    for index, image in enumerate(images):
        axis = axes.flat[index]
        axis.imshow(image)
        if titles is not None:
            axis.set_title(titles[index], fontsize=7)
    if row_labels is not None:
        for row, label in enumerate(row_labels):
            axes[row, 0].text(-0.1, 0.5, label, transform=axes[row, 0].transAxes, ha="right", va="center", fontsize=8)
    figure.tight_layout()
    return figure
