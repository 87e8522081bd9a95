"""Cross-attention figures: the hierarchy diagram, the N × n heat map, the attention maps and the local parts."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from matplotlib.patches import FancyBboxPatch

from dmlstudy import plots
from dmlstudy.experiments.kit import device_of
from dmlstudy.explanations import COLOURBAR_SPACE, kind_colourbars, local_parts_figure
from dmlstudy.methods import EVAL_BATCH_SIZE
from dmlstudy.methods.cross_attention import AttentionRecorder, CrossAttention, feature_maps
from dmlstudy.plots import OVERLAY_CMAP, arrow, box, seen_image


def grid_heatmap(grid: pd.DataFrame, *, title: str = "") -> plt.Figure:
    """The N × n grid as a heat map (R@1 %, blank where n > N)."""
    levels = [c for c in grid.columns if c.startswith("n=")]
    values = grid[levels].to_numpy(dtype=float)
    figure, axis = plt.subplots(figsize=(1.0 + 0.75 * len(levels), 0.9 + 0.5 * len(grid)))
    image = axis.imshow(np.ma.masked_invalid(values), cmap="viridis", aspect="auto")
    for (row, column), value in np.ndenumerate(values):
        if not np.isnan(value):
            axis.text(
                column,
                row,
                f"{value:.1f}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if value < np.nanmean(values) else "black",
            )
    axis.set(
        xticks=range(len(levels)),
        xticklabels=[c[2:] for c in levels],
        yticks=range(len(grid)),
        yticklabels=[str(n) for n in grid.index],
        xlabel="inference level n (sⁿ)",
        ylabel="trained blocks N",
        title=title or "R@1 (%) of sⁿ on a test subset",
    )
    figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04)
    figure.tight_layout()
    return figure


def hierarchy_diagram(*, levels: int = 3, channels: int = 128, grid: int = 4, embedding_dim: int = 128) -> plt.Figure:
    """The hierarchy of Eq. 4 for one pair (i, j): each level of image i attends over E_i (keys/values, blue)
    with the previous level of image j as its query (orange), and vice versa; sᴺ compares the last pair."""
    figure, axis = plt.subplots(figsize=(10, 1.9 + 0.95 * levels))
    top = 0.9 + levels
    axis.set(xlim=(0, 10), ylim=(-0.55, top + 1.0))
    axis.axis("off")
    columns = {"i": 3.05, "j": 6.95}  # centres of the two embedding columns
    memories = {"i": 0.75, "j": 9.25}  # centres of the feature-map boxes, outside the columns
    width = 2.7
    for name, x in columns.items():
        other = "j" if name == "i" else "i"
        side = memories[name]
        axis.add_patch(
            FancyBboxPatch(
                (side - 0.55, 0.45), 1.1, top - 0.45, boxstyle="round,pad=0.05", facecolor="#c6dbef", edgecolor="0.3"
            )
        )
        axis.text(
            side,
            (top + 0.45) / 2,
            f"E_{name}\n{grid}×{grid}×{channels}\n\nLN,\nthen\nK, V\n(once)",
            ha="center",
            va="center",
            fontsize=8,
        )
        box(axis, (x, 0.9), f"φ⁰({name}) = Linear(avgpool E_{name})", width=width, height=0.55, colour="#e5f5e0")
        start, edge = (side + 0.55, x - width / 2) if name == "i" else (side - 0.55, x + width / 2)
        arrow(axis, (start, 0.9), (edge, 0.9), colour="0.35")
        for level in range(1, levels + 1):
            y = 0.9 + level
            box(
                axis,
                (x, y),
                f"φ{_sup(level)}({name}|{other}) = CA(φ{_sup(level - 1)}({other}|{name}), E_{name}, E_{name})",
                width=width,
                height=0.55,
            )
            edge = x - width / 2 if name == "i" else x + width / 2
            arrow(axis, (side + (0.55 if name == "i" else -0.55), y), (edge, y), colour="#3182bd", linestyle=":")
    inner_i, inner_j = columns["i"] + width / 2, columns["j"] - width / 2
    for level in range(1, levels + 1):  # queries cross over: level n of i is conditioned on level n − 1 of j
        y = 0.9 + level
        arrow(axis, (inner_j, y - 1.0), (inner_i, y), colour="#e6550d")
        arrow(axis, (inner_i, y - 1.0), (inner_j, y), colour="#e6550d")
    axis.text(
        5.0,
        top + 0.55,
        f"s{_sup(levels)}(i, j) = cos(φ{_sup(levels)}(i|j), φ{_sup(levels)}(j|i))  →  Multi-Similarity loss",
        ha="center",
        fontsize=9.5,
        color="#a50f15",
    )
    axis.text(
        5.0,
        -0.3,
        "grey: average pooling;  orange: the query q̂ = the OTHER image's previous level, normalised;  "
        f"blue dotted: keys and values from the image's own feature map;  d = {embedding_dim}",
        ha="center",
        va="center",
        fontsize=7.5,
    )
    axis.set_title(
        "Training only — a B × B × d tensor per level for all ordered pairs of the batch; test time uses φ⁰ alone",
        fontsize=9,
    )
    return figure


def _sup(number: int) -> str:
    return str(number).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


def attention_figure(
    method: CrossAttention, dataset, triples: Sequence[tuple[int, int, int]], *, blocks: Sequence[int] = (2, 4, 6)
) -> plt.Figure:
    """For each triple (x, a, b): Attn over x's locations at the given blocks when x is conditioned on a (top),
    on b (bottom), and their difference (middle, red = more weight when conditioned on a). Each panel is scaled
    by its own largest value (titles give it; uniform attention is 1/hw); one colour bar per kind, under the maps,
    gives the scaled units."""
    blocks = [n for n in blocks if 1 <= n <= method.num_blocks]
    if not blocks:
        raise ValueError(f"attention_figure: none of the blocks is in 1..{method.num_blocks}")
    figure, axes = plt.subplots(
        3 * len(triples), len(blocks) + 1, figsize=(1.7 * (len(blocks) + 1), 1.75 * 3 * len(triples)), squeeze=False
    )
    device = device_of(method)
    overlays = {}  # is-difference → the last overlay drawn with that scale (for the colourbars)
    for example, (x, a, b) in enumerate(triples):
        images = torch.stack([dataset[i][0] for i in (x, a, b)]).to(device)
        was_training = method.training
        method.eval()
        with torch.no_grad(), AttentionRecorder(method) as recorder:
            maps = method.backbone(images)
            method.conditional_embeddings(maps, num_levels=max(blocks))
        method.train(was_training)
        height, width = maps.shape[-2:]
        picture = seen_image(dataset, x)
        rows = 3 * example
        for offset, (index, label) in enumerate(
            ((a, "conditioned on a\n(same class)"), (x, "image x"), (b, "conditioned on b\n(other class)"))
        ):
            axis = axes[rows + offset, 0]
            axis.imshow(seen_image(dataset, index))
            axis.set_ylabel(label, fontsize=7)
        for column, level in enumerate(blocks, start=1):
            weights = recorder.maps[level - 1]  # 3 × 3 × T; [0, j] = x conditioned on image j
            on_a, on_b = (weights[0, j].reshape(height, width).numpy() for j in (1, 2))
            for offset, (heat, cmap, limits) in enumerate(
                ((on_a, OVERLAY_CMAP, (0, 1)), (on_a - on_b, "RdBu_r", (-1, 1)), (on_b, OVERLAY_CMAP, (0, 1)))
            ):
                axis = axes[rows + offset, column]
                axis.imshow(picture)
                bound = float(np.abs(heat).max()) or 1.0
                vmin, vmax = limits
                overlays[offset == 1] = axis.imshow(
                    heat / bound,
                    cmap=cmap,
                    alpha=0.55,
                    vmin=vmin,
                    vmax=vmax,
                    interpolation="bilinear",
                    extent=(-0.5, picture.shape[1] - 0.5, picture.shape[0] - 0.5, -0.5),
                )
                axis.set_title(
                    f"block {level}, a − b\nmax |Δ| {bound:.2f}"
                    if offset == 1
                    else f"block {level}\nmax weight {heat.max():.2f}",
                    fontsize=7,
                )
    for axis in axes.flat:
        axis.set_xticks([])
        axis.set_yticks([])
    figure.tight_layout(rect=(0, COLOURBAR_SPACE / figure.get_figheight(), 1, 1))
    kind_colourbars(
        figure,
        axes,
        [(overlays[False], "attention / panel maximum"), (overlays[True], "(a − b) / panel max |Δ|")],
    )
    return plots.credit(figure, dataset)


def part_discovery(
    method: CrossAttention,
    dataset,
    *,
    queries: int = 2,
    neighbours: int = 6,
    seed: int = 0,
    batch_size: int = EVAL_BATCH_SIZE,
) -> tuple[plt.Figure, pd.DataFrame]:
    """Local parts (the paper's Sec. 4.3.2, Fig. 5): for the most activated location of a query image, the
    test images whose best-matching location (cosine of backbone features) is most similar, drawn as crops
    framed blue (same class as the query) or vermillion; with the share of same-class matches per query."""
    device = device_of(method)
    maps = feature_maps(method, dataset, batch_size=batch_size, device=device)  # N × C × H × W
    return local_parts_figure(maps, dataset, queries=queries, neighbours=neighbours, seed=seed)
