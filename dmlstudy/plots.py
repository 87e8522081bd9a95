"""Figures drawn from run records (history, embeddings, datasets); each function returns a matplotlib Figure.

``save_figure`` writes PNGs into ``figures/`` (the default study's figures are committed).

**The study style lives here, in one place**, and every figure of the package draws with it:

* a colour-blind-safe palette (seaborn's ``colorblind``), set as matplotlib's colour cycle with readable font
  sizes when this module is imported (:data:`STYLE`);
* one colour per row of the comparison, its own in every figure (:data:`dmlstudy.rows.ROW_COLOURS`: no two rows
  share one, and the rows the default study draws together stay apart for colour-blind readers), and one marker
  per group (:func:`method_style`: circles for the papers' methods, squares for the classic baselines, MS
  included); markers are drawn without error-bar caps, so a circle stays a circle;
* same class / other class as blue / vermillion (:data:`CORRECT`, :data:`WRONG`), never red / green;
* legends outside the data area (:func:`legend_outside`), a colourbar on every heat map (:func:`heatmap`),
  integer ticks on epoch axes (:func:`integer_ticks`), plain numbers on log-scaled K axes;
* a sweep with fewer than :data:`MIN_SWEEP_VALUES` values is drawn as points, not as a curve
  (:func:`sweep_linestyle`).
"""

from __future__ import annotations

import hashlib
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle
from matplotlib.ticker import MaxNLocator, NullFormatter

from dmlstudy import metrics as metric_functions
from dmlstudy.data.base import image_credit
from dmlstudy.paths import study_outputs
from dmlstudy.rows import ROW_COLOURS, classic_rows, main_rows, row_info

# ----------------------------------------------------------------------------------------------
# The study style
# ----------------------------------------------------------------------------------------------
PALETTE = tuple(sns.color_palette("colorblind").as_hex())  # 10 colours, safe for the common colour blindnesses
CORRECT, WRONG = PALETTE[0], PALETTE[3]  # blue = same class as the query, vermillion = another class
HEATMAP_CMAP = "viridis"  # perceptually uniform, readable in grey and for colour-blind readers
OVERLAY_CMAP = "inferno"  # heat maps drawn over photographs (dark = cold, so the image shows through)
MIN_SWEEP_VALUES = 3  # fewer values than this are points, not a curve
STYLE = {
    "axes.prop_cycle": mpl.cycler(color=PALETTE),
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "figure.titlesize": 11,
    "image.cmap": HEATMAP_CMAP,
}
GROUP_MARKERS = {"paper": "o", "classic": "s"}  # the marker says the row's group; the colour says the row
OTHER_MARKER = "X"  # a name that is no row of the comparison (a sweep variant, a plugin)


def apply_style() -> None:
    """Set :data:`STYLE` in matplotlib's rcParams (done on import; call again after a notebook resets them)."""
    mpl.rcParams.update(STYLE)


apply_style()


@dataclass(frozen=True)
class MethodStyle:
    """How one method is drawn in every figure."""

    colour: str
    marker: str
    group: str  # "paper", "classic" or "other" (not a row of the comparison)


def method_order() -> list[str]:
    """Every row of the comparison in its order: ``ms``, the registry's paper methods, the extra rows
    (``diml_rerank``, ``softmax``), then the classic baselines."""
    return list(dict.fromkeys([*main_rows(), *classic_rows()]))


def method_style(name: str) -> MethodStyle:
    """Colour and marker of method ``name`` (a registered method or an extra row of the comparison).

    A row of :func:`method_order` gets its colour of :data:`dmlstudy.rows.ROW_COLOURS` and its group's marker
    (:data:`GROUP_MARKERS`); a name outside the order, or a row registered without a colour, gets a colour of
    :data:`PALETTE` fixed by its name and the marker ``X``.
    """
    if name not in method_order() or name not in ROW_COLOURS:
        digest = int(hashlib.sha256(name.encode()).hexdigest(), 16)
        return MethodStyle(PALETTE[digest % len(PALETTE)], OTHER_MARKER, "other")
    group = row_info(name).group
    return MethodStyle(ROW_COLOURS[name], GROUP_MARKERS.get(group, GROUP_MARKERS["classic"]), group)


def legend_outside(figure: plt.Figure, axes: Iterable[plt.Axes] | None = None, *, title: str | None = None):
    """One legend for the labelled artists of ``axes`` (default: all of the figure's), placed right of the
    axes, outside every data area; repeated labels are shown once. Returns the legend (None when nothing
    is labelled). Call after ``tight_layout`` (saving with ``bbox_inches="tight"`` keeps it in the image)."""
    handles: dict[str, object] = {}
    for axis in axes if axes is not None else figure.axes:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if not handles:
        return None
    right = max(axis.get_position().x1 for axis in figure.axes)
    return figure.legend(
        list(handles.values()),
        list(handles),
        loc="upper left",
        bbox_to_anchor=(right + 0.01, max(axis.get_position().y1 for axis in figure.axes)),
        frameon=False,
        title=title,
    )


def integer_ticks(axis: plt.Axes, which: str = "x") -> None:
    """Only integer ticks on the ``which`` axis (epochs, counts, matrix indices); call after drawing the data.
    A view holding fewer than two integers (one evaluated epoch) is widened to one unit either side of its
    centre, since matplotlib's integer locator falls back to fractional ticks on so short a range. An inverted
    axis (``imshow`` draws row 0 at the top: y from ``n − 0.5`` down to ``−0.5``) keeps its view and direction."""
    first, last = axis.get_xlim() if which == "x" else axis.get_ylim()
    low, high = min(first, last), max(first, last)
    if np.floor(high) - np.ceil(low) < 1:
        centre = round((low + high) / 2)
        low, high = min(low, centre - 1), max(high, centre + 1)
        limits = (high, low) if first > last else (low, high)
        axis.set_xlim(*limits) if which == "x" else axis.set_ylim(*limits)
    (axis.xaxis if which == "x" else axis.yaxis).set_major_locator(MaxNLocator(integer=True))


def label_points(
    axis: plt.Axes, points: Sequence[tuple[float, float, str, str]], *, fontsize: float = 8.0, spacing: float = 1.35
) -> list:
    """Name each point ``(x, y, label, colour)`` in a column just right of ``axis``, at the point's height where
    the labels do not collide (pushed apart to ``spacing`` line heights, in order of height), joined to the
    point by a thin leader line in its colour. Labels beside the points overprint error bars and each other
    when points crowd; a column outside the data area cannot. Call once the limits and the axes' height are
    final (after a first ``tight_layout``; a second one makes room for the column). Returns the annotations."""
    if not points:
        return []
    low, high = axis.get_ylim()
    height_points = axis.get_position().height * axis.figure.get_figheight() * 72
    gap = spacing * fontsize / max(height_points, 1.0)  # one label's height, as a fraction of the axes
    order = sorted(range(len(points)), key=lambda i: points[i][1])
    wanted = [(points[i][1] - low) / (high - low) for i in order]
    placed = []
    for fraction in wanted:  # upwards: each at least one gap above the one below
        placed.append(max(fraction, placed[-1] + gap) if placed else fraction)
    overflow = placed[-1] - 1.0
    if overflow > 0:  # the column ran past the top: shift it down, then keep the gaps downwards
        placed = [value - overflow for value in placed]
        for index in range(len(placed) - 2, -1, -1):
            placed[index] = min(placed[index], placed[index + 1] - gap)
    annotations = []
    for index, fraction in zip(order, placed):
        x, y, label, colour = points[index]
        annotations.append(
            axis.annotate(
                label,
                xy=(x, y),
                xycoords="data",
                xytext=(1.03, fraction),
                textcoords="axes fraction",
                va="center",
                ha="left",
                fontsize=fontsize,
                color="0.15",
                arrowprops={  # dotted, so a leader is never read as an error bar running on to the name
                    "arrowstyle": "-",
                    "color": colour,
                    "linewidth": 0.7,
                    "linestyle": ":",
                    "alpha": 0.8,
                    "shrinkA": 0,
                },
                annotation_clip=False,
            )
        )
    return annotations


def plain_log_ticks(axis: plt.Axes, ticks: Sequence[float], which: str = "x") -> None:
    """A log-scaled axis labelled only at ``ticks``, as plain numbers (no ``3×10⁰`` minor labels)."""
    target = axis.xaxis if which == "x" else axis.yaxis
    target.set_ticks(list(ticks), labels=[f"{t:g}" for t in ticks])
    target.set_minor_formatter(NullFormatter())


def heatmap(
    axis: plt.Axes, values: np.ndarray, *, title: str, label: str = "", cmap: str = HEATMAP_CMAP, **imshow
) -> mpl.image.AxesImage:
    """``values`` as an image with a title and a colourbar labelled ``label`` (every heat map has both)."""
    image = axis.imshow(values, cmap=cmap, **imshow)
    colourbar = axis.figure.colorbar(image, ax=axis, fraction=0.046, pad=0.03)
    if label:
        colourbar.set_label(label)
    axis.set_title(title)
    return image


def overlay_colourbar(figure: plt.Figure, overlay, axes: Sequence[plt.Axes], *, label: str, pad: float = 0.02):
    """One colourbar beside ``axes`` for heat maps drawn over photographs (``overlay``: one of them; all share its
    scale), drawn opaque although the overlays are translucent. Call after ``tight_layout``."""
    colourbar = figure.colorbar(overlay, ax=list(axes), fraction=0.02, pad=pad)
    colourbar.solids.set(alpha=1.0)
    colourbar.set_label(label)
    return colourbar


def sweep_linestyle(values: Iterable) -> str:
    """``"-"`` when a sweep has at least :data:`MIN_SWEEP_VALUES` distinct values, else ``"none"`` (points only:
    two values are a comparison, not a curve)."""
    return "-" if len(set(values)) >= MIN_SWEEP_VALUES else "none"


def save_figure(figure: plt.Figure, name: str, *, study: str, folder: str | Path | None = None, dpi: int = 120) -> Path:
    """Save ``figure`` as ``<folder>/<name>.png`` and return the path; ``folder`` defaults to the study's
    figures folder (:func:`~dmlstudy.paths.study_outputs`: ``<project>/figures`` for the published study).
    The credit of the dataset images it shows (:func:`credit`) goes into the PNG's ``Copyright`` text field, so
    it travels with the file."""
    folder = Path(folder) if folder else study_outputs(study, "figures")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    text = figure_credit(figure)
    metadata = (
        {"Copyright": text, "Description": "Shows dataset images; see Copyright for their credit."} if text else {}
    )
    figure.savefig(path, dpi=dpi, bbox_inches="tight", metadata=metadata)
    return path


def save_and_show(figure: plt.Figure, name: str, *, study: str, folder: str | Path | None = None) -> None:
    """:func:`save_figure`, returning nothing: a notebook cell that ends with it shows the figure (the inline
    backend draws it) and not the path it was saved to."""
    save_figure(figure, name, study=study, folder=folder)


def source_image(dataset, index: int) -> np.ndarray:
    """The untransformed RGB image (H × W × 3 uint8) of item ``index`` of a dataset or a Subset of one."""
    while hasattr(dataset, "indices") and hasattr(dataset, "dataset"):
        index, dataset = dataset.indices[index], dataset.dataset
    return np.asarray(dataset.load_image(index))


def training_curves(history: pd.DataFrame, *, metric: str = "R@1", title: str = "") -> plt.Figure:
    """Training loss per epoch and ``metric`` at each evaluation (on the validation classes when the run has
    them, else the test classes: :func:`dmlstudy.run.checkpoint_selection.evaluation_column`)."""
    from dmlstudy.run.checkpoint_selection import evaluation_column

    column, classes = evaluation_column(history, metric)
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    left.plot(history["epoch"], history["loss"], marker="o")
    left.set(xlabel="epoch", ylabel="training loss", title="loss")
    evaluated = history.dropna(subset=[column]) if column in history else history.iloc[0:0]
    right.plot(evaluated["epoch"], 100 * evaluated[column], marker="o", color=PALETTE[1])
    right.set(xlabel="epoch", ylabel=f"{metric} (%)", title=f"{classes} {metric}")
    for axis in (left, right):
        integer_ticks(axis)
        axis.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


def recall_curve(metrics: dict[str, float], *, title: str = "") -> plt.Figure:
    """Recall@K against K from a metrics dict (keys ``R@K``)."""
    ks = sorted(int(key[2:]) for key in metrics if key.startswith("R@"))
    figure, axis = plt.subplots(figsize=(4, 3))
    axis.plot(ks, [100 * metrics[f"R@{k}"] for k in ks], marker="o")
    axis.set(xscale="log", xlabel="K", ylabel="Recall@K (%)", title=title or "Recall@K")
    plain_log_ticks(axis, ks)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def seen_image(dataset, index: int) -> np.ndarray:
    """The test-transformed image the network saw (item ``index`` of ``dataset``), H × W × 3 in [0, 1]; for a
    split of cached stem activations (the network saw the stem's output of its test view) the image itself."""
    from dmlstudy.data import denormalize

    item = dataset[index][0]
    if item.ndim != 3 or item.shape[0] != 3:
        return source_image(dataset, index).astype(np.float32) / 255.0
    return denormalize(item).permute(1, 2, 0).numpy()


CREDIT_ATTRIBUTE = "dmlstudy_credit"  # the Figure attribute holding the credit text that save_figure writes
CREDIT_FONT_SIZE = 5.5  # points: small, and wrapped to the figure's width


def figure_credit(figure: plt.Figure) -> str:
    """The credit :func:`credit` attached to ``figure`` ("" for a figure that shows no dataset images)."""
    return getattr(figure, CREDIT_ATTRIBUTE, "")


def credit(figure: plt.Figure, dataset) -> plt.Figure:
    """Attach the full attribution of ``dataset``'s images (:func:`dmlstudy.data.base.image_credit`) to
    ``figure``: printed under it in small type, wrapped to its width, and kept on the figure for
    :func:`save_figure` to write into the PNG's metadata. Nothing for images that need none (the generated sets).

    The credit names every set with its authors, licence and the licence's link, and says how the images were
    changed (rendered, resized, framed, overlaid), as CC BY 4.0 asks. Decision on the ShareAlike sets (openmoji
    and emojione-v1, CC BY-SA 4.0): they stay in the figures, and the credit states that a figure showing their
    drawings is an adaptation of them licensed CC BY-SA 4.0 (what CC BY-SA 4.0 § 3(b) asks of an adapter);
    leaving them out would make the figures show a different dataset from the one the runs used.
    ``THIRD_PARTY_NOTICES.md`` holds the full notices and licence texts.
    """
    text = image_credit(dataset)
    if text and text not in figure_credit(figure):
        setattr(figure, CREDIT_ATTRIBUTE, " ".join(filter(None, [figure_credit(figure), text])))
        width = max(60, int(figure.get_figwidth() * 20))
        figure.text(
            0.5,
            -0.01,
            textwrap.fill(text, width, break_on_hyphens=False, break_long_words=False),
            ha="center",
            va="top",
            fontsize=CREDIT_FONT_SIZE,
            color="0.35",
        )
    return figure


def _framed(axis: plt.Axes, image: np.ndarray, same: bool | None, title: str = "") -> None:
    """``image`` framed solid blue (same class, ``same=True``), dashed vermillion (another class) or unframed (None):
    colour and line style both carry the answer."""
    axis.imshow(image)
    axis.set_xticks([])
    axis.set_yticks([])
    if same is not None:
        height, width = image.shape[:2]
        axis.add_patch(
            Rectangle(
                (0, 0),
                width - 1,
                height - 1,
                fill=False,
                edgecolor=CORRECT if same else WRONG,
                linestyle="-" if same else "--",
                linewidth=4,
            )
        )
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
    """Queries (left column) and their top-``top_k`` retrievals, framed solid blue (same class) or dashed vermillion.

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
            _framed(
                axes[row, column],
                source_image(dataset, hit),
                bool(labels[hit] == labels[query]),
                f"#{column}" if row == 0 else "",
            )
    figure.suptitle("frame: solid blue = query's class, dashed vermillion = another class", fontsize=8)
    figure.tight_layout()
    return credit(figure, dataset)


def spectrum(
    embeddings_by_name: dict[str, np.ndarray],
    *,
    drop_first: int = 0,
    top: int | None = None,
    title: str = "",
    methods: Mapping[str, str] | None = None,
) -> plt.Figure:
    """Normalised singular-value spectra (after dropping ``drop_first``) with ρ in the legend (outside the axes).

    A curve is drawn in its method's style (:func:`method_style`): ``methods`` maps a shown name to its method
    (default: the name itself when it is a row of the comparison; other names take the colour cycle).
    """
    figure, axis = plt.subplots(figsize=(5, 3.2))
    order = method_order()
    for index, (name, embeddings) in enumerate(embeddings_by_name.items()):
        values = metric_functions.singular_value_spectrum(embeddings)[drop_first:]
        values = values / values.sum()
        rho = metric_functions.spectral_decay(embeddings, drop_first=drop_first)
        shown = values[:top] if top else values
        method = (methods or {}).get(name, name)
        style = method_style(method) if method in order else MethodStyle(PALETTE[index % len(PALETTE)], "o", "other")
        axis.plot(
            np.arange(1 + drop_first, 1 + drop_first + len(shown)),
            shown,
            color=style.colour,
            marker=style.marker,
            markevery=max(len(shown) // 6, 1),
            markersize=4,
            label=f"{name} (ρ = {rho:.3f})",
        )
    axis.set(
        yscale="log",
        xlabel="singular value index",
        ylabel="normalised singular value",
        title=title or f"spectrum (drop_first = {drop_first})",
    )
    integer_ticks(axis)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    legend_outside(figure)
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
# Heat maps of tables, colour bars per kind of panel, local parts
# ----------------------------------------------------------------------------------------------
def table_heatmap(table: pd.DataFrame, *, xlabel: str, ylabel: str, title: str, label: str = "") -> plt.Figure:
    """A table of numbers as a heat map with each value written in its cell (blank where it is NaN): rows and
    columns keep the table's labels."""
    values = table.to_numpy(dtype=float)
    figure, axis = plt.subplots(figsize=(1.0 + 0.75 * values.shape[1], 0.9 + 0.5 * values.shape[0]))
    image = axis.imshow(np.ma.masked_invalid(values), cmap=HEATMAP_CMAP, aspect="auto")
    for (row, column), value in np.ndenumerate(values):
        if not np.isnan(value):
            colour = "white" if value < np.nanmean(values) else "black"
            axis.text(column, row, f"{value:.1f}", ha="center", va="center", fontsize=8, color=colour)
    axis.set(xticks=range(values.shape[1]), xticklabels=list(table.columns), yticks=range(values.shape[0]))
    axis.set(yticklabels=[str(v) for v in table.index], xlabel=xlabel, ylabel=ylabel, title=title)
    colourbar = figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04)
    colourbar.set_label(label)
    figure.tight_layout()
    return figure


# ----------------------------------------------------------------------------------------------
# Diagrams: boxes and arrows (the papers' teaching figures)
# ----------------------------------------------------------------------------------------------
Box = tuple[float, float, float, float]  # centre x, centre y, width, height


def box(
    axis: plt.Axes,
    centre: tuple[float, float],
    text: str,
    *,
    width: float = 1.7,
    height: float = 0.8,
    colour: str = "#deebf7",
) -> Box:
    """A rounded box with centred text; returns its centre and size for :func:`link`."""
    x, y = centre
    axis.add_patch(
        FancyBboxPatch(
            (x - width / 2, y - height / 2),
            width,
            height,
            boxstyle="round,pad=0.05",
            facecolor=colour,
            edgecolor="#333333",
        )
    )
    axis.text(x, y, text, ha="center", va="center", fontsize=8)
    return x, y, width, height


def arrow(
    axis: plt.Axes,
    start: tuple[float, float],
    end: tuple[float, float],
    *,
    colour: str = "0.25",
    label: str = "",
    rad: float = 0.0,
    **kwargs: Any,
) -> None:
    """An arrow between two points (curved by ``rad``), its label boxed in white at the middle."""
    (x0, y0), (x1, y1) = start, end
    axis.add_patch(
        FancyArrowPatch(
            (x0, y0),
            (x1, y1),
            arrowstyle="-|>",
            mutation_scale=9,
            color=colour,
            connectionstyle=f"arc3,rad={rad}",
            linewidth=1.0,
            **kwargs,
        )
    )
    if label:
        axis.text(
            (x0 + x1) / 2,
            (y0 + y1) / 2,
            label,
            fontsize=7,
            color=colour,
            ha="center",
            va="center",
            bbox=dict(facecolor="white", edgecolor="none", pad=0.5),
        )


def link(axis: plt.Axes, start: Box, end: Box, text: str = "", *, shift: tuple[float, float] = (0.0, 0.18)) -> None:
    """An arrow from the right edge of box ``start`` to the left edge of box ``end``, labelled at its middle + ``shift``."""
    (x0, y0, w0, _), (x1, y1, w1, _) = start, end
    tail, head = (x0 + w0 / 2 + 0.08, y0), (x1 - w1 / 2 - 0.08, y1)
    axis.add_patch(FancyArrowPatch(tail, head, arrowstyle="-|>", mutation_scale=12, color="#333333"))
    if text:
        axis.text(
            (tail[0] + head[0]) / 2 + shift[0],
            (tail[1] + head[1]) / 2 + shift[1],
            text,
            ha="center",
            va="bottom",
            fontsize=7,
            color="#555555",
        )
