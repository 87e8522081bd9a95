"""DIML re-ranking of the ``ms`` runs: the comparison's ``diml_rerank`` row and the claims' extra re-rankings.

Each query's cosine top-K is re-ranked by ``cos + s_struct`` on the run's G × G local embeddings
(:func:`dmlstudy.structural.reranking.reranked_retrieval_metrics`); a re-ranked row keeps the ``ms`` run's NMI, ESD, ρ and
training time (the embeddings are the same) and adds ``rerank_seconds``. Results are cached in the ``ms`` run
folders (``compare_rerank-<key>.json``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dmlstudy import numerics
from dmlstudy.data import evaluation_protocol
from dmlstudy.data.emoji import test_split_families
from dmlstudy.data.emoji_sources import RELATIVES
from dmlstudy.experiments import kit
from dmlstudy.findings import robustness
from dmlstudy.findings.claims import claim_reranks
from dmlstudy.metrics.relatives import masked_cosine, relatives_out_recall
from dmlstudy.paths import data_root
from dmlstudy.records import write_json
from dmlstudy.rows import BASELINE, RERANK, is_reranked, trained_row
from dmlstudy.run.train import RunResult, TrainConfig, run
from dmlstudy.structural import transport
from dmlstudy.structural.reranking import rerank_top_k, reranked_retrieval_metrics
from dmlstudy.structural.transport import TransportOptions
from dmlstudy.study.grids import call_in_processes


@dataclass(frozen=True)
class Reranking:
    """The comparison's DIML re-ranking of the ``ms`` runs: the ``diml_rerank`` row re-ranks each query's cosine
    top-``top_k`` on ``grid`` × ``grid`` local embeddings (the comparison's ``rerank_top_k`` and ``rerank_grid``);
    ``shown`` says whether that row is one of the comparison's (without it nothing is re-ranked, the claims'
    extra re-rankings included), and ``workers`` how many engine workers compute the missing ones."""

    top_k: int
    grid: int
    shown: bool = True
    workers: int = 1

    def at(self, *, top_k: int | None = None, grid: int | None = None) -> tuple[int, int]:
        """``(top_k, grid)`` of a re-ranking: the given values, else the ``diml_rerank`` row's."""
        return (self.top_k if top_k is None else top_k, self.grid if grid is None else grid)


def _rerank_settings(config: TrainConfig, *, top_k: int, grid: int, options: TransportOptions) -> dict[str, Any]:
    ks = tuple(config.recall_ks) or evaluation_protocol(config.dataset).recall_ks
    return {
        "top_k": top_k,
        "grid": grid,
        "ks": list(ks),
        "epsilon": options.epsilon,
        "uniform": options.uniform_marginals,
        "tolerance": options.tolerance,
        "max_iterations": options.max_iterations,
        **kit.embedding_precision(config),
    }


def _rerank_cache(run_dir: Path, settings: Mapping[str, Any]) -> Path:
    return run_dir / f"compare_rerank-{kit.cache_key(settings)}.json"


def _rerank_metrics_in_process(train_config: dict[str, Any], top_k: int, grid: int) -> None:
    rerank_metrics(run(TrainConfig(**train_config)), top_k=top_k, grid=grid)


def rerank_metrics(
    result: RunResult, *, top_k: int, grid: int, options: TransportOptions | None = None
) -> dict[str, float]:
    """Retrieval metrics of one trained run after DIML re-ranking of each query's cosine top-``top_k`` (all
    Recall@K of the dataset's list, RP, MAP@R) and the seconds it took; cached in the run folder.

    ``top_k`` is capped at the number of retrievable items. Uses the run's query (and gallery) sets embedded
    at ``grid`` × ``grid`` through :func:`dmlstudy.experiments.kit.evaluation_sets`, re-ranked on the run's device.
    """
    options = options or TransportOptions()
    ks = tuple(result.config.recall_ks) or evaluation_protocol(result.config.dataset).recall_ks
    settings = _rerank_settings(result.config, top_k=top_k, grid=grid, options=options)
    cache = _rerank_cache(result.run_dir, settings)
    if cache.is_file():
        return json.loads(cache.read_text())["metrics"]
    numerics.pin_process()
    started = time.perf_counter()
    sets = kit.evaluation_sets(result, grid_sizes=[grid])
    query, gallery = sets["query"], sets["gallery"]
    retrievable = len(query.global_) - 1 if gallery is None else len(gallery.global_)
    gallery_kwargs = (
        {}
        if gallery is None
        else {"global_gallery": gallery.global_, "local_gallery": gallery.local[grid], "gallery_labels": gallery.labels}
    )
    k = min(top_k, retrievable)
    values = reranked_retrieval_metrics(
        query.global_,
        query.local[grid],
        query.labels,
        top_ks=[k],
        ks=ks,
        options=options,
        device=sets["device"],
        **gallery_kwargs,
    )[k]
    metrics = {
        **{name: float(value) for name, value in values.items()},
        "rerank_top_k": k,
        "rerank_seconds": time.perf_counter() - started,
    }
    write_json(cache, {"settings": settings, "metrics": metrics, "numerics": numerics.observed()["numerics"]})
    return metrics


def rerank_numerics(result: RunResult, *, top_k: int, grid: int, options: TransportOptions | None = None) -> str:
    """The numerics tag of the process that computed a run's cached re-ranking (:func:`rerank_metrics`);
    ``unrecorded`` for a cache written before re-rankings recorded it."""
    settings = _rerank_settings(result.config, top_k=top_k, grid=grid, options=options or TransportOptions())
    cache = _rerank_cache(result.run_dir, settings)
    return str(json.loads(cache.read_text()).get("numerics", "unrecorded")) if cache.is_file() else "unrecorded"


def _missing_reranks(results: Sequence[tuple[str, RunResult]], *, top_k: int, grid: int) -> list[tuple]:
    """``(run config, top_k, grid)`` of every ``ms`` run of ``results`` without that re-ranking's cache."""
    options = TransportOptions()
    return [
        (result.config.to_dict(), top_k, grid)
        for name, result in results
        if name == BASELINE
        and not _rerank_cache(
            result.run_dir, _rerank_settings(result.config, top_k=top_k, grid=grid, options=options)
        ).is_file()
    ]


def _rerank_in_processes(missing: list[tuple], *, workers: int) -> None:
    """The ``missing`` re-rankings as engine tasks, each writing its run's cache (read afterwards); with one
    worker or one re-ranking, nothing: the caller computes it in this process."""
    if workers > 1 and len(missing) > 1:
        call_in_processes(_rerank_metrics_in_process, missing, workers=workers)


def rerank_missing(results: Sequence[tuple[str, RunResult]], reranking: Reranking) -> None:
    """Every re-ranking of :func:`rerank_variants` that the ``ms`` runs of ``results`` have not cached yet, as one
    batch of engine tasks (each distinct ``top_k`` / ``grid`` once); with one worker or one re-ranking, nothing:
    :func:`rerank_results` computes it in this process."""
    settings = dict.fromkeys((top_k, grid) for _, top_k, grid in rerank_variants(reranking))  # distinct, in order
    missing = [job for top_k, grid in settings for job in _missing_reranks(results, top_k=top_k, grid=grid)]
    _rerank_in_processes(missing, workers=reranking.workers)


def rerank_results(
    results: Sequence[tuple[str, RunResult]],
    reranking: Reranking,
    *,
    variant: str = RERANK,
    top_k: int | None = None,
    grid: int | None = None,
) -> list[dict[str, Any]]:
    """One ``variant`` row per ``ms`` run: the retrieval metrics re-ranked in the top ``top_k`` on ``grid`` ×
    ``grid`` cells (default: the ``diml_rerank`` row's, :meth:`Reranking.at`), and the ``ms`` run's NMI, ESD,
    ρ, training time and parameters (re-ranking does not change the embeddings). None unless the comparison shows
    a re-ranked row (``reranking.shown``): the claims' extra re-rankings need it too."""
    if not reranking.shown:
        return []
    top_k, grid = reranking.at(top_k=top_k, grid=grid)
    _rerank_in_processes(_missing_reranks(results, top_k=top_k, grid=grid), workers=reranking.workers)
    rows = []
    for name, result in results:
        if name != BASELINE:
            continue
        reranked = rerank_metrics(result, top_k=top_k, grid=grid)
        row = {
            "variant": variant,
            "dataset": result.config.dataset,
            "method": RERANK,
            "seed": result.config.seed,
            "method_kwargs": json.dumps({"top_k": reranked["rerank_top_k"], "grid_size": grid}),
            "run_dir": str(result.config.run_dir),  # the re-ranked ms run
            **result.metrics,
            "numerics": rerank_numerics(result, top_k=top_k, grid=grid),  # of the re-ranking, not of the ms run
        }
        row.update(reranked)
        rows.append(row)
    return rows


def rerank_variants(reranking: Reranking) -> list[tuple[str, int, int]]:
    """``(variant, top_k, grid)`` of every re-ranking of the ``ms`` runs the comparison reads: the table's
    ``diml_rerank`` row, then the claims' extra ones (:func:`~dmlstudy.findings.claims.claim_reranks`); none
    unless ``diml_rerank`` is a row of the comparison."""
    if not reranking.shown:
        return []
    extra = [(name, *reranking.at(**overrides)) for name, overrides in claim_reranks().items()]
    return [(RERANK, *reranking.at()), *extra]


def claim_rerank_results(results: Sequence[tuple[str, RunResult]], reranking: Reranking) -> list[dict[str, Any]]:
    """The extra re-rankings the claims compare (:func:`~dmlstudy.findings.claims.claim_reranks`:
    ``diml_rerank-G=1``, …) of every ``ms`` run, each row named as in ``claims.yaml``; none unless ``diml_rerank`` is
    a row of the comparison."""
    return [
        row
        for name, top_k, grid in rerank_variants(reranking)[1:]
        for row in rerank_results(results, reranking, variant=name, top_k=top_k, grid=grid)
    ]


# ----------------------------------------------------------------------------------------------
# The robustness study's relatives-out column, from the default study's runs
# ----------------------------------------------------------------------------------------------
def relatives_out_reranked_recall(
    global_embeddings: np.ndarray,
    local_embeddings: Any,
    labels: Sequence[int],
    families: Sequence[str],
    *,
    top_k: int,
    device: Any = None,
) -> float:
    """R@1 in points after DIML's re-ranking (:func:`dmlstudy.structural.reranking.rerank_top_k`: cos + s_struct) of each
    query's cosine top-``top_k`` among the items left once its relative family is out."""
    global_embeddings = np.asarray(global_embeddings, dtype=np.float32)
    cosine = masked_cosine(global_embeddings, families, relatives=RELATIVES)
    k = min(top_k, len(labels) - 1)
    nearest = np.argpartition(-cosine, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(cosine, nearest, axis=1), axis=1, kind="stable")
    candidates = np.take_along_axis(nearest, order, axis=1)  # the cosine top-k, best first
    structural = transport.candidate_structural_similarity(
        global_embeddings, local_embeddings, global_embeddings, local_embeddings, candidates, device=device
    )
    reranked = rerank_top_k(candidates, np.take_along_axis(cosine, candidates, axis=1), structural, top_k=k)
    labels = np.asarray(labels)
    return float(100.0 * np.mean(labels[reranked[:, 0]] == labels))


def relatives_per_seed(
    default_per_seed: pd.DataFrame, runs_folder: str | Path, *, rerank_top_k: int = 100, rerank_grid: int = 4
) -> pd.DataFrame:
    """The relatives-out column's per-seed rows (``regime, dataset, row, seed, R@1``): each headline row's run
    of the default study (found by the digest its per-seed row records) evaluated with each query's relative
    family out of its gallery; DIML's re-ranking row re-ranks its MS run's embeddings the same way."""
    rows = {name for claim in robustness.headline_claims() for name in (claim.a, claim.b)}
    here = default_per_seed[(default_per_seed["regime"] == robustness.REGIME) & default_per_seed["row"].isin(rows)]
    families = test_split_families("emoji", data_root())
    records = []
    for entry in here.to_dict("records"):
        found = sorted(Path(runs_folder).glob(f"*-{entry['digest']}"))  # one configuration may carry two labels
        named = trained_row(entry["row"])
        run_dir = next((d for d in found if f"-{named}-seed{entry['seed']}-" in d.name), found[0] if found else None)
        if run_dir is None:
            raise FileNotFoundError(
                f"no run folder *-{entry['digest']} in {runs_folder} ({entry['row']}, seed {entry['seed']})"
            )
        with np.load(run_dir / "embeddings.npz") as stored:
            embeddings, labels = stored["embeddings"], stored["labels"]
        if len(labels) != len(families):
            raise ValueError(f"{run_dir}: {len(labels)} test embeddings, but the test split has {len(families)} images")
        if is_reranked(entry["row"]):
            sets = kit.evaluation_sets(run(TrainConfig.of_run_folder(run_dir)), grid_sizes=[rerank_grid])
            query = sets["query"]
            recall = relatives_out_reranked_recall(
                query.global_, query.local[rerank_grid], labels, families, top_k=rerank_top_k, device=sets["device"]
            )
        else:
            recall = relatives_out_recall(embeddings, labels, families, relatives=RELATIVES)
        records.append(
            {"regime": robustness.REGIME, "dataset": "emoji", "row": entry["row"], "seed": entry["seed"], "R@1": recall}
        )
    return pd.DataFrame(records)
