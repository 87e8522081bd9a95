"""The DIML notebook (``notebooks/20_diml.ipynb``): structural similarity by optimal transport, as test-time
re-ranking of plain baselines and as a training similarity, swept over the truncation K and the grid size G.

Runs come from :meth:`ProtocolConfig.grid`, so the plain Multi-Similarity baseline is the run ``ms`` and
DIML-trained Multi-Similarity is the run ``diml`` (shared with the comparison notebook). Every trained model
is evaluated once per setting: its test set is embedded at each grid size (one backbone pass), the
structural similarities of each query's top-``max K`` cosine candidates are computed once and every K
re-ranks from them (:func:`dmlstudy.reranking.reranked_retrieval_metrics`). Results are cached in the
run folder (``diml_rerank-<key>.json``), so re-executing the notebook only computes what is new.

The paper's numbers (supplement Tables 1 and 2, from ``papers.yaml``) are printed for orientation: other data
(CUB-200, Cars196, SOP), an ImageNet-pretrained ResNet-50, 7 × 7 maps and a metric convention that counts
the query in R (our R excludes it, as pytorch-metric-learning).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from dmlstudy.experiments.kit import (
    cache_key,
    embedding_precision,
    evaluation_sets,
)
from dmlstudy.experiments.papers import numbers
from dmlstudy.experiments.protocol import StudyConfig, call_in_processes, run_grid
from dmlstudy.methods.diml import DEFAULT_GRID_SIZE, GridEmbeddings
from dmlstudy.records import write_json
from dmlstudy.report import summarize
from dmlstudy.reranking import reranked_retrieval_metrics
from dmlstudy.train import RunResult, TrainConfig, run
from dmlstudy.transport import DEFAULT_EPSILON, TransportOptions, candidate_structural_similarity, structural_similarity
from dmlstudy.verdicts import effect_sentence, paired_differences

METRICS = ["P@1", "RP", "MAP@R"]
PAPER_DATASETS = ("CUB-200", "Cars196", "SOP")
BASE_LOSS_NAMES = {"ms": "Multi-Similarity", "margin": "Margin", "proxynca": "ProxyNCA"}

# Supplement Table 1 (truncation K, G = 4) and Table 2 (grid size G, K = 100): DIML as test-time re-ranking
# of trained baselines, ResNet-50. Per (base loss, K or G): {dataset: (P@1, RP, MAP@R)} in percent.
PAPER_TRUNCATION: dict[tuple[str, int], dict[str, tuple[float, float, float]]] = numbers("diml", "TRUNCATION")
PAPER_GRID: dict[tuple[str, int], dict[str, tuple[float, float, float]]] = numbers("diml", "GRID")


@dataclass
class DIMLStudy(StudyConfig):
    """Parameters of the DIML notebook (defaults: CI-sized)."""

    base_losses: list = field(
        default_factory=lambda: ["ms"]
    )  # base losses: a plain run and a DIML-trained run each (ms, margin, proxynca)
    train_diml: bool = True  # also train the DIML variants (False: only re-rank the plain baselines)
    top_ks: list = field(default_factory=lambda: [0, 10, 50])  # truncation K of the re-ranking sweep (at grid_size)
    grid_sizes: list = field(
        default_factory=lambda: [1, 2, 4]
    )  # grid sizes G of the grid sweep (at top_k); > 4 upsamples the 4 × 4 map
    grid_size: int = 4  # G for DIML training and for the K sweep
    top_k: int = 50  # K for the grid sweep (the paper: 100)
    epsilon: float = 0.05  # entropic regularisation ε of the transport (training and re-ranking)
    uniform_marginals: bool = False  # uniform 1/G² marginals instead of cross-correlation ones
    paper_dataset: str = "CUB-200"  # which of the paper's datasets is printed beside ours (CUB-200, Cars196, SOP)
    cost_top_ks: list = field(default_factory=lambda: [10, 50])  # K values of the re-ranking cost table
    cost_grid_sizes: list = field(default_factory=lambda: [2, 4])  # G values of the re-ranking cost table
    cost_queries: int = 32  # queries timed per (K, G) cell of the cost table
    example_queries: int = 2  # queries in the transport-plan figure
    example_retrievals: int = 3  # retrievals per query in the transport-plan figure

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.top_ks or min(self.top_ks) < 0:
            raise ValueError(f"parameter 'top_ks' must be a non-empty list of K ≥ 0, got {self.top_ks!r}")
        if not self.grid_sizes or min(self.grid_sizes) < 1 or self.grid_size < 1:
            raise ValueError(
                f"parameters 'grid_sizes'/'grid_size' must be positive, got {self.grid_sizes!r} / {self.grid_size!r}"
            )

    def transport_options(self) -> TransportOptions:
        return TransportOptions(epsilon=self.epsilon, uniform_marginals=self.uniform_marginals)

    def reference_k(self) -> int:
        """The re-ranked K the readings compare with K = 0: ``top_k`` if swept, else the largest K."""
        return self.top_k if self.top_k in self.top_ks else max(self.top_ks)

    def reference_grid(self) -> int:
        """The G the readings compare with the smallest G: ``grid_size`` if swept, else the largest G."""
        return self.grid_size if self.grid_size in self.grid_sizes else max(self.grid_sizes)


# --------------------------------------------------------------------------------------------------
# variants and runs


def diml_variant_name(base_loss: str, config: DIMLStudy) -> str:
    """``diml`` for DIML + MS at the defaults (the comparison notebook's run), ``diml_<base>`` otherwise, with
    suffixes for non-default training settings so runs with other settings never share a folder."""
    name = "diml" if base_loss == "ms" else f"diml_{base_loss}"
    if config.grid_size != DEFAULT_GRID_SIZE:
        name += f"_g{config.grid_size}"
    if config.epsilon != DEFAULT_EPSILON:
        name += f"_eps{config.epsilon:g}"
    if config.uniform_marginals:
        name += "_uniform"
    return name


def variants(config: DIMLStudy) -> dict[str, dict[str, Any]]:
    """Variant name → run spec: the plain baseline of each base loss (named as the loss: ``ms``, ``margin``)
    and, with ``train_diml``, its DIML-trained counterpart."""
    unknown = [b for b in config.base_losses if b not in BASE_LOSS_NAMES]
    if unknown:
        raise ValueError(f"base_losses: unknown {unknown}; valid: {sorted(BASE_LOSS_NAMES)}")
    specs: dict[str, dict[str, Any]] = {}
    for base in config.base_losses:
        specs[base] = {"method": base}
        if config.train_diml:
            kwargs: dict[str, Any] = {} if base == "ms" else {"base_loss": base}
            if config.grid_size != DEFAULT_GRID_SIZE:
                kwargs["grid_size"] = config.grid_size
            if config.epsilon != DEFAULT_EPSILON:
                kwargs["epsilon"] = config.epsilon
            if config.uniform_marginals:
                kwargs["uniform_marginals"] = True
            specs[diml_variant_name(base, config)] = {"method": "diml", "method_kwargs": kwargs}
    return specs


def run_models(config: DIMLStudy) -> list[tuple[str, RunResult]]:
    """Train (or load) every variant × dataset × seed of the protocol."""
    return run_grid(config.protocol.grid(variants(config)), workers=config.protocol.workers)


def example_run(results: list[tuple[str, RunResult]], config: DIMLStudy) -> RunResult:
    """The model shown in the figures: DIML + MS (else the ``ms`` baseline, else the first run) on the first
    dataset and seed."""
    protocol = config.protocol
    first = [
        (v, r) for v, r in results if r.config.dataset == protocol.datasets[0] and r.config.seed == protocol.seeds[0]
    ] or results
    by_variant = dict(first)
    return by_variant.get(diml_variant_name("ms", config)) or by_variant.get("ms") or first[0][1]


def example_query_indices(sets: Mapping[str, GridEmbeddings | None], *, count: int, seed: int = 0) -> list[int]:
    """``count`` query indices drawn without replacement (seeded)."""
    n = len(sets["query"].global_)
    return sorted(np.random.default_rng(seed).choice(n, size=min(count, n), replace=False).tolist())


def _base_and_training(result: RunResult) -> tuple[str, str]:
    if result.config.method == "diml":
        return result.config.method_kwargs.get("base_loss", "ms"), "DIML"
    return result.config.method, "baseline"


# --------------------------------------------------------------------------------------------------
# re-ranking sweeps


def _sweep(
    sets: Mapping[str, Any], *, grid: int, top_ks: Sequence[int], options: TransportOptions
) -> dict[int, dict[str, float]]:
    query, gallery = sets["query"], sets["gallery"]
    gallery_kwargs = (
        {}
        if gallery is None
        else {"global_gallery": gallery.global_, "local_gallery": gallery.local[grid], "gallery_labels": gallery.labels}
    )
    return reranked_retrieval_metrics(
        query.global_,
        query.local[grid],
        query.labels,
        top_ks=top_ks,
        options=options,
        device=sets["device"],
        **gallery_kwargs,
    )


def _sweep_settings(config: DIMLStudy, run_config: TrainConfig) -> dict[str, Any]:
    options = config.transport_options()
    return {
        **embedding_precision(run_config),
        "top_ks": sorted(config.top_ks),
        "grid_sizes": sorted(config.grid_sizes),
        "grid_size": config.grid_size,
        "top_k": config.top_k,
        "epsilon": options.epsilon,
        "uniform": options.uniform_marginals,
        "tolerance": options.tolerance,
        "max_iterations": options.max_iterations,
    }


def _sweep_cache(result: RunResult, config: DIMLStudy) -> Path:
    return result.run_dir / f"diml_rerank-{cache_key(_sweep_settings(config, result.config))}.json"


def rerank_sweeps(result: RunResult, config: DIMLStudy, *, variant: str = "") -> list[dict[str, Any]]:
    """Rows of the K sweep (G = ``grid_size``) and the G sweep (K = ``top_k``) for one trained run (cached)."""
    options = config.transport_options()
    settings = _sweep_settings(config, result.config)
    cache = _sweep_cache(result, config)
    if cache.is_file():
        return json.loads(cache.read_text())["rows"]
    sets = evaluation_sets(result, grid_sizes=sorted(set(config.grid_sizes) | {config.grid_size}))
    base, training = _base_and_training(result)
    common = {
        "dataset": result.config.dataset,
        "seed": result.config.seed,
        "base_loss": base,
        "training": training,
        "variant": variant or result.config.method,
    }
    rows = []
    started = time.perf_counter()
    by_k = _sweep(sets, grid=config.grid_size, top_ks=config.top_ks, options=options)
    seconds = time.perf_counter() - started
    rows += [
        {**common, "sweep": "K", "K": k, "G": config.grid_size, **values, "seconds": seconds}
        for k, values in by_k.items()
    ]
    for grid in sorted(config.grid_sizes):
        started = time.perf_counter()
        values = (
            by_k[config.top_k]
            if grid == config.grid_size and config.top_k in by_k
            else _sweep(sets, grid=grid, top_ks=[config.top_k], options=options)[config.top_k]
        )
        rows.append(
            {**common, "sweep": "G", "K": config.top_k, "G": grid, **values, "seconds": time.perf_counter() - started}
        )
    write_json(cache, {"settings": settings, "rows": rows})
    return rows


def _rerank_sweeps_in_process(train_config: dict[str, Any], study_config: dict[str, Any], variant: str) -> None:
    rerank_sweeps(run(TrainConfig(**train_config)), DIMLStudy(**study_config), variant=variant)


def sweep_frame(results: list[tuple[str, RunResult]], config: DIMLStudy) -> pd.DataFrame:
    """All sweep rows of all runs (one row per run × sweep × K or G); with ``workers > 1`` the runs' sweeps
    are computed ``workers`` at a time in separate processes first (each writes its run's cache)."""
    missing = [(variant, result) for variant, result in results if not _sweep_cache(result, config).is_file()]
    if config.protocol.workers > 1 and len(missing) > 1:
        call_in_processes(
            _rerank_sweeps_in_process,
            [(result.config.to_dict(), config.to_dict(), variant) for variant, result in missing],
            workers=config.protocol.workers,
        )
    return pd.DataFrame([row for variant, result in results for row in rerank_sweeps(result, config, variant=variant)])


# --------------------------------------------------------------------------------------------------
# tables and readings


def _paper_values(base: str, training: str, key: tuple[str, int], table: Mapping, dataset: str) -> list[Any]:
    values = table.get(key, {}).get(dataset) if training == "baseline" else None
    return list(values) if values else ["–"] * len(METRICS)


def rerank_sweep_table(frame: pd.DataFrame, *, sweep: str, paper_dataset: str = "CUB-200") -> pd.DataFrame:
    """Mean ± std over seeds of P@1 / RP / MAP@R (percent) per dataset, base loss, training and K (or G), with
    the paper's numbers for the re-ranked baselines beside them (``paper …`` columns; DIML-trained rows have
    none: the supplement reports re-ranking only)."""
    if paper_dataset not in PAPER_DATASETS:
        raise ValueError(f"paper_dataset: expected one of {PAPER_DATASETS}, got {paper_dataset!r}")
    column = "K" if sweep == "K" else "G"
    rows = frame[frame["sweep"] == sweep]
    table = summarize(rows, by=["dataset", "base_loss", "training", column], metrics=METRICS)
    paper = PAPER_TRUNCATION if sweep == "K" else PAPER_GRID
    papers = [
        _paper_values(b, t, (b, int(v)), paper, paper_dataset)
        for b, t, v in zip(table["base_loss"], table["training"], table[column])
    ]
    for index, metric in enumerate(METRICS):
        table[f"paper {metric}"] = [p[index] for p in papers]
    return table


def display_columns(table: pd.DataFrame) -> pd.DataFrame:
    """The table without the numeric ``_mean``/``_std`` helper columns."""
    return table[[c for c in table.columns if not c.endswith(("_mean", "_std"))]]


def _paper_gain(table: Mapping, base: str, low: int, high: int, dataset: str, metric: str) -> float | None:
    if (base, low) not in table or (base, high) not in table:
        return None
    index = METRICS.index(metric)
    return table[(base, high)][dataset][index] - table[(base, low)][dataset][index]


def sweep_readings(
    frame: pd.DataFrame, *, sweep: str, low: int, high: int, paper_dataset: str = "CUB-200", metric: str = "P@1"
) -> list[str]:
    """One sentence per (dataset, base loss, training): the change of ``metric`` from ``low`` to ``high`` (K or
    G), paired per seed, with the study's verdict (:func:`~dmlstudy.verdicts.effect_sentence`) against
    the paper's change for the same base loss. ``frame``: the per-run rows of :func:`sweep_frame`."""
    column = "K" if sweep == "K" else "G"
    paper = PAPER_TRUNCATION if sweep == "K" else PAPER_GRID
    rows = frame[frame["sweep"] == sweep].assign(variant=lambda f: column + "=" + f[column].astype(int).astype(str))
    sentences = []
    for (dataset, base, training), group in rows.groupby(["dataset", "base_loss", "training"], sort=False):
        if not {low, high} <= set(group[column].astype(int)):
            continue
        ours = paired_differences(group, dataset, f"{column}={high}", f"{column}={low}", metric)
        gain = _paper_gain(paper, base, low, high, paper_dataset, metric) if training == "baseline" else None
        label = f"{dataset}, {BASE_LOSS_NAMES.get(base, base)} {'baseline re-ranked' if training == 'baseline' else 'DIML-trained'}"
        sentence = effect_sentence(
            f"{label}, {column} = {high} − {column} = {low}", ours=ours, paper=gain, unit=f"{metric} points"
        )
        if gain is not None:
            sentence = sentence.replace(f"; paper {gain:+.2f}", f"; the paper's {paper_dataset} row {gain:+.2f}")
        sentences.append(sentence)
    return sentences


def training_table(frame: pd.DataFrame, *, top_k: int) -> pd.DataFrame:
    """Baseline vs DIML-trained, each ranked by cosine (K = 0) and re-ranked (K = ``top_k``), from the K sweep."""
    rows = frame[(frame["sweep"] == "K") & frame["K"].isin([0, top_k])]
    return summarize(rows, by=["dataset", "base_loss", "K", "training"], metrics=METRICS)


def training_readings(frame: pd.DataFrame, *, top_k: int, metric: str = "P@1") -> list[str]:
    """Per dataset, base loss and ranking (cosine, K = 0, and re-ranked, K = ``top_k``): DIML training −
    the baseline in ``metric``, paired per seed, with the study's verdict on "DIML training > baseline"
    (:func:`~dmlstudy.verdicts.effect_sentence`; the supplement gives no number). ``frame``: the
    per-run rows of :func:`sweep_frame`."""
    rows = frame[(frame["sweep"] == "K") & frame["K"].isin([0, top_k])].assign(variant=lambda f: f["training"])
    sentences = []
    for (dataset, base, k), group in rows.groupby(["dataset", "base_loss", "K"], sort=False):
        if {"baseline", "DIML"} <= set(group["training"]):
            ranking = "cosine ranking" if int(k) == 0 else f"re-ranked top {int(k)}"
            ours = paired_differences(group, dataset, "DIML", "baseline", metric)
            sentences.append(
                effect_sentence(
                    f"{dataset}, {BASE_LOSS_NAMES.get(base, base)}, {ranking}: DIML training − baseline",
                    ours=ours,
                    paper=None,
                    unit=f"{metric} points",
                )
            )
    return sentences


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
    from dmlstudy import plots

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


# --------------------------------------------------------------------------------------------------
# cost


def rerank_cost(
    sets: Mapping[str, GridEmbeddings | None],
    *,
    top_ks: Sequence[int],
    grid_sizes: Sequence[int],
    queries: int = 64,
    options: TransportOptions | None = None,
) -> pd.DataFrame:
    """Measured milliseconds per query of the structural similarities of its top-K candidates (the re-ranking's
    cost beyond the cosine search), per (K, G), on the first ``queries`` queries of a trained model's test set."""
    from dmlstudy import metrics as metric_functions

    query_set = sets["query"]
    n = min(queries, len(query_set.global_))
    rows = []
    for top_k in top_ks:
        candidates, _ = metric_functions.nearest_neighbors(
            query_set.global_[:n], query_set.global_, k=min(top_k + 1, len(query_set.global_) - 1)
        )
        candidates = np.stack([row[row != q][:top_k] for q, row in enumerate(candidates)])
        for grid in grid_sizes:
            if grid not in query_set.local:
                continue
            local = query_set.local[grid]
            started = time.perf_counter()
            candidate_structural_similarity(
                query_set.global_[:n], local[:n], query_set.global_, local, candidates, options=options
            )
            seconds = time.perf_counter() - started
            rows.append({"K": top_k, "G": grid, "pairs": candidates.size, "ms per query": 1000 * seconds / n})
    return pd.DataFrame(rows)


def cost_figure(cost: pd.DataFrame) -> plt.Figure:
    """Milliseconds per query against K, one line per G (points only with fewer than three K)."""
    from dmlstudy import plots

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
    from dmlstudy import plots

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
