"""DIML study: the notebook's config, the paper's numbers, the variants and their runs, the cached
re-ranking sweeps over K and G, and the measured re-ranking cost."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dmlstudy.experiments.kit import StudyConfig, cache_key, embedding_precision, evaluation_sets
from dmlstudy.experiments.papers.numbers import numbers
from dmlstudy.methods.diml import DEFAULT_GRID_SIZE, GridEmbeddings
from dmlstudy.records import write_json
from dmlstudy.reranking import reranked_retrieval_metrics
from dmlstudy.run.train import RunResult, TrainConfig, run
from dmlstudy.study.grids import call_in_processes, run_grid
from dmlstudy.transport import DEFAULT_EPSILON, TransportOptions, candidate_structural_similarity

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


def example_query_indices(n: int, *, count: int, seed: int = 0) -> list[int]:
    """``count`` of the ``n`` query indices, drawn without replacement (seeded)."""
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
