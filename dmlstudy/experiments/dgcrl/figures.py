"""DGCRL figures: the α sweep (paper Fig. 3), the loss curves, the decorrelation toy and the t-SNE panels."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from dmlstudy import plots
from dmlstudy.experiments.dgcrl.study import VARIANT_LABELS, toy_decorrelation
from dmlstudy.experiments.kit import first_seed_embeddings, projection_figure
from dmlstudy.methods.dgcrl import mean_abs_cosine
from dmlstudy.run.checkpoint_selection import evaluation_column
from dmlstudy.run.train import RunResult


def alpha_figure(frame: pd.DataFrame) -> plt.Figure:
    """Paper Fig. 3 on our data: test Recall@K (left) and training accuracy (right) against α (log₂ axis).

    With fewer than :data:`dmlstudy.plots.MIN_SWEEP_VALUES` values of α the points are not joined (two values
    are a comparison, not a curve) and the title says how many values there are."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    recall_columns = [c for c in frame.columns if c.startswith("R@")]
    alphas = sorted(set(frame["alpha"]))
    linestyle = plots.sweep_linestyle(alphas)
    for dataset, group in frame.groupby("dataset"):
        dashes = linestyle if linestyle == "none" or dataset == frame["dataset"].iloc[0] else "--"
        for index, column in enumerate(recall_columns):
            left.plot(
                group["alpha"],
                100 * group[column],
                linestyle=dashes,
                marker="o",
                color=plots.PALETTE[index % len(plots.PALETTE)],
                label=f"{column} {dataset}",
            )
        right.plot(
            group["alpha"],
            100 * group["train accuracy"],
            linestyle=dashes,
            marker="s",
            color="k",
            label=f"train accuracy {dataset}",
        )
    few = "" if linestyle == "-" else f" (only {len(alphas)} α value{'s' if len(alphas) > 1 else ''}: points, no curve)"
    for axis, title, ylabel in (
        (left, "test Recall@K", "Recall@K (%)"),
        (right, "training accuracy (centres)", "accuracy (%)"),
    ):
        axis.set_xscale("log", base=2)
        axis.set(xlabel="α (N-S scale)", ylabel=ylabel, title=title + few)
        plots.plain_log_ticks(axis, alphas)
        axis.grid(alpha=0.3)
    figure.tight_layout()
    plots.legend_outside(figure)
    return figure


def loss_curves(results: list[tuple[str, RunResult]], *, metric: str = "R@1") -> plt.Figure:
    """``metric`` per evaluated epoch of each loss (validation classes when the runs have them, else test; first
    seed per dataset and loss), each in its method's style
    (:func:`dmlstudy.plots.method_style`; variants that are no method row keep a colour of their own)."""
    datasets = sorted({result.config.dataset for _, result in results})
    figure, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.4), squeeze=False)
    seen: set[tuple[str, str]] = set()
    for variant, result in results:
        key = (result.config.dataset, variant)
        if key in seen:
            continue
        seen.add(key)
        axis = axes[0, datasets.index(result.config.dataset)]
        column, classes = evaluation_column(result.history, metric)
        history = result.history.dropna(subset=[column])
        style = plots.method_style(variant)
        axis.plot(
            history["epoch"],
            100 * history[column],
            marker=style.marker,
            color=style.colour,
            label=VARIANT_LABELS.get(variant, variant),
        )
        axis.set(xlabel="epoch", ylabel=f"{classes} {metric} (%)", title=result.config.dataset)
    for axis in axes[0]:
        axis.grid(alpha=0.3)
        plots.integer_ticks(axis)
    figure.tight_layout()
    plots.legend_outside(figure)
    return figure


def toy_figure(*, steps: int = 60, paper_weight: float = 1.0) -> plt.Figure:
    """Unit centres before and after the decorrelation alone (3-D arrows), and mean |cos| per step, alone and
    together with the softmax loss (λ = 0 vs λ = ``paper_weight``)."""
    alone = {
        f"paper push alone (λ = {paper_weight:g})": toy_decorrelation(
            decorrelation="paper", weight=paper_weight, with_loss=False, steps=steps
        ),
        "code regulariser alone": toy_decorrelation(decorrelation="code", with_loss=False, steps=steps),
    }
    with_loss = {
        "softmax + paper, λ = 0": toy_decorrelation(decorrelation="paper", weight=0.0, steps=steps),
        f"softmax + paper, λ = {paper_weight:g}": toy_decorrelation(
            decorrelation="paper", weight=paper_weight, steps=steps
        ),
        "softmax + code": toy_decorrelation(decorrelation="code", steps=steps),
    }
    figure = plt.figure(figsize=(13, 3.8))
    panels = [
        ("start", next(iter(alone.values()))["centres"][0]),
        *[(name, run["centres"][-1]) for name, run in alone.items()],
    ]
    for index, (title, centres) in enumerate(panels):
        axis = figure.add_subplot(1, len(panels) + 1, index + 1, projection="3d")
        unit = centres / np.linalg.norm(centres, axis=1, keepdims=True)
        for k, vector in enumerate(unit):
            axis.quiver(0, 0, 0, *vector, color=f"C{k}", linewidth=2, arrow_length_ratio=0.15)
        axis.set(xlim=(-1, 1), ylim=(-1, 1), zlim=(-1, 1))
        for ticks in (axis.set_xticks, axis.set_yticks, axis.set_zticks):  # three ticks: nine crowd a small 3-D box
            ticks([-1, 0, 1])
        axis.set_title(f"{title}\nmean |cos| {float(mean_abs_cosine(torch.as_tensor(centres))):.2f}", fontsize=9)
        axis.tick_params(labelsize=7, pad=0)
    axis = figure.add_subplot(1, len(panels) + 1, len(panels) + 1)
    for name, run in {**alone, **with_loss}.items():
        axis.plot(run["abs_cos"], label=name, linestyle="--" if name in alone else "-")
    axis.set(xlabel="SGD step", ylabel="mean |cos(w_i, w_j)|", title="centre correlation")
    axis.grid(alpha=0.3)
    plots.integer_ticks(axis)
    figure.tight_layout()
    plots.legend_outside(figure, [axis])
    return figure


def tsne_figure(
    results: list[tuple[str, RunResult]],
    *,
    variants: Sequence[str],
    classes: int = 10,
    iterations: int = 300,
    seed: int = 0,
) -> plt.Figure:
    """t-SNE (:func:`~dmlstudy.experiments.kit.projection_figure`) of the test embeddings of the first ``classes``
    test classes, one panel per variant (its first seed on the first run's dataset)."""
    embeddings = first_seed_embeddings(results, variants=variants)
    dataset = next((result.config.dataset for variant, result in results if variant in embeddings), "")
    return projection_figure(
        embeddings,
        kind="tsne",
        classes=classes,
        seed=seed,
        title=dataset,
        label=lambda v: VARIANT_LABELS.get(v, v),
        iterations=iterations,
    )
