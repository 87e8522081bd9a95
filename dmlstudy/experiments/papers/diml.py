"""DIML's own part of notebook 20 (Zhao et al., Towards Interpretable Deep Metric Learning with Structural Matching,
ICCV 2021): its parameters, the re-ranking sweeps over K and G of every trained run (cached in the run folder as
``diml_rerank-<key>.json``), their tables and readings, and its figures. Its runs and tables are ``diml.yaml``."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from dmlstudy import plots
from dmlstudy.experiments import ablations
from dmlstudy.experiments.kit import StudyConfig, cache_key, embedding_precision, evaluation_sets
from dmlstudy.findings.numbers import numbers
from dmlstudy.records import write_json
from dmlstudy.run.train import RunResult, TrainConfig, run
from dmlstudy.structural.reranking import reranked_retrieval_metrics
from dmlstudy.structural.transport import TransportOptions, structural_similarity
from dmlstudy.study.grids import call_in_processes, run_grid
from dmlstudy.study.report import summarize
from dmlstudy.verdicts import effect_sentence, paired_differences


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


DECLARED = ablations.declaration("diml", config=DIMLStudy)
TRAININGS = {"baselines": "baseline", "trained": "DIML"}  # declared table of runs → its rows' training
BASE_LOSS_NAMES: dict[str, str] = DECLARED.table("baselines")["paper_specific"]["labels"]
RERANKED = {  # "K" / "G" → its table
    spec["paper_specific"]["rerank"]: spec
    for spec in DECLARED.tables.values()
    if "rerank" in spec.get("paper_specific", {})
}
METRICS: list[str] = RERANKED["K"]["metrics"]
PAPER = {sweep: numbers(DECLARED.paper, spec["paper"]["table"]) for sweep, spec in RERANKED.items()}
PAPER_DATASETS = tuple(next(iter(PAPER["K"].values())))  # (base loss, K or G) → {dataset: (P@1, RP, MAP@R)}


# runs
def variants(config: DIMLStudy) -> dict[str, dict[str, Any]]:
    """Run name → spec: per base loss its plain run and, with ``train_diml``, its DIML-trained run (``diml.yaml``)."""
    tables = [table for table in TRAININGS if ablations.enabled(DECLARED, table, config)]
    rows = {table: ablations.table_rows(DECLARED, table, config) for table in tables}
    return dict(rows[table][base] for base in config.base_losses for table in tables)


def run_models(config: DIMLStudy) -> list[tuple[str, RunResult]]:
    """Train (or load) every variant × dataset × seed of the protocol."""
    return run_grid(config.protocol.grid(variants(config)), workers=config.protocol.workers)


def trainings(config: DIMLStudy) -> dict[str, tuple[str, str]]:
    """Run name → (base loss, training) of every declared run at ``config``'s settings, DIML-trained ones first."""
    every = SimpleNamespace(**{**vars(config), "base_losses": list(DECLARED.table("baselines")["rows"])})
    named = {
        name: (base, training)
        for table, training in TRAININGS.items()
        for base, (name, _) in ablations.table_rows(DECLARED, table, every).items()
    }
    return dict(sorted(named.items(), key=lambda item: item[1][1] != TRAININGS["trained"]))


def example_run(results: list[tuple[str, RunResult]], config: DIMLStudy) -> RunResult:
    """The model the figures show: the first declared run present (DIML + MS, else the MS baseline) on the first
    dataset and seed, else the first run there."""
    protocol = config.protocol
    first = [
        (v, r) for v, r in results if r.config.dataset == protocol.datasets[0] and r.config.seed == protocol.seeds[0]
    ] or results
    by_variant = dict(first)
    return next((by_variant[name] for name in trainings(config) if name in by_variant), first[0][1])


def example_query_indices(n: int, *, count: int, seed: int = 0) -> list[int]:
    """``count`` of the ``n`` query indices, drawn without replacement (seeded)."""
    return sorted(np.random.default_rng(seed).choice(n, size=min(count, n), replace=False).tolist())


# re-ranking sweeps
def _sweep(sets: Mapping[str, Any], *, grid: int, top_ks: Sequence[int], options: TransportOptions) -> dict:
    query, gallery = sets["query"], sets["gallery"]
    kwargs = {"top_ks": top_ks, "options": options, "device": sets["device"]}
    if gallery is not None:
        kwargs |= {"global_gallery": gallery.global_, "gallery_labels": gallery.labels}
        kwargs["local_gallery"] = gallery.local[grid]
    return reranked_retrieval_metrics(query.global_, query.local[grid], query.labels, **kwargs)


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
    options, cache = config.transport_options(), _sweep_cache(result, config)
    if cache.is_file():
        return json.loads(cache.read_text())["rows"]
    sets = evaluation_sets(result, grid_sizes=sorted(set(config.grid_sizes) | {config.grid_size}))
    variant = variant or result.config.method
    base, training = trainings(config).get(variant, (variant, TRAININGS["baselines"]))
    common = {"dataset": result.config.dataset, "seed": result.config.seed, "base_loss": base, "training": training}
    common |= {"variant": variant}
    started = time.perf_counter()
    by_k = _sweep(sets, grid=config.grid_size, top_ks=config.top_ks, options=options)
    seconds = time.perf_counter() - started
    rows = [{**common, "sweep": "K", "K": k, "G": config.grid_size, **v, "seconds": seconds} for k, v in by_k.items()]
    top_k = config.top_k
    for grid in sorted(config.grid_sizes):
        started = time.perf_counter()
        reused = grid == config.grid_size and top_k in by_k  # the K sweep's own setting
        values = by_k[top_k] if reused else _sweep(sets, grid=grid, top_ks=[top_k], options=options)[top_k]
        seconds = time.perf_counter() - started
        rows.append({**common, "sweep": "G", "K": top_k, "G": grid, **values, "seconds": seconds})
    write_json(cache, {"settings": _sweep_settings(config, result.config), "rows": rows})
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


# tables and readings
def rerank_sweep_table(frame: pd.DataFrame, *, sweep: str, paper_dataset: str = "CUB-200") -> pd.DataFrame:
    """Mean ± std over seeds of P@1 / RP / MAP@R (percent) per dataset, base loss, training and K (or G), with
    the paper's numbers for the re-ranked baselines beside them (``paper …`` columns; DIML-trained rows have
    none: the supplement reports re-ranking only)."""
    if paper_dataset not in PAPER_DATASETS:
        raise ValueError(f"paper_dataset: expected one of {PAPER_DATASETS}, got {paper_dataset!r}")
    table = summarize(frame[frame["sweep"] == sweep], by=["dataset", "base_loss", "training", sweep], metrics=METRICS)
    papers = [
        PAPER[sweep].get((b, int(v)), {}).get(paper_dataset) if t == TRAININGS["baselines"] else None
        for b, t, v in zip(table["base_loss"], table["training"], table[sweep])
    ]
    for index, metric in enumerate(METRICS):
        table[f"paper {metric}"] = [p[index] if p else "–" for p in papers]
    return table


def sweep_readings(
    frame: pd.DataFrame, *, sweep: str, low: int, high: int, paper_dataset: str = "CUB-200", metric: str = "P@1"
) -> list[str]:
    """One sentence per (dataset, base loss, training): the change of ``metric`` from ``low`` to ``high`` (K or
    G), paired per seed, with the study's verdict (:func:`~dmlstudy.verdicts.effect_sentence`) against
    the paper's change for the same base loss. ``frame``: the per-run rows of :func:`sweep_frame`."""
    paper, index = PAPER[sweep], METRICS.index(metric)
    rows = frame[frame["sweep"] == sweep].assign(variant=lambda f: sweep + "=" + f[sweep].astype(int).astype(str))
    sentences = []
    for (dataset, base, training), group in rows.groupby(["dataset", "base_loss", "training"], sort=False):
        if not {low, high} <= set(group[sweep].astype(int)):
            continue
        ours = paired_differences(group, dataset, f"{sweep}={high}", f"{sweep}={low}", metric)
        gain = None
        if training == TRAININGS["baselines"] and (base, low) in paper and (base, high) in paper:
            gain = paper[(base, high)][paper_dataset][index] - paper[(base, low)][paper_dataset][index]
        ranked = "baseline re-ranked" if training == TRAININGS["baselines"] else "DIML-trained"
        what = f"{dataset}, {BASE_LOSS_NAMES.get(base, base)} {ranked}, {sweep} = {high} − {sweep} = {low}"
        sentence = effect_sentence(what, ours=ours, paper=gain, unit=f"{metric} points")
        if gain is not None:
            sentence = sentence.replace(f"; paper {gain:+.2f}", f"; the paper's {paper_dataset} row {gain:+.2f}")
        sentences.append(sentence)
    return sentences


def training_table(frame: pd.DataFrame, *, top_k: int) -> pd.DataFrame:
    """Baseline vs DIML-trained, each ranked by cosine (K = 0) and re-ranked (K = ``top_k``), from the K sweep."""
    rows = frame[(frame["sweep"] == "K") & frame["K"].isin([0, top_k])]
    return summarize(rows, by=["dataset", "base_loss", "K", "training"], metrics=METRICS)


def training_readings(frame: pd.DataFrame, *, top_k: int, metric: str = "P@1") -> list[str]:
    """Per dataset, base loss and ranking (cosine, K = 0, and re-ranked, K = ``top_k``): DIML training − the
    baseline in ``metric``, paired per seed, with the study's verdict (the supplement gives no number)."""
    rows = frame[(frame["sweep"] == "K") & frame["K"].isin([0, top_k])].assign(variant=lambda f: f["training"])
    baseline, trained = TRAININGS["baselines"], TRAININGS["trained"]
    sentences = []
    for (dataset, base, k), group in rows.groupby(["dataset", "base_loss", "K"], sort=False):
        if {baseline, trained} <= set(group["training"]):
            ranking = "cosine ranking" if int(k) == 0 else f"re-ranked top {int(k)}"
            ours = paired_differences(group, dataset, trained, baseline, metric)
            what = f"{dataset}, {BASE_LOSS_NAMES.get(base, base)}, {ranking}: DIML training − baseline"
            sentences.append(effect_sentence(what, ours=ours, paper=None, unit=f"{metric} points"))
    return sentences


# figures
def toy_grids(*, seed: int = 0) -> dict[str, torch.Tensor]:
    """A worked example: a 3 × 3 'image' whose cells are unit vectors (d = 8), and the same content with its
    cells permuted (the object moved) plus noise; globals are the normalised cell means."""
    generator = torch.Generator().manual_seed(seed)
    local_s = torch.nn.functional.normalize(torch.randn(9, 8, generator=generator), dim=-1)
    permutation = torch.tensor([3, 4, 5, 6, 7, 8, 0, 1, 2])  # the content moved one row down (wrapping)
    noise = 0.25 * torch.randn(9, 8, generator=generator)
    local_t = torch.nn.functional.normalize(local_s[permutation] + noise, dim=-1)
    global_s, global_t = (torch.nn.functional.normalize(cells.mean(0), dim=0) for cells in (local_s, local_t))
    return dict(local_s=local_s, local_t=local_t, global_s=global_s, global_t=global_t, permutation=permutation)


WORKED_SETTINGS: tuple[tuple[float, bool], ...] = ((0.5, True), (0.05, True), (0.05, False))


def worked_example(
    *, settings: Sequence[tuple[float, bool]] = WORKED_SETTINGS, seed: int = 0
) -> tuple[plt.Figure, pd.DataFrame]:
    """The toy pair (:func:`toy_grids`): cell similarities S, the cross-correlation marginals, and the transport
    plan for each ``(ε, uniform marginals)`` setting (figure); and a table of s_struct beside the cosine of the
    two global vectors, the same-position average and the true-correspondence average."""
    toy = toy_grids(seed=seed)
    similarity = toy["local_s"] @ toy["local_t"].T  # 9 × 9
    mu, nu = torch.relu(toy["local_s"] @ toy["global_t"]), torch.relu(toy["local_t"] @ toy["global_s"])
    truth = similarity[toy["permutation"], torch.arange(9)]  # t's cell j shows s's cell π(j)
    figure, axes = plt.subplots(1, 2 + len(settings), figsize=(2.9 * (2 + len(settings)), 3.0))
    cells = {"xlabel": "cell j of t", "ylabel": "cell i of s", "xticks": range(9), "yticks": range(9)}
    image = axes[0].imshow(similarity.numpy(), cmap="RdBu_r", vmin=-1, vmax=1)
    axes[0].set(title="cell similarities S", **cells)
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
        axis.set(title=f"T: ε = {epsilon:g}, {marginals}\ns_struct = {value.item():.3f}", **cells)
        what = f"s_struct, ε = {epsilon:g}, {marginals} marginals ({transport.iterations} iterations)"
        rows.append({"quantity": what, "value": float(value)})
    figure.tight_layout()
    return figure, pd.DataFrame(rows)


def cost_figure(cost: pd.DataFrame) -> plt.Figure:
    """Milliseconds per query against K, one line per G (points only with fewer than three K)."""
    figure, axis = plt.subplots(figsize=(4.2, 3.0))
    for grid, group in cost.groupby("G"):
        style = plots.sweep_linestyle(group["K"])
        label = f"G = {grid} ({grid * grid} cells)"
        axis.plot(group["K"], group["ms per query"], marker="o", linestyle=style, label=label)
    axis.set(xlabel="truncation K", ylabel="ms per query", title="re-ranking cost (measured)")
    plots.integer_ticks(axis)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    plots.legend_outside(figure)
    return figure


def sweep_figure(frame: pd.DataFrame, *, sweep: str, metric: str = "P@1") -> plt.Figure:
    """``metric`` (mean ± std over seeds) against K or G, one panel per dataset, one line per base × training
    (points only where the sweep has fewer than :data:`dmlstudy.plots.MIN_SWEEP_VALUES` values)."""
    rows = frame[frame["sweep"] == sweep]
    datasets = list(dict.fromkeys(rows["dataset"]))
    figure, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.0), squeeze=False)
    for axis, dataset in zip(axes[0], datasets):
        for (base, training), group in rows[rows["dataset"] == dataset].groupby(["base_loss", "training"], sort=False):
            stats = group.groupby(sweep)[metric].agg(["mean", "std"]).fillna(0.0) * 100
            style, label = plots.sweep_linestyle(stats.index), f"{BASE_LOSS_NAMES.get(base, base)}, {training}"
            row = plots.method_style(group["variant"].iloc[0]) if "variant" in group else None
            colour = {"color": row.colour} if row and row.marker != plots.OTHER_MARKER else {}  # a row's own colour
            axis.errorbar(
                stats.index,
                stats["mean"],
                yerr=stats["std"],
                marker="o",
                linestyle=style,
                capsize=0,
                label=label,
                **colour,
            )
        axis.set(xlabel=sweep, ylabel=f"{metric} (%)", title=dataset)
        if sweep == "K":
            values = sorted(set(rows[sweep]))
            axis.set_xscale("symlog", linthresh=10)
            axis.set_xticks(values, labels=[f"{k:g}" for k in values])
        else:
            plots.integer_ticks(axis)
        axis.grid(alpha=0.3)
    figure.tight_layout()
    plots.legend_outside(figure)
    return figure
