"""CRT figures: the annotated diagram of the coded residual transform and the t-SNE of its two branches."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch.utils.data import Subset

from dmlstudy import plots
from dmlstudy.experiments.crt.study import evaluation_split
from dmlstudy.experiments.kit import device_of, projection_figure
from dmlstudy.methods.crt import CRT, BranchEmbedder, prototype_correlation
from dmlstudy.plots import box, link
from dmlstudy.run.evaluation import embed
from dmlstudy.run.train import RunResult


def transform_figure(method: CRT, *, image_size: int = 64) -> plt.Figure:
    """An annotated diagram of the coded residual transform with the real sizes of ``method``."""
    with torch.no_grad():
        was_training = method.training
        method.eval()
        feature_map = method.backbone(torch.zeros(1, 3, image_size, image_size, device=device_of(method)))
        method.train(was_training)
    channels, height, width = feature_map.shape[1:]
    d, high = method.branch_dims
    figure, axis = plt.subplots(figsize=(13, 4.4))
    axis.set(xlim=(0, 14), ylim=(0, 5.2))
    axis.axis("off")
    image = box(axis, (0.75, 2.5), f"image\n3×{image_size}×{image_size}", width=1.3)
    features = box(
        axis,
        (3.3, 2.5),
        f"backbone map X\n{channels}×{height}×{width}\n= {height * width} tokens x_j",
        width=1.9,
        height=1.1,
    )
    link(axis, image, features, "backbone")
    bank = "one shared bank" if method.shared else "a bank per branch"
    codes = box(
        axis,
        (6.3, 2.5),
        f"codes a_jk =\nsoftplus(x_jᵀc_k)\n{height * width}×{method.K1}\n(K = {method.K1} prototypes c_k,\n{bank})",
        width=2.1,
        height=1.5,
        colour="#fee6ce",
    )
    link(axis, features, codes)
    residual = box(axis, (9.1, 2.5), f"r_k = Σ_j a_jk (x_j − c_k)\n{method.K1}×{channels}", width=2.3, colour="#fee6ce")
    link(axis, codes, residual)
    first = box(axis, (12.3, 4.0), f"f¹ = (1/K) Σ_k Γ¹_k r_k\nd = {d} (test time)", width=2.5, colour="#e5f5e0")
    second = box(axis, (12.3, 1.0), f"f² = (1/K) Σ_k Γ²_k r_k\nD = {high}", width=2.5, colour="#e5f5e0")
    link(axis, residual, first, "Γ¹_k: C → d", shift=(-0.75, 0.0))
    link(axis, residual, second, "Γ²_k: C → D", shift=(-0.75, -0.3))
    axis.text(
        12.3,
        2.5,
        "L_CON = mean |S¹ − S²|\n(batch cosine matrices)",
        ha="center",
        va="center",
        fontsize=8,
        color="#a50f15",
    )
    axis.text(12.3, 4.75, "L_MS(f¹)", ha="center", fontsize=8, color="#a50f15")
    axis.text(12.3, 0.1, "L_MS(f²)", ha="center", fontsize=8, color="#a50f15")
    axis.text(
        6.3, 1.45, "L_DIV = mean over k ≠ j of |cos(c_k, c_j)|", ha="center", va="top", fontsize=8, color="#a50f15"
    )
    axis.set_title("Coded residual transform: L = L_DIV + λ1 (L_MS(f¹) + L_MS(f²)) + λ2 L_CON", fontsize=10)
    return figure


def branch_tsne_figure(result: RunResult, *, classes: int = 10, seed: int = 0) -> plt.Figure:
    """t-SNE (:func:`dmlstudy.experiments.kit.projection_figure`) of branch-2 (D) and branch-1 (d) test
    embeddings of the first ``classes`` test classes of one CRT run."""
    query = evaluation_split(result.config, "test")
    labels = np.asarray(query.labels)
    keep = np.flatnonzero(np.isin(labels, np.unique(labels)[:classes]))
    subset = Subset(query, keep.tolist())
    panels = {}
    for branch in (2, 1):
        embeddings = embed(
            BranchEmbedder(result.method, branch),
            subset,
            batch_size=result.config.eval_batch_size,
            device=device_of(result.method),
        )
        panels[f"branch {branch}: {'D' if branch == 2 else 'd'} = {embeddings.shape[1]}"] = (embeddings, labels[keep])
    return projection_figure(
        panels, kind="tsne", classes=classes, seed=seed, title=f"{result.config.dataset}, CRT's two branches"
    )


def prototype_correlation_figure(method: CRT, *, branch: int = 1) -> plt.Figure:
    """The K × K |cos| matrix between the learned prototypes (L_DIV pushes its off-diagonal towards 0)."""
    matrix = prototype_correlation(method, branch=branch).cpu().numpy()
    count = len(matrix)
    off = matrix[~np.eye(count, dtype=bool)]
    figure, axis = plt.subplots(figsize=(4.2, 3.6))
    title = f"|cos(c_k, c_j)|, K = {count}" + (f"; off-diagonal mean {off.mean():.3f}" if count > 1 else "")
    plots.heatmap(axis, matrix, title=title, label="|cos|", vmin=0, vmax=1)
    axis.set(xlabel="prototype j", ylabel="prototype k")
    plots.integer_ticks(axis, "x")
    plots.integer_ticks(axis, "y")
    figure.tight_layout()
    return figure
