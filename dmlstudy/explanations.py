"""Figures of what a trained method shows, drawn in the study's style (:mod:`dmlstudy.plots`): its explanation of a
retrieval (:meth:`dmlstudy.methods.Method.explain`, drawn by its kind: heat maps over the images, or transport plans
between their grids), the local parts of a backbone's feature maps, and one colour bar per kind of overlaid panel."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import patheffects
from matplotlib.patches import Rectangle

from dmlstudy.plots import CORRECT, OVERLAY_CMAP, PALETTE, WRONG, credit, heatmap, overlay_colourbar, seen_image

COLOURBAR_SPACE = 0.8  # inches under the attention maps for their colour bars


def kind_colourbars(figure: plt.Figure, panels: np.ndarray, kinds: Sequence[tuple], *, height: float = 0.12) -> None:
    """One horizontal colour bar per panel kind (``kinds``: the overlay drawn with its scale, the bar's label),
    side by side in the :data:`COLOURBAR_SPACE` under the whole width of ``panels`` (a single block column is too
    narrow for two labelled bars): the kinds alternate by row, so a bar beside the panels would span rows of both.
    Opaque although the overlays are translucent. Call after ``tight_layout``."""
    left = min(axis.get_position().x0 for axis in panels.flat)
    right = max(axis.get_position().x1 for axis in panels.flat)
    gap = 0.1 * (right - left)
    width = (right - left - gap * (len(kinds) - 1)) / len(kinds)
    inch = 1 / figure.get_figheight()
    for index, (overlay, label) in enumerate(kinds):
        cax = figure.add_axes((left + index * (width + gap), COLOURBAR_SPACE * inch * 0.55, width, height * inch))
        colourbar = figure.colorbar(overlay, cax=cax, orientation="horizontal")
        colourbar.solids.set(alpha=1.0)
        low, high = overlay.get_clim()
        colourbar.set_ticks([low, (low + high) / 2, high])
        colourbar.set_label(label, fontsize=7)
        colourbar.ax.tick_params(labelsize=7)


def local_parts_figure(
    maps, dataset, *, queries: int = 2, neighbours: int = 6, seed: int = 0
) -> tuple[plt.Figure, pd.DataFrame]:
    """Local parts of a backbone's feature maps (``maps``: N × C × H × W of ``dataset``, in its order), as the
    cross-attention paper's Fig. 5 reads them: for the most activated interior location of a query image, the images
    whose best-matching location (cosine of the features) is most similar, drawn as crops framed blue (same class as
    the query) or vermillion; with the share of same-class matches per query beside chance."""
    import torch
    import torch.nn.functional as F

    count, channels, height, width = maps.shape
    locations = F.normalize(maps.flatten(2).transpose(1, 2), dim=-1)  # N × T × C
    labels = np.asarray(dataset.labels)
    chosen = np.random.default_rng(seed).choice(count, size=min(queries, count), replace=False)
    figure, axes = plt.subplots(
        len(chosen), neighbours + 1, figsize=(1.45 * (neighbours + 1), 1.6 * len(chosen)), squeeze=False
    )
    rows = []
    interior = torch.zeros(height, width, dtype=torch.bool, device=maps.device)
    interior[1:-1, 1:-1] = True
    if not interior.any():  # grids smaller than 3 × 3 have no interior
        interior[:] = True
    for row, query in enumerate(chosen):
        activation = maps[query].norm(dim=0).masked_fill(~interior, float("-inf"))  # H × W
        cell = int(activation.flatten().argmax())
        similarity = torch.einsum("c,ntc->nt", locations[query, cell], locations)  # N × T
        best, where = similarity.max(dim=1)
        best[query] = float("-inf")
        order = best.argsort(descending=True)[:neighbours].cpu().numpy()
        picture = seen_image(dataset, query)
        _crop_axis(axes[row, 0], picture, cell, (height, width), frame="#ff7f00", title="query part")
        same = 0
        for column, other in enumerate(order, start=1):
            colour = CORRECT if labels[other] == labels[query] else WRONG
            same += int(labels[other] == labels[query])
            _crop_axis(
                axes[row, column],
                seen_image(dataset, int(other)),
                int(where[other]),
                (height, width),
                frame=colour,
                title=f"cos {float(best[other]):.2f}",
                crop=True,
            )
        rows.append(
            {
                "query image": int(query),
                "location (row, col)": divmod(cell, width),
                "same class among top": f"{same}/{len(order)}",
                "chance (%)": f"{100 * (np.sum(labels == labels[query]) - 1) / (count - 1):.1f}",
            }
        )
    figure.tight_layout()
    return credit(figure, dataset), pd.DataFrame(rows)


def _crop_axis(
    axis, picture: np.ndarray, cell: int, grid: tuple[int, int], *, frame: str, title: str, crop: bool = False
) -> None:
    """Show the whole picture with the cell outlined, or (``crop``) a two-cell window around the cell, framed."""
    rows, columns = grid
    size_y, size_x = picture.shape[0] / rows, picture.shape[1] / columns
    row, column = divmod(cell, columns)
    if crop:
        centre_y, centre_x = (row + 0.5) * size_y, (column + 0.5) * size_x
        top = int(np.clip(round(centre_y - size_y), 0, picture.shape[0] - 2 * size_y))
        left = int(np.clip(round(centre_x - size_x), 0, picture.shape[1] - 2 * size_x))
        patch = picture[top : top + int(2 * size_y), left : left + int(2 * size_x)]
        axis.imshow(patch)
        axis.add_patch(
            Rectangle((0, 0), patch.shape[1] - 1, patch.shape[0] - 1, fill=False, edgecolor=frame, linewidth=4)
        )
    else:
        axis.imshow(picture)
        axis.add_patch(
            Rectangle(
                (column * size_x - 0.5, row * size_y - 0.5), size_x, size_y, fill=False, edgecolor=frame, linewidth=2
            )
        )
    axis.set_title(title, fontsize=7)
    axis.set_xticks([])
    axis.set_yticks([])


# ----------------------------------------------------------------------------------------------
# A method's explanation of a retrieval (Method.explain), drawn by its kind
# ----------------------------------------------------------------------------------------------
def explanation_figure(explained: Sequence[tuple[object, Sequence[int]]], dataset) -> plt.Figure | str:
    """The explanations a method gave (:meth:`dmlstudy.methods.Method.explain`), one below the other:
    ``explained`` pairs each explanation with the positions in ``dataset`` of the images it explains (the query
    first). Heat maps are drawn over the images the network saw; transport plans as lines between the grid cells
    of the query and a retrieval, with the plan's marginals beside. A title is blue when its retrieval is of the
    query's class, vermillion otherwise. An explanation that is a sentence is returned as it is."""
    from dmlstudy.methods import HeatMaps, TransportPlans

    first = explained[0][0]
    if isinstance(first, str) or first is None:
        return first or "no explanation for this method"
    labels = np.asarray(dataset.labels)
    if isinstance(first, HeatMaps):
        return _heat_maps_figure(explained, dataset, labels)
    if isinstance(first, TransportPlans):
        return _transport_plans_figure(explained, dataset, labels)
    raise TypeError(f"explanation_figure: no drawing for {type(first).__name__}")


def _heat_maps_figure(explained, dataset, labels: np.ndarray) -> plt.Figure:
    rows = [(maps, indices, row) for maps, indices in explained for row in range(len(maps.panels))]
    plain = int(explained[0][0].plain)
    columns = plain + max(len(maps.panels[row]) for maps, _, row in rows)
    figure, axes = plt.subplots(len(rows), columns, figsize=(1.6 * columns, 1.7 * len(rows)), squeeze=False)
    overlaid, overlay = [], None
    for line, (maps, indices, row) in enumerate(rows):
        about = maps.rows[row]
        colour = "black" if about == 0 else CORRECT if labels[indices[about]] == labels[indices[0]] else WRONG
        if plain:
            axes[line, 0].imshow(seen_image(dataset, indices[about]))
            axes[line, 0].set_title("query" if about == 0 else f"#{about}", fontsize=8, color=colour)
        for column, (image, heat, title) in enumerate(maps.panels[row], start=plain):
            picture = seen_image(dataset, indices[image])
            axis = axes[line, column]
            axis.imshow(picture)
            overlay = axis.imshow(
                heat,
                cmap=OVERLAY_CMAP,
                alpha=0.55,
                vmin=0.0,
                vmax=1.0,
                interpolation="bilinear",
                extent=(-0.5, picture.shape[1] - 0.5, picture.shape[0] - 0.5, -0.5),
            )
            axis.set_title(title, fontsize=7, color=colour)
            overlaid.append(axis)
    for axis in axes.flat:
        axis.set_xticks([])
        axis.set_yticks([])
        axis.set_frame_on(bool(axis.images))
    figure.suptitle(
        explained[0][0].title + "\n(title blue: a retrieval of the query's class; vermillion: another class)",
        fontsize=8,
        y=1.0 + 0.35 / figure.get_figheight(),
    )
    figure.tight_layout()
    if overlay is not None:
        overlay_colourbar(figure, overlay, overlaid, label=explained[0][0].label, pad=0.03)
    return credit(figure, dataset)


def _cell_centres(grid: int, size: int) -> np.ndarray:
    """Pixel centres (x, y) of the G × G cells of a ``size``-pixel image, row-major."""
    centres = (np.arange(grid) + 0.5) * size / grid
    ys, xs = np.meshgrid(centres, centres, indexing="ij")
    return np.stack([xs.ravel(), ys.ravel()], axis=1)


def _transport_plans_figure(explained, dataset, labels: np.ndarray) -> plt.Figure:
    """Per plan: query and retrieval side by side, the G² largest entries of T as lines between cell centres
    (width and opacity ∝ mass), and the marginals μ_s (query cells) and μ_t (retrieval cells) as heat maps."""
    rows = [(plans, indices, rank) for plans, indices in explained for rank in range(1, len(plans.plans) + 1)]
    figure, axes = plt.subplots(
        len(rows), 3, figsize=(7.5, 2.3 * len(rows)), gridspec_kw={"width_ratios": [2.2, 1, 1]}, squeeze=False
    )
    for line, (plans, indices, rank) in enumerate(rows):
        plan, grid = plans.plans[rank - 1], plans.grid
        left, right = seen_image(dataset, indices[0]), seen_image(dataset, indices[rank])
        size = left.shape[0]
        axis = axes[line, 0]
        axis.imshow(np.concatenate([left, np.ones((size, size // 8, 3), left.dtype), right], axis=1))
        offset, centres = size + size // 8, _cell_centres(grid, size)
        for edge in np.arange(1, grid) * size / grid:  # the grid cells
            for x0 in (0, offset):
                axis.plot([x0 + edge, x0 + edge], [0, size - 1], color="white", linewidth=0.5, alpha=0.6)
                axis.plot([x0, x0 + size - 1], [edge, edge], color="white", linewidth=0.5, alpha=0.6)
        for flat in np.argsort(plan.ravel())[::-1][: grid * grid]:
            i, j = divmod(int(flat), grid * grid)
            strength = plan[i, j] / plan.max()
            axis.plot(  # blue with a white casing: visible on light and dark backgrounds alike
                [centres[i, 0], centres[j, 0] + offset],
                [centres[i, 1], centres[j, 1]],
                color=PALETTE[0],
                linewidth=0.3 + 3.0 * strength,
                alpha=0.35 + 0.6 * strength,
                path_effects=[
                    patheffects.Stroke(linewidth=1.5 + 3.0 * strength, foreground="white"),
                    patheffects.Normal(),
                ],
            )
        same = labels[indices[rank]] == labels[indices[0]]
        axis.set_title(
            f"query {indices[0]} → #{rank} ({'same class' if same else 'other class'}): {plans.values[rank - 1]}",
            fontsize=7,
            color=CORRECT if same else WRONG,
        )
        axis.axis("off")
        for axis, marginal, title in (
            (axes[line, 1], plan.sum(axis=1), "μ_s (query cells)"),
            (axes[line, 2], plan.sum(axis=0), "μ_t (retrieval cells)"),
        ):
            heatmap(axis, marginal.reshape(grid, grid), title=title, label="transport mass")
            axis.title.set_fontsize(7)
            axis.set_xticks([])
            axis.set_yticks([])
    figure.suptitle(explained[0][0].title + "; title blue = same class, vermillion = another", fontsize=8)
    figure.tight_layout()
    return credit(figure, dataset)
