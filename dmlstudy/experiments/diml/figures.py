"""DIML figures: the worked transport example, the re-ranking cost and the K / G sweeps."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from dmlstudy import plots
from dmlstudy.experiments.diml.study import BASE_LOSS_NAMES
from dmlstudy.transport import TransportOptions, structural_similarity

# --------------------------------------------------------------------------------------------------
# teaching figures


def toy_grids(*, seed: int = 0) -> dict[str, torch.Tensor]:
    """A worked example: a 3 × 3 'image' whose cells are unit vectors (d = 8), and the same content with its
    cells permuted (the object moved) plus noise; globals are the normalised cell means."""
    generator = torch.Generator().manual_seed(seed)
    local_s = torch.nn.functional.normalize(torch.randn(9, 8, generator=generator), dim=-1)
    permutation = torch.tensor([3, 4, 5, 6, 7, 8, 0, 1, 2])  # the content moved one row down (wrapping)
    local_t = torch.nn.functional.normalize(
        local_s[permutation] + 0.25 * torch.randn(9, 8, generator=generator), dim=-1
    )
    global_s = torch.nn.functional.normalize(local_s.mean(0), dim=0)
    global_t = torch.nn.functional.normalize(local_t.mean(0), dim=0)
    return {
        "local_s": local_s,
        "local_t": local_t,
        "global_s": global_s,
        "global_t": global_t,
        "permutation": permutation,
    }


WORKED_SETTINGS: tuple[tuple[float, bool], ...] = ((0.5, True), (0.05, True), (0.05, False))


def worked_example(
    *, settings: Sequence[tuple[float, bool]] = WORKED_SETTINGS, seed: int = 0
) -> tuple[plt.Figure, pd.DataFrame]:
    """The toy pair (:func:`toy_grids`): cell similarities S, the cross-correlation marginals, and the transport
    plan for each ``(ε, uniform marginals)`` setting (figure); and a table of s_struct beside the cosine of the
    two global vectors, the same-position average and the true-correspondence average."""
    toy = toy_grids(seed=seed)
    similarity = toy["local_s"] @ toy["local_t"].T  # 9 × 9
    mu = torch.relu(toy["local_s"] @ toy["global_t"])
    nu = torch.relu(toy["local_t"] @ toy["global_s"])
    truth = similarity[toy["permutation"], torch.arange(9)]  # t's cell j shows s's cell π(j)
    figure, axes = plt.subplots(1, 2 + len(settings), figsize=(2.9 * (2 + len(settings)), 3.0))
    image = axes[0].imshow(similarity.numpy(), cmap="RdBu_r", vmin=-1, vmax=1)
    axes[0].set(
        title="cell similarities S", xlabel="cell j of t", ylabel="cell i of s", xticks=range(9), yticks=range(9)
    )
    figure.colorbar(image, ax=axes[0], fraction=0.046).set_label("cosine")
    axes[1].bar(np.arange(9) - 0.2, (mu / mu.sum()).numpy(), width=0.4, label="μ_s")
    axes[1].bar(np.arange(9) + 0.2, (nu / nu.sum()).numpy(), width=0.4, label="μ_t")
    axes[1].set(title="cross-correlation marginals", xlabel="cell", xticks=range(9))
    axes[1].legend(fontsize=8)
    rows = [
        {"quantity": "cos(z̄_s, z̄_t): the global embeddings", "value": float(toy["global_s"] @ toy["global_t"])},
        {"quantity": "mean S_ii: cells at the same position", "value": float(similarity.diagonal().mean())},
        {"quantity": "mean S_π(j),j: the true correspondence", "value": float(truth.mean())},
    ]
    for axis, (epsilon, uniform) in zip(axes[2:], settings):
        options = TransportOptions(epsilon=epsilon, uniform_marginals=uniform, max_iterations=2000, tolerance=1e-6)
        value, transport = structural_similarity(similarity[None], mu[None], nu[None], options=options)
        marginals = "uniform" if uniform else "cross-corr."
        plots.heatmap(axis, transport.plan[0].numpy(), title="", label="transport mass")
        axis.set(
            title=f"T: ε = {epsilon:g}, {marginals}\ns_struct = {value.item():.3f}",
            xlabel="cell j of t",
            ylabel="cell i of s",
            xticks=range(9),
            yticks=range(9),
        )
        rows.append(
            {
                "quantity": f"s_struct, ε = {epsilon:g}, {marginals} marginals ({transport.iterations} iterations)",
                "value": float(value),
            }
        )
    figure.tight_layout()
    return figure, pd.DataFrame(rows)


def cost_figure(cost: pd.DataFrame) -> plt.Figure:
    """Milliseconds per query against K, one line per G (points only with fewer than three K)."""
    figure, axis = plt.subplots(figsize=(4.2, 3.0))
    for grid, group in cost.groupby("G"):
        axis.plot(
            group["K"],
            group["ms per query"],
            marker="o",
            linestyle=plots.sweep_linestyle(group["K"]),
            label=f"G = {grid} ({grid * grid} cells)",
        )
    axis.set(xlabel="truncation K", ylabel="ms per query", title="re-ranking cost (measured)")
    plots.integer_ticks(axis)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    plots.legend_outside(figure)
    return figure


def sweep_figure(frame: pd.DataFrame, *, sweep: str, metric: str = "P@1") -> plt.Figure:
    """``metric`` (mean ± std over seeds) against K or G, one panel per dataset, one line per base × training
    (points only where the sweep has fewer than :data:`dmlstudy.plots.MIN_SWEEP_VALUES` values)."""
    column = "K" if sweep == "K" else "G"
    rows = frame[frame["sweep"] == sweep]
    datasets = list(dict.fromkeys(rows["dataset"]))
    figure, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.0), squeeze=False)
    for axis, dataset in zip(axes[0], datasets):
        for (base, training), group in rows[rows["dataset"] == dataset].groupby(["base_loss", "training"], sort=False):
            stats = group.groupby(column)[metric].agg(["mean", "std"]).fillna(0.0) * 100
            axis.errorbar(
                stats.index,
                stats["mean"],
                yerr=stats["std"],
                marker="o",
                linestyle=plots.sweep_linestyle(stats.index),
                capsize=3,
                label=f"{BASE_LOSS_NAMES.get(base, base)}, {training}",
            )
        axis.set(xlabel=column, ylabel=f"{metric} (%)", title=dataset)
        if sweep == "K":
            axis.set_xscale("symlog", linthresh=10)
            axis.set_xticks(sorted(set(rows[column])), labels=[f"{k:g}" for k in sorted(set(rows[column]))])
        else:
            plots.integer_ticks(axis)
        axis.grid(alpha=0.3)
    figure.tight_layout()
    plots.legend_outside(figure)
    return figure
