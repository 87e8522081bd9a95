"""Figures drawn from run records (history, embeddings, datasets); each function returns a matplotlib Figure.

``save_figure`` writes PNGs into ``figures/`` (the default study's figures are committed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

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
    axis.set(
        xscale="log",
        xticks=ks,
        xticklabels=[str(k) for k in ks],
        xlabel="K",
        ylabel="Recall@K (%)",
        title=title or "Recall@K",
    )
    axis.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def seen_image(dataset, index: int) -> np.ndarray:
    """The test-transformed image the network saw (item ``index`` of ``dataset``), H × W × 3 in [0, 1]."""
    from dmlstudy.data import denormalize

    return denormalize(dataset[index][0]).permute(1, 2, 0).numpy()


def _framed(axis: plt.Axes, image: np.ndarray, colour: str | None, title: str = "") -> None:
    axis.imshow(image)
    axis.set_xticks([])
    axis.set_yticks([])
    if colour:
        height, width = image.shape[:2]
        axis.add_patch(Rectangle((0, 0), width - 1, height - 1, fill=False, edgecolor=colour, linewidth=4))
    axis.set_title(title, fontsize=8)


def retrieval_grid(
    dataset,
    embeddings: np.ndarray,
    labels: np.ndarray,
    *,
    queries: Sequence[int] | None = None,
    num_queries: int = 5,
    top_k: int = 5,
    seed: int = 0,
    ranking: np.ndarray | None = None,
) -> plt.Figure:
    """Queries (left column) and their top-``top_k`` retrievals, framed green (same class) or red.

    ``ranking`` (queries × ≥ top_k gallery indices) overrides the cosine ranking, e.g. a re-ranked list.
    """
    labels = np.asarray(labels)
    if queries is None:
        queries = np.random.default_rng(seed).choice(len(labels), size=min(num_queries, len(labels)), replace=False)
    queries = np.asarray(queries)
    if ranking is None:
        ranking, _ = metric_functions.nearest_neighbors(
            np.asarray(embeddings)[queries], np.asarray(embeddings), k=top_k + 1
        )
        ranking = np.stack([row[row != q][:top_k] for row, q in zip(ranking, queries)])
    figure, axes = plt.subplots(len(queries), top_k + 1, figsize=(1.4 * (top_k + 1), 1.5 * len(queries)), squeeze=False)
    for row, query in enumerate(queries):
        _framed(axes[row, 0], source_image(dataset, query), None, "query" if row == 0 else "")
        for column, hit in enumerate(ranking[row][:top_k], start=1):
            colour = CORRECT if labels[hit] == labels[query] else WRONG
            _framed(axes[row, column], source_image(dataset, hit), colour, f"#{column}" if row == 0 else "")
    figure.tight_layout()
    return figure


def spectrum(
    embeddings_by_name: dict[str, np.ndarray], *, drop_first: int = 0, top: int | None = None, title: str = ""
) -> plt.Figure:
    """Normalised singular-value spectra (after dropping ``drop_first``) with ρ in the legend."""
    figure, axis = plt.subplots(figsize=(5, 3.2))
    for name, embeddings in embeddings_by_name.items():
        values = metric_functions.singular_value_spectrum(embeddings)[drop_first:]
        values = values / values.sum()
        rho = metric_functions.spectral_decay(embeddings, drop_first=drop_first)
        shown = values[:top] if top else values
        axis.plot(np.arange(1 + drop_first, 1 + drop_first + len(shown)), shown, label=f"{name} (ρ = {rho:.3f})")
    axis.set(
        yscale="log",
        xlabel="singular value index",
        ylabel="normalised singular value",
        title=title or f"spectrum (drop_first = {drop_first})",
    )
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def image_grid(
    images: Sequence[np.ndarray],
    *,
    columns: int,
    titles: Sequence[str] | None = None,
    row_labels: Sequence[str] | None = None,
    size: float = 1.2,
) -> plt.Figure:
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


# ----------------------------------------------------------------------------------------------
# Figures that explain a method (used by the method notebooks and by 95_explore)
# ----------------------------------------------------------------------------------------------
def selective_prototypes(maps, count: int) -> list[int]:
    """The ``count`` prototypes whose code maps vary most over the grid (coefficient of variation, averaged over images)."""
    flat = maps.flatten(2)  # B × K × HW
    variation = (flat.std(dim=2) / flat.mean(dim=2).clamp_min(1e-12)).mean(dim=0)
    return variation.argsort(descending=True)[:count].tolist()


def crt_heatmap_figure(method, dataset, indices: Sequence[int], *, prototypes: int = 8, branch: int = 1) -> plt.Figure:
    """Code maps a_jk of ``prototypes`` prototypes (the most spatially selective) upsampled and overlaid on images.

    Each map is min–max scaled per image and prototype (the colour shows where a prototype fires, not how
    strongly in absolute terms); the title gives the map's mean code.
    """
    import torch
    import torch.nn.functional as F

    from dmlstudy.methods.crt import code_maps

    images = torch.stack([dataset[i][0] for i in indices]).to(next(method.parameters()).device)
    maps = code_maps(method, images, branch=branch)  # B × K × h × w
    chosen = selective_prototypes(maps, min(prototypes, maps.shape[1]))
    upsampled = F.interpolate(maps[:, chosen], size=images.shape[-2:], mode="bilinear", align_corners=False).cpu()
    figure, axes = plt.subplots(
        len(indices), len(chosen) + 1, figsize=(1.5 * (len(chosen) + 1), 1.6 * len(indices)), squeeze=False
    )
    for row, index in enumerate(indices):
        picture = source_image(dataset, index)
        axes[row, 0].imshow(picture)
        axes[row, 0].set_title("image", fontsize=8)
        for column, prototype in enumerate(chosen, start=1):
            heat = upsampled[row, column - 1].numpy()
            scaled = (heat - heat.min()) / max(float(heat.max() - heat.min()), 1e-12)
            axes[row, column].imshow(picture)
            axes[row, column].imshow(
                np.asarray(scaled),
                cmap="jet",
                alpha=0.5,
                extent=(-0.5, picture.shape[1] - 0.5, picture.shape[0] - 0.5, -0.5),
            )
            axes[row, column].set_title(f"c_{prototype} (ā={float(maps[row, prototype].mean()):.2f})", fontsize=7)
    for axis in axes.flat:
        axis.set_xticks([])
        axis.set_yticks([])
    figure.tight_layout()
    return figure


def crt_correlation_figure(method, *, branch: int = 1) -> plt.Figure:
    """The K × K |cos| matrix between the learned prototypes (L_DIV pushes its off-diagonal towards 0)."""
    from dmlstudy.methods.crt import prototype_correlation

    matrix = prototype_correlation(method, branch=branch).cpu().numpy()
    count = len(matrix)
    off = matrix[~np.eye(count, dtype=bool)]
    figure, axis = plt.subplots(figsize=(4.2, 3.6))
    image = axis.imshow(matrix, vmin=0, vmax=1, cmap="viridis")
    figure.colorbar(image, ax=axis)
    title = f"|cos(c_k, c_j)|, K = {count}" + (f"; off-diagonal mean {off.mean():.3f}" if count > 1 else "")
    axis.set(title=title, xlabel="prototype j", ylabel="prototype k")
    figure.tight_layout()
    return figure


def _cell_centres(grid: int, size: int) -> np.ndarray:
    """Pixel centres (x, y) of the G × G cells of a ``size``-pixel image, row-major."""
    centres = (np.arange(grid) + 0.5) * size / grid
    ys, xs = np.meshgrid(centres, centres, indexing="ij")
    return np.stack([xs.ravel(), ys.ravel()], axis=1)


def diml_transport_figure(
    result,
    sets: Mapping,
    *,
    grid: int,
    queries: Sequence[int],
    retrievals: int = 3,
    options=None,
    top_lines: int | None = None,
) -> plt.Figure:
    """For each query and its top cosine retrievals: the two images side by side with the transport plan drawn
    as lines between grid-cell centres (width and opacity ∝ T_ij; the ``top_lines`` largest entries, default G²), and
    the marginals μ_s (on the query's cells) and μ_t (on the retrieval's) as G × G heat maps.

    Cells are regions of the backbone map; at 64 px with stride 16 each of the 4 × 4 cells covers 16 × 16
    pixels of the input (its receptive field is larger). All-vs-all sets only.
    """
    import torch

    from dmlstudy.methods.diml import pairwise_structural_similarity
    from dmlstudy.train import load_datasets

    query_set = sets["query"]
    if sets.get("gallery") is not None:
        raise ValueError("diml_transport_figure: expected an all-vs-all evaluation set (no separate gallery)")
    dataset = load_datasets(result.config)["query"]
    global_, local, labels = (
        torch.as_tensor(query_set.global_),
        torch.as_tensor(query_set.local[grid]),
        query_set.labels,
    )
    neighbours, _ = metric_functions.nearest_neighbors(
        query_set.global_[list(queries)], query_set.global_, k=retrievals + 1
    )
    lines = top_lines or grid * grid
    figure, axes = plt.subplots(
        len(queries) * retrievals,
        3,
        figsize=(7.5, 2.3 * len(queries) * retrievals),
        gridspec_kw={"width_ratios": [2.2, 1, 1]},
        squeeze=False,
    )
    row = 0
    for query, hits in zip(queries, neighbours):
        hits = [h for h in hits if h != query][:retrievals]
        for rank, hit in enumerate(hits, start=1):
            value, _, transport = pairwise_structural_similarity(
                local[[query]], global_[[query]], local[[hit]], global_[[hit]], options=options
            )
            plan = transport.plan[0, 0].numpy()  # G² × G²
            left, right = source_image(dataset, query), source_image(dataset, hit)
            size = left.shape[0]
            axis = axes[row, 0]
            axis.imshow(np.concatenate([left, np.full((size, size // 8, 3), 255, np.uint8), right], axis=1))
            offset = size + size // 8
            centres = _cell_centres(grid, size)
            for edge in np.arange(1, grid) * size / grid:  # the grid cells
                for x0 in (0, offset):
                    axis.plot([x0 + edge, x0 + edge], [0, size - 1], color="white", linewidth=0.5, alpha=0.6)
                    axis.plot([x0, x0 + size - 1], [edge, edge], color="white", linewidth=0.5, alpha=0.6)
            for flat in np.argsort(plan.ravel())[::-1][:lines]:
                i, j = divmod(int(flat), grid * grid)
                strength = plan[i, j] / plan.max()
                axis.plot(
                    [centres[i, 0], centres[j, 0] + offset],
                    [centres[i, 1], centres[j, 1]],
                    color="yellow",
                    linewidth=0.3 + 3.0 * strength,
                    alpha=0.25 + 0.7 * strength,
                )
            same = labels[hit] == labels[query]
            axis.set_title(
                f"query {query} → #{rank} ({'same class' if same else 'other class'}): cos {float(global_[query] @ global_[hit]):.2f}, "
                f"s_struct {value.item():.2f}",
                fontsize=7,
                color=CORRECT if same else WRONG,
            )
            axis.axis("off")
            for axis, marginal, title in (
                (axes[row, 1], plan.sum(axis=1), "μ_s (query cells)"),
                (axes[row, 2], plan.sum(axis=0), "μ_t (retrieval cells)"),
            ):
                axis.imshow(marginal.reshape(grid, grid), cmap="magma")
                axis.set_title(title, fontsize=7)
                axis.set_xticks([])
                axis.set_yticks([])
            row += 1
    figure.tight_layout()
    return figure


def cross_attention_explanation(
    method, dataset, query: int, retrievals: Sequence[int], *, level: int | None = None
) -> plt.Figure | str:
    """Cross-attention at block ``level`` (default the last): for each retrieval r, the attention over the
    query's locations when the query is conditioned on r, and over r's locations when r is conditioned on
    the query; one pass of the hierarchy over the batch [query, retrievals…], recorded with forward hooks."""
    import torch

    from dmlstudy.methods.cross_attention import AttentionRecorder

    if not method.num_blocks:
        return "cross-attention with N = 0 blocks: no attention to show"
    level = level or method.num_blocks
    device = next(method.parameters()).device
    indices = [query, *retrievals]
    images = torch.stack([dataset[i][0] for i in indices]).to(device)
    was_training = method.training
    method.eval()
    with torch.no_grad(), AttentionRecorder(method) as recorder:
        maps = method.backbone(images)
        method.conditional_embeddings(maps, num_levels=level)
    method.train(was_training)
    weights = recorder.maps[level - 1]  # X × X × T: [i, j] = image i's locations, conditioned on image j
    height, width = maps.shape[-2:]
    labels = np.asarray(dataset.labels)
    figure, axes = plt.subplots(len(retrievals), 2, figsize=(4.2, 2.1 * len(retrievals)), squeeze=False)
    for row, retrieval in enumerate(retrievals, start=1):
        colour = CORRECT if labels[retrieval] == labels[query] else WRONG
        for axis, (image, other, title) in zip(
            axes[row - 1], ((0, row, f"query | #{row}"), (row, 0, f"#{row} | query"))
        ):
            picture = seen_image(dataset, indices[image])
            heat = weights[image, other].reshape(height, width).numpy()
            axis.imshow(picture)
            axis.imshow(
                heat,
                cmap="jet",
                alpha=0.5,
                interpolation="bilinear",
                vmin=0,
                vmax=float(heat.max()) or 1.0,
                extent=(-0.5, picture.shape[1] - 0.5, picture.shape[0] - 0.5, -0.5),
            )
            axis.set_title(title, fontsize=8, color=colour)
            axis.set_xticks([])
            axis.set_yticks([])
    figure.tight_layout()
    figure.suptitle(
        f"attention of block {level}: where an image looks when conditioned on the other\n"
        "(title green: the retrieval is of the query's class; red: another class)",
        fontsize=8,
        y=1.0 + 0.35 / figure.get_figheight(),
    )
    return figure
