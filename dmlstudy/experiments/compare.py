"""Notebook 90 (the headline comparison): every method of the study under one protocol, in one table per
dataset, plus the embedding geometry, projections, cost, and a reading of the four papers' claims.

``notebooks/90_compare.ipynb`` calls only the functions here. Runs come from :meth:`ProtocolConfig.grid`
with ``{name: {"method": name}}``, so run folders are ``<dataset>-<method>-seed<seed>``: the method
notebooks (10_crt, 20_diml, 30_cross_attention, 40_dgcrl) train ``ms`` and their method under exactly these
names, and ``resume=True`` reuses them (the plan must give every notebook the same protocol fields, or the
run folder refuses to resume with a message naming the differing fields).

Decisions (stated in the notebook too):

* ``diml_rerank`` is a row, not a training method: the ``ms`` runs' test embeddings re-ranked at test time
  with DIML's structural similarity (:func:`dmlstudy.methods.diml.reranked_retrieval_metrics`): the cosine
  top-``rerank_top_k`` of every query re-ranked by ``cos + s_struct`` on the trained ``ms`` model's
  ``rerank_grid`` × ``rerank_grid`` local embeddings (its own embedding layer applied per cell), DIML's
  default transport (ε = 0.05, cross-correlation marginals). Re-ranking changes the order of neighbours,
  not the embeddings, so its NMI, ESD, ρ and training time are those of the ``ms`` runs; its extra
  test-time cost is recorded as ``rerank_seconds``. Results are cached in the ``ms`` run folders
  (``compare_rerank-<key>.json``).
* Best per column: the highest mean over seeds *as displayed* (rounded to the table's decimals), so equal
  displayed numbers are all marked; every row of a dataset competes, classic baselines included.
* Claims (``claims.yaml``: the 8 headline claims × 2 datasets and the ablation claims the default study
  runs) are judged by the study's one rule, :func:`dmlstudy.experiments.kit.judge`: per-seed paired
  differences (seed s = the same backbone initialisation and batch sequence for both sides; only seeds both
  sides ran pair), a 95 % t-interval of their mean, and held / reversed / equivalent (inside ±``margin``) /
  undecided with the seeds that would decide it; fewer than 2 paired seeds give no verdict. Ablation claims
  read the paper notebooks' ablation runs by the same names (``ablation_datasets``, ``ablation_seeds``).
  Claims on epochs-to-best (:data:`kit.CENSORED_METRICS`) also pass :func:`kit.censor`: a verdict that runs
  cut short by the epoch cap could overturn is undecided (censored).
* ESD and ρ are the runs' own metrics (``metrics.json``: keys ``ESD``, ``rho``), computed on the test
  embeddings with ``drop_first = 0``. Projections (UMAP, t-SNE) use one fixed subset of the first dataset's
  test images (the first ``projection_classes`` classes, all their images, fewer than 4,096 points), the
  first seed of every method, ``random_state`` = 0.
* The papers' numbers (each on its own backbone and protocol) are used only to print the size of the
  effect each paper claims; SynBirds stands beside CUB-200 and Glyphs beside Cars196.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dmlstudy.config import load_yaml
from dmlstudy.data import evaluation_protocol
from dmlstudy.experiments import kit, papers
from dmlstudy.experiments.papers import PAPER_DATASET, numbers
from dmlstudy.experiments.protocol import ProtocolConfig, call_in_processes, results_frame, run_grid, train_grid
from dmlstudy.methods import MethodInfo, list_methods, method_info
from dmlstudy.methods.diml import TransportOptions, reranked_retrieval_metrics
from dmlstudy.paths import project_root, study_outputs
from dmlstudy.records import write_json
from dmlstudy.regimes import regime
from dmlstudy.study import summarize, write_table
from dmlstudy.train import RunResult, TrainConfig, run, selection_rule

RERANK = "diml_rerank"  # the pseudo-method: ``ms`` runs re-ranked by DIML at test time
EXTRA_ROWS = {  # rows of the comparison that are not registered methods (the others come from the method registry)
    RERANK: MethodInfo(
        RERANK,
        "MS + DIML re-ranking",
        "paper",
        "Zhao et al., ICCV 2021 (test-time use)",
        "the same ms models; each query's cosine top-K re-ranked by cos + s_struct (optimal transport between G × G local embeddings)",
    ),
    "softmax": kit.SHARED_ROWS["softmax"],
}
RETRIEVAL_TAIL = ("RP", "MAP@R", "NMI")  # columns after the four Recall@K
DECIMALS = 1  # percent, as displayed
FEWER_SEEDS_MARK = "†"


@dataclass
class CompareStudy(ProtocolConfig):
    """Parameters of ``notebooks/90_compare.ipynb``: the protocol plus which methods enter the table."""

    methods: list = field(
        default_factory=lambda: ["ms", "crt", RERANK]
    )  # main rows, every seed: registered methods (dmlstudy.methods.list_methods()), diml_rerank, softmax
    classic_methods: list = field(
        default_factory=lambda: ["triplet"]
    )  # classic baselines (registry group 'classic'), with classic_seeds
    classic_seeds: list = field(
        default_factory=lambda: [0]
    )  # seeds of the classic baselines (fewer than seeds: the table says so)
    rerank_top_k: int = 20  # K of DIML re-ranking: the cosine top-K re-ranked by cos + s_struct (the paper: 100)
    rerank_grid: int = 4  # G of DIML re-ranking: G × G local embeddings (DIML's default 4)
    projection_classes: int = 8  # test classes of the first dataset in the UMAP / t-SNE panels (all their images)
    umap: bool = True  # draw the UMAP panels (numba compiles UMAP on first use: ~15 s)
    tsne: bool = True  # draw the t-SNE panels
    ablation_datasets: list = field(
        default_factory=lambda: ["synbirds"]
    )  # datasets of the ablation claims (the paper notebooks' ablation_datasets)
    ablation_seeds: list = field(
        default_factory=lambda: [0]
    )  # seeds of the ablation claims (the paper notebooks' ablation_seeds; ≥ 2 for a verdict)
    margin: float = 1.0  # equivalence margin of the verdicts, R@1 points (declared in the plan before the runs)
    compared_regimes: list = field(
        default_factory=list
    )  # further regimes beside `regime` (dmlstudy/regimes.py): every row again, the claims judged in each

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in self.compared_regimes:
            regime(name, backbone=self.backbone)
        if self.regime in self.compared_regimes or len(set(self.compared_regimes)) < len(self.compared_regimes):
            raise ValueError(
                f"parameter 'compared_regimes': {self.compared_regimes} must list each regime once and not the "
                f"headline regime {self.regime!r}"
            )
        known = set(list_methods()) | set(EXTRA_ROWS)
        for name, values in (("methods", self.methods), ("classic_methods", self.classic_methods)):
            unknown = [m for m in values if m not in known]
            if unknown:
                raise ValueError(f"parameter {name!r}: unknown methods {unknown}; valid: {sorted(known)}")
        if RERANK in self.classic_methods:
            raise ValueError(
                f"parameter 'classic_methods': {RERANK!r} is a main method (it re-ranks the ms runs of every seed)"
            )
        overlap = sorted(set(self.methods) & set(self.classic_methods))
        if overlap:
            raise ValueError(f"parameters 'methods' and 'classic_methods' share {overlap}; list each method once")
        if self.classic_methods and not self.classic_seeds:
            raise ValueError(
                "parameter 'classic_seeds' must list at least one seed when 'classic_methods' is not empty"
            )
        if self.rerank_top_k < 1 or self.rerank_grid < 1:
            raise ValueError(
                f"parameters 'rerank_top_k' and 'rerank_grid' must be ≥ 1, got {self.rerank_top_k} and {self.rerank_grid}"
            )
        if self.projection_classes < 2:
            raise ValueError(f"parameter 'projection_classes' must be ≥ 2, got {self.projection_classes}")
        if not self.margin > 0:
            raise ValueError(f"parameter 'margin' must be > 0 (R@1 points), got {self.margin}")

    def regime_configs(self) -> list[CompareStudy]:
        """This config (the headline regime) and one per compared regime, in that order."""
        return [self, *(dataclasses.replace(self, regime=name, compared_regimes=[]) for name in self.compared_regimes)]

    def classic_protocol(self) -> CompareStudy:
        """This protocol with the classic baselines' seeds."""
        return dataclasses.replace(self, seeds=list(self.classic_seeds))

    def table_suffix(self) -> str:
        """``""`` for the scratch regime (the study's first tables keep their names), else ``_<regime>``."""
        return "" if self.regime == "scratch" else f"_{self.regime}"

    def results_folder(self) -> Path:
        """Where the notebook writes its tables (``<project>/results`` for the published study)."""
        return study_outputs(self.study, "results", runs_root_override=self.runs_root)

    def figures_folder(self) -> Path:
        """Where the study's figures are (``<project>/figures`` for the published study)."""
        return study_outputs(self.study, "figures", runs_root_override=self.runs_root)


# ----------------------------------------------------------------------------------------------
# Rows: the method registry plus the re-ranked and shared rows
# ----------------------------------------------------------------------------------------------
def row_info(name: str) -> MethodInfo:
    """What a row of the comparison is: :data:`EXTRA_ROWS`, else the registry's :func:`method_info`."""
    if name in EXTRA_ROWS:
        return EXTRA_ROWS[name]
    try:
        return method_info(name)
    except KeyError:
        return MethodInfo(name, name, "classic")


def method_label(name: str) -> str:
    """The row label of a method in every table and figure (the registry's ``label``)."""
    return row_info(name).label


def main_rows() -> list[str]:
    """Every main row the study can show: ``ms``, the registered paper methods, and :data:`EXTRA_ROWS`."""
    return ["ms", *list_methods(group="paper"), *EXTRA_ROWS]


def classic_rows() -> list[str]:
    """Every classic baseline the registry has (group ``classic``), ``ms`` aside (a main row)."""
    return [name for name in list_methods(group="classic") if name != "ms"]


def rows_markdown(config: CompareStudy) -> str:
    """The notebook's row table for the methods of ``config``: label (name), what it is, paper; from the registry."""
    lines = ["| row | what it is | paper |", "|---|---|---|"]
    for name in [*config.methods, *config.classic_methods]:
        info = row_info(name)
        lines.append(f"| {info.label} (`{name}`) | {info.summary} | {info.paper} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------
def trained_methods(methods: Sequence[str]) -> list[str]:
    """The registered methods to train for ``methods``: ``diml_rerank`` needs the ``ms`` runs."""
    names = [("ms" if name == RERANK else name) for name in methods]
    return list(dict.fromkeys(names))


def method_grid(methods: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{name: {"method": name}}``: every method with its defaults, named as the method notebooks name it;
    the names of :data:`kit.SHARED_VARIANTS` get the spec their notebook gives them (``softmax``: 40_dgcrl's
    DGCRL head without normalize-scale, margin or decorrelation)."""
    return {name: dict(kit.SHARED_VARIANTS.get(name, {"method": name})) for name in methods}


def main_grid(config: CompareStudy) -> list[tuple[str, TrainConfig]]:
    """The main methods on every dataset and seed."""
    return config.grid(method_grid(trained_methods(config.methods)))


def classic_grid(config: CompareStudy) -> list[tuple[str, TrainConfig]]:
    """The classic baselines on every dataset with ``classic_seeds``."""
    return config.classic_protocol().grid(method_grid(config.classic_methods)) if config.classic_methods else []


def run_main(config: CompareStudy) -> list[tuple[str, RunResult]]:
    """Train (or load) the main methods on every dataset and seed."""
    return run_grid(main_grid(config), workers=config.workers)


def run_classic(config: CompareStudy) -> list[tuple[str, RunResult]]:
    """Train (or load) the classic baselines on every dataset with ``classic_seeds``."""
    return run_grid(classic_grid(config), workers=config.workers)


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
    write_json(cache, {"settings": settings, "metrics": metrics})
    return metrics


def _missing_reranks(results: Sequence[tuple[str, RunResult]], *, top_k: int, grid: int) -> list[tuple]:
    """``(run config, top_k, grid)`` of every ``ms`` run of ``results`` without that re-ranking's cache."""
    options = TransportOptions()
    return [
        (result.config.to_dict(), top_k, grid)
        for name, result in results
        if name == "ms"
        and not _rerank_cache(
            result.run_dir, _rerank_settings(result.config, top_k=top_k, grid=grid, options=options)
        ).is_file()
    ]


def _rerank_in_processes(missing: list[tuple], *, workers: int) -> None:
    """The ``missing`` re-rankings as engine tasks, each writing its run's cache (read afterwards); with one
    worker or one re-ranking, nothing: the caller computes it in this process."""
    if workers > 1 and len(missing) > 1:
        call_in_processes(_rerank_metrics_in_process, missing, workers=workers)


def rerank_results(
    results: Sequence[tuple[str, RunResult]],
    config: CompareStudy,
    *,
    variant: str = RERANK,
    top_k: int | None = None,
    grid: int | None = None,
) -> list[dict[str, Any]]:
    """One ``variant`` row per ``ms`` run: the retrieval metrics re-ranked in the top ``top_k`` on ``grid`` ×
    ``grid`` cells (default: the config's ``rerank_top_k`` and ``rerank_grid``), and the ``ms`` run's NMI, ESD,
    ρ, training time and parameters (re-ranking does not change the embeddings). The default ``diml_rerank``
    rows only when the config's ``methods`` list it."""
    if variant == RERANK and RERANK not in config.methods:
        return []
    top_k, grid = reranking(config, top_k=top_k, grid=grid)
    _rerank_in_processes(_missing_reranks(results, top_k=top_k, grid=grid), workers=config.workers)
    rows = []
    for name, result in results:
        if name != "ms":
            continue
        reranked = rerank_metrics(result, top_k=top_k, grid=grid)
        row = {
            "variant": variant,
            "dataset": result.config.dataset,
            "method": RERANK,
            "seed": result.config.seed,
            "method_kwargs": json.dumps({"top_k": reranked["rerank_top_k"], "grid_size": grid}),
            **result.metrics,
        }
        row.update(reranked)
        rows.append(row)
    return rows


def reranking(config: CompareStudy, *, top_k: int | None = None, grid: int | None = None) -> tuple[int, int]:
    """``(top_k, grid)`` of a re-ranking: the given values, else the config's ``rerank_top_k`` and
    ``rerank_grid`` (the ``diml_rerank`` row's)."""
    return (config.rerank_top_k if top_k is None else top_k, config.rerank_grid if grid is None else grid)


def rerank_variants(config: CompareStudy) -> list[tuple[str, int, int]]:
    """``(variant, top_k, grid)`` of every re-ranking of the ``ms`` runs the comparison of ``config`` reads: the
    table's ``diml_rerank`` row, then the claims' extra ones (:func:`claim_reranks`); none unless
    ``diml_rerank`` is a row of the comparison."""
    if RERANK not in config.methods:
        return []
    extra = [(name, *reranking(config, **overrides)) for name, overrides in claim_reranks().items()]
    return [(RERANK, *reranking(config)), *extra]


def claim_rerank_results(results: Sequence[tuple[str, RunResult]], config: CompareStudy) -> list[dict[str, Any]]:
    """The extra re-rankings the claims compare (:func:`claim_reranks`: ``diml_rerank-G=1``, …) of every ``ms``
    run, each row named as in ``claims.yaml``; none unless ``diml_rerank`` is a row of the comparison."""
    return [
        row
        for name, top_k, grid in rerank_variants(config)[1:]
        for row in rerank_results(results, config, variant=name, top_k=top_k, grid=grid)
    ]


def comparison_frame(
    main: Sequence[tuple[str, RunResult]],
    classic: Sequence[tuple[str, RunResult]],
    rerank_rows: Sequence[Mapping[str, Any]],
    *,
    methods: Sequence[str],
) -> pd.DataFrame:
    """One row per run (and per re-ranked ``ms`` run) with a ``group`` column (main / classic), main methods in
    the order of ``methods`` (only those asked for), then the classic baselines."""
    parts = []
    if main:
        frame = results_frame(list(main))
        parts.append(frame[frame["variant"].isin(methods)].assign(group="main"))
    if rerank_rows:
        parts.append(pd.DataFrame(list(rerank_rows)).assign(group="main"))
    if classic:
        parts.append(results_frame(list(classic)).assign(group="classic"))
    if not parts:
        return pd.DataFrame(columns=["variant", "dataset", "method", "seed", "group"])
    frame = pd.concat(parts, ignore_index=True)
    order = {
        name: i for i, name in enumerate([*methods, *dict.fromkeys(frame.loc[frame["group"] == "classic", "variant"])])
    }
    frame["_order"] = frame["variant"].map(order)
    return frame.sort_values(["_order", "dataset", "seed"], kind="stable").drop(columns="_order").reset_index(drop=True)


# ----------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------
def table_metrics(frame: pd.DataFrame) -> list[str]:
    """The first four Recall@K columns present (by K), then RP, MAP@R and NMI where present."""
    ks = sorted(int(c[2:]) for c in frame.columns if c.startswith("R@") and c[2:].isdigit() and frame[c].notna().any())
    return [f"R@{k}" for k in ks[:4]] + [c for c in RETRIEVAL_TAIL if c in frame.columns and frame[c].notna().any()]


def _seed_text(seeds: Iterable[Any]) -> str:
    return ", ".join(str(int(s)) for s in sorted(set(seeds)))


def comparison_table(
    frame: pd.DataFrame, *, metrics: Sequence[str] | None = None, decimals: int = DECIMALS
) -> pd.DataFrame:
    """Mean ± std over seeds per (dataset, method), in percent, in the frame's row order.

    Columns: ``dataset``, ``method`` (the label; classic rows with fewer seeds than the main rows get
    :data:`FEWER_SEEDS_MARK`), ``variant``, ``group``, ``seeds``, ``runs``, one display column per metric,
    ``<metric>_mean`` / ``<metric>_std`` (numbers) and ``best <metric>`` (bool, see :func:`best_flags`).
    """
    metrics = list(metrics or table_metrics(frame))
    table = summarize(frame, by=["dataset", "variant", "group"], metrics=metrics, decimals=decimals)
    seeds = frame.groupby(["dataset", "variant", "group"], sort=False)["seed"].apply(_seed_text).tolist()
    table.insert(3, "seeds", seeds)
    main_runs = table.loc[table["group"] == "main"].groupby("dataset")["runs"].max()
    fewer = [
        (g == "classic" and r < main_runs.get(d, 0)) for d, g, r in zip(table["dataset"], table["group"], table["runs"])
    ]
    labels = [method_label(v) + (f" {FEWER_SEEDS_MARK}" if f else "") for v, f in zip(table["variant"], fewer)]
    table.insert(1, "method", labels)
    flags = best_flags(table, metrics, decimals=decimals)
    for metric in metrics:
        table[f"best {metric}"] = flags[metric]
    return table


def best_flags(
    table: pd.DataFrame, metrics: Sequence[str], *, by: str = "dataset", decimals: int = DECIMALS
) -> pd.DataFrame:
    """``True`` where a row has the highest ``<metric>_mean`` of its ``by`` group, compared as displayed
    (rounded to ``decimals``), so ties are all best; missing values are never best."""
    flags = pd.DataFrame(False, index=table.index, columns=list(metrics))
    for _, rows in table.groupby(by, sort=False):
        for metric in metrics:
            shown = rows[f"{metric}_mean"].astype(float).round(decimals)
            if shown.notna().any():
                flags.loc[rows.index, metric] = (shown == shown.max()).to_numpy()
    return flags


def bold_best(table: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """The table with each best cell (``best <metric>``) wrapped in Markdown bold."""
    shown = table.copy()
    for metric in metrics:
        shown[metric] = [f"**{text}**" if best else text for text, best in zip(shown[metric], shown[f"best {metric}"])]
    return shown


def table_note(config: CompareStudy) -> str:
    """The note printed beside the table when classic baselines ran with fewer seeds than the main methods
    ("" otherwise), and the note on the re-ranked row."""
    notes = []
    if config.classic_methods and len(set(config.classic_seeds)) < len(set(config.seeds)):
        notes.append(
            f"{FEWER_SEEDS_MARK} classic baselines ran with {len(set(config.classic_seeds))} seed(s) "
            f"({_seed_text(config.classic_seeds)}) only, the main methods with {len(set(config.seeds))} "
            f"({_seed_text(config.seeds)}): their mean ± std is over fewer runs."
        )
    if RERANK in config.methods:
        notes.append(
            f"MS + DIML re-ranking: the MS runs' cosine top-{config.rerank_top_k} re-ranked by cos + s_struct "
            f"({config.rerank_grid} × {config.rerank_grid} local embeddings); NMI is the MS embeddings' "
            "(re-ranking changes neighbour order, not the embeddings)."
        )
    return " ".join(notes)


def comparison_markdown(table: pd.DataFrame, config: CompareStudy, *, dataset: str) -> str:
    """The Markdown of one dataset's table: title, protocol line, the table (best per column in bold), notes."""
    rows = table[table["dataset"] == dataset]
    metrics = [m for m in table_metrics_of(table) if rows[f"{m}_mean"].notna().any()]
    shown = bold_best(rows, metrics)[["method", "seeds", *metrics]]
    note = table_note(config)
    lines = [
        f"### {dataset} ({config.regime} regime): retrieval (%), mean ± std over seeds, best per column in bold",
        "",
        f"Protocol: {config.protocol_text()}.",
        "",
        shown.to_markdown(index=False),
    ]
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def table_metrics_of(table: pd.DataFrame) -> list[str]:
    """The metric columns of a :func:`comparison_table` (those with a ``best`` flag), in order."""
    return [c[len("best ") :] for c in table.columns if c.startswith("best ")]


def write_comparison(table: pd.DataFrame, config: CompareStudy, *, folder: str | Path | None = None) -> list[Path]:
    """``compare_main_<dataset>[_<regime>].csv`` (all columns, numbers included) and ``.md`` (protocol line, bold
    best, notes) per dataset under ``folder`` (default :meth:`CompareStudy.results_folder`)."""
    folder = Path(folder) if folder else config.results_folder()
    paths = []
    for dataset in dict.fromkeys(table["dataset"]):
        csv_path, md_path = write_table(
            table[table["dataset"] == dataset], folder / f"compare_main_{dataset}{config.table_suffix()}"
        )
        md_path.write_text(comparison_markdown(table, config, dataset=dataset))
        paths += [csv_path, md_path]
    return paths


# ----------------------------------------------------------------------------------------------
# The papers' claims, headline and ablation, read from our numbers (claims.yaml; the rule: kit.judge)
# ----------------------------------------------------------------------------------------------
CLAIMS_SOURCE = Path(__file__).with_name("claims.yaml")
CLAIM_FIELDS = {
    "name",
    "kind",
    "a",
    "b",
    "runs",
    "source",
    "metric",
    "a_scale",
    "b_scale",
    "claimed",
    "margin",
    "paper_delta",
    "regimes",
}
NO_SELECTION = "last epoch (no validation classes: test classes evaluated during training)"
VERDICT_COLOURS = {  # the forest plot's colour per verdict
    "held": "#009e73",  # Okabe–Ito bluish green, vermillion, blue: distinct for colour-blind readers
    "reversed": "#d55e00",
    "equivalent": "#0072b2",
    "undecided": "#7f7f7f",
    "no verdict": "#c8c8c8",
}


@dataclass(frozen=True)
class Claim:
    """A claim "``a`` > ``b``" (or "≈", ``claimed``), judged on per-seed paired differences
    ``a_scale·a_s − b_scale·b_s`` of ``metric`` (:func:`kit.paired_differences`, :func:`kit.judge`)."""

    name: str
    kind: str  # headline / ablation
    a: str
    b: str
    runs: str  # protocol: the comparison's datasets and seeds; ablation: ablation_datasets and ablation_seeds
    source: str  # where the claim comes from
    metric: str = "R@1"
    a_scale: float = 1.0
    b_scale: float = 1.0
    claimed: str = ">"
    margin: float | None = None  # None: the study's margin
    paper_delta: Mapping[str, Any] | None = None  # see claims.yaml
    regimes: tuple[
        str, ...
    ] = ()  # ablation claims: the regimes they are judged in (default scratch); headline: every regime

    def judged_in(self, regime_name: str) -> bool:
        """Whether this claim is judged in ``regime_name``: a headline claim or one on the protocol runs in every
        regime, an ablation claim on ablation runs in its ``regimes`` (default scratch, where the paper notebooks
        train the ablations)."""
        return self.kind == "headline" or self.runs == "protocol" or regime_name in (self.regimes or ("scratch",))

    @property
    def unit(self) -> str:
        return f"{self.metric} points" if kit.metric_scale(self.metric) != 1.0 else self.metric.replace("_", " ")

    def paper_difference(self, dataset: str) -> float | None:
        """The paper's own ``a_scale·a − b_scale·b`` for the paper dataset ``dataset`` stands beside, or None."""
        if not self.paper_delta:
            return None
        spec = self.paper_delta
        key = spec.get("datasets", {}).get(PAPER_DATASET.get(dataset, ""))
        if key is None:
            return None
        values = papers.load()[spec["paper"]]["tables"][spec["table"]]["values"]

        def at(path: Sequence[Any]) -> Any:
            value = values
            for step in path:
                value = value[key if step == "$dataset" else step]
            return value

        first, second = at(spec["a"]), at(spec["b"])
        if first is None or second is None:
            return None
        return round(self.a_scale * first - self.b_scale * second, 2)


def load_claims(path: str | Path = CLAIMS_SOURCE) -> tuple[Claim, ...]:
    """The claims of ``path`` (``claims.yaml``), each checked: known fields, kind, runs and claimed values."""
    path = Path(path)
    entries = (load_yaml(path.read_text()) or {}).get("claims") or []
    claims = []
    for index, entry in enumerate(entries):
        where = f"{path}: claims[{index}] ({entry.get('name', '?')!r})"
        unknown = sorted(set(entry) - CLAIM_FIELDS)
        missing = sorted({"name", "kind", "a", "b", "runs", "source"} - set(entry))
        if unknown or missing:
            raise ValueError(
                f"{where}: unknown keys {unknown}, missing keys {missing}; valid keys {sorted(CLAIM_FIELDS)}"
            )
        for key, allowed in (
            ("kind", ("headline", "ablation")),
            ("runs", ("protocol", "ablation")),
            ("claimed", (">", "≈")),
        ):
            if key in entry and entry[key] not in allowed:
                raise ValueError(f"{where}: {key} must be one of {allowed}, got {entry[key]!r}")
        if "regimes" in entry:
            entry = {**entry, "regimes": tuple(entry["regimes"])}
            for name in entry["regimes"]:
                regime(name)
        claims.append(Claim(**entry))
    return tuple(claims)


def claim_variants(path: str | Path = CLAIMS_SOURCE) -> dict[str, dict[str, Any]]:
    """Run name → spec of the ablation runs the claims read (``variants`` of ``claims.yaml``)."""
    return dict((load_yaml(Path(path).read_text()) or {}).get("variants") or {})


def claim_reranks(path: str | Path = CLAIMS_SOURCE) -> dict[str, dict[str, int]]:
    """Row name → ``top_k`` / ``grid`` overrides of the extra DIML re-rankings of the ``ms`` runs (``reranks``)."""
    return dict((load_yaml(Path(path).read_text()) or {}).get("reranks") or {})


CLAIMS: tuple[Claim, ...] = load_claims()


def ablation_grid(claims: Sequence[Claim] = CLAIMS) -> dict[str, dict[str, Any]]:
    """``{name: spec}`` of every run the ablation claims compare (both sides; the names of
    :func:`claim_variants` with their specs, the others as :func:`method_grid` names them)."""
    specs = claim_variants()
    names = dict.fromkeys(name for claim in claims if claim.runs == "ablation" for name in (claim.a, claim.b))
    return {name: dict(specs[name]) if name in specs else method_grid([name])[name] for name in names}


def ablations_grid(config: CompareStudy, claims: Sequence[Claim] = CLAIMS) -> list[tuple[str, TrainConfig]]:
    """The runs of the ablation claims judged in ``config.regime`` on ``ablation_datasets`` with
    ``ablation_seeds``."""
    claims = [claim for claim in claims if claim.judged_in(config.regime)]
    if not config.ablation_seeds or not config.ablation_datasets or not claims:
        return []
    protocol = dataclasses.replace(config, seeds=list(config.ablation_seeds))
    return protocol.grid(ablation_grid(claims), datasets=config.ablation_datasets)


def run_ablations(config: CompareStudy, claims: Sequence[Claim] = CLAIMS) -> list[tuple[str, RunResult]]:
    """Train (or load: the paper notebooks trained them under the same names) the runs of the ablation claims
    judged in ``config.regime`` on ``ablation_datasets`` with ``ablation_seeds``."""
    return run_grid(ablations_grid(config, claims), workers=config.workers)


@dataclass
class RegimeComparison:
    """What the comparison computes in one regime: its config, runs, run rows, table and judged claims."""

    config: CompareStudy
    main: list
    classic: list
    frame: pd.DataFrame
    table: pd.DataFrame
    claims: pd.DataFrame


def compare_regime(config: CompareStudy) -> RegimeComparison:
    """Train (or load) every row of ``config`` in its regime, the DIML re-rankings, the ablation runs the claims
    judged in this regime need, and judge those claims (:func:`claims_table`).

    It waits twice: all of the regime's runs (main rows, classic baselines, ablations) go to the engine as one
    grid, then all of its missing re-rankings (the table's and the claims') as one batch; the rest reads them
    from disk. Waiting once per phase, five times, left a GPU's workers idle behind each phase's last task.
    Regime after regime, not both at once: a run's engine priority is set by whoever asks for it first, and the
    scratch regime's main runs are the paper notebooks' own. Sent at the start with the comparison's hundreds
    of pretrained runs, they took that grid's low priority, and the paper notebooks waited behind it."""
    train_grid(main_grid(config) + classic_grid(config) + ablations_grid(config), workers=config.workers)
    main = run_main(config)
    settings = dict.fromkeys((top_k, grid) for _, top_k, grid in rerank_variants(config))  # distinct, in order
    missing = [job for top_k, grid in settings for job in _missing_reranks(main, top_k=top_k, grid=grid)]
    _rerank_in_processes(missing, workers=config.workers)
    classic = run_classic(config)
    frame = comparison_frame(main, classic, rerank_results(main, config), methods=config.methods)
    extra_runs, extra_rows = run_ablations(config), claim_rerank_results(main, config)
    claims = claims_table(
        claims_frame(frame, extra_runs, extra_rows),
        margin=config.margin,
        ablation_datasets=config.ablation_datasets,
        regime=config.regime,
    )
    return RegimeComparison(config, main, classic, frame, comparison_table(frame), claims)


def all_claims(comparisons: Sequence[RegimeComparison]) -> pd.DataFrame:
    """Every regime's claims in one table: claim by claim in ``claims.yaml`` order, the regimes side by side."""
    table = pd.concat([c.claims for c in comparisons], ignore_index=True)
    order = {
        column: {value: i for i, value in enumerate(dict.fromkeys(table[column]))}
        for column in ("claim", "dataset", "regime")
    }
    return table.sort_values(list(order), key=lambda column: column.map(order[column.name]), kind="stable").reset_index(
        drop=True
    )


REGIME_COLUMNS = ["method", "variant", "dataset", "A", "B", "Δ", "CI low", "CI high", "seeds", "verdict", "outcome"]


def regime_differences(comparisons: Sequence[RegimeComparison], *, margin: float = kit.MARGIN) -> pd.DataFrame:
    """What the headline regime changes, row by row: for every row and dataset of both the headline regime
    (A, first of ``comparisons``) and each compared regime (B), the per-seed paired Δ R@1 = A_s − B_s, its
    t-interval and the study's verdict (:func:`kit.judge`). Seed s gives both regimes the same batch sequence;
    the backbones differ by design (pretrained weights vs random initialisation). ``pretrained > scratch`` for
    ``ms`` is the transfer check: is the pretraining worth anything on this dataset?"""
    first, rows = comparisons[0], []
    for other in comparisons[1:]:
        tag = {first.config.regime: "A", other.config.regime: "B"}
        frame = pd.concat(
            [c.frame.assign(variant=c.frame["variant"] + "@" + tag[c.config.regime]) for c in (first, other)],
            ignore_index=True,
        )
        for variant in dict.fromkeys(first.frame["variant"]):
            for dataset in dict.fromkeys(first.frame["dataset"]):
                try:
                    paired = kit.paired_differences(frame, dataset, f"{variant}@A", f"{variant}@B")
                except KeyError:
                    continue
                verdict = kit.judge(paired.differences, margin=margin)
                rows.append(
                    {
                        "method": method_label(variant),
                        "variant": variant,
                        "dataset": dataset,
                        "A": first.config.regime,
                        "B": other.config.regime,
                        **verdict.columns(),
                    }
                )
    return pd.DataFrame(rows, columns=REGIME_COLUMNS)


def write_regime_differences(table: pd.DataFrame, config: CompareStudy) -> list[Path]:
    """``results/regimes.csv`` and ``.md`` (Δ R@1 points, headline regime − compared regime, per row and dataset)."""
    csv_path, md_path = write_table(table, config.results_folder() / "regimes")
    shown = table.drop(columns=["variant", "outcome"])
    md_path.write_text(
        "# What the regime changes: Δ R@1 = A − B per row and dataset\n\n"
        f"A = {config.regime} regime, B = {', '.join(config.compared_regimes)}; per-seed paired differences (same "
        f"batch sequence, the backbone's start differs), {round(100 * kit.CONFIDENCE)} % t-interval, verdict by the "
        f"study's rule (margin ±{config.margin:g}).\n\n" + shown.to_markdown(index=False) + "\n"
    )
    return [csv_path, md_path]


def claims_frame(
    frame: pd.DataFrame, *parts: Sequence[tuple[str, RunResult]] | Sequence[Mapping[str, Any]]
) -> pd.DataFrame:
    """The comparison's run rows plus further runs (``(name, result)`` pairs) or rows (mappings): one row per
    (variant, dataset, seed), the first kept where a run appears twice."""
    frames = [frame]
    for part in parts:
        if part and isinstance(part[0], tuple):
            frames.append(results_frame(list(part)))
        elif part:
            frames.append(pd.DataFrame(list(part)))
    return pd.concat(frames, ignore_index=True).drop_duplicates(["variant", "dataset", "seed"]).reset_index(drop=True)


def _selection(frame: pd.DataFrame, dataset: str, names: Sequence[str]) -> str:
    """How the runs' reported checkpoint was chosen: the rules of their ``selection`` records, each once."""
    rows = frame[(frame["dataset"] == dataset) & frame["variant"].isin(names)]
    if "selection" not in rows or rows["selection"].isna().all():
        return NO_SELECTION
    return "; ".join(dict.fromkeys(map(selection_rule, rows["selection"].dropna().astype(str))))


CLAIM_COLUMNS = [
    "claim",
    "kind",
    "claimed",
    "dataset",
    "regime",
    "Δ",
    "CI low",
    "CI high",
    "unit",
    "seeds",
    "margin",
    "verdict",
    "seeds to decide",
    "paper Δ",
    "paper",
    "checkpoint",
]


def claims_table(
    frame: pd.DataFrame,
    *,
    claims: Sequence[Claim] = CLAIMS,
    margin: float = kit.MARGIN,
    ablation_datasets: Sequence[str] | None = None,
    regime: str = "scratch",
) -> pd.DataFrame:
    """One row per claim × dataset judged in ``regime`` (:meth:`Claim.judged_in`; the ``regime`` column;
    claims on ``ablation`` runs: ``ablation_datasets`` only, all datasets when None): Δ, its t-interval, the
    paired seeds, the margin, the verdict (:func:`kit.judge`), the seeds that would decide an undecided claim,
    the paper's Δ and how the checkpoints were chosen.

    ``frame``: one row per run (:func:`claims_frame`). Only the seeds both sides ran pair; a claim whose side
    has no run (or no value of the claim's metric) is "not evaluated" and says why."""
    datasets = list(dict.fromkeys(frame["dataset"]))
    rows = []
    for claim in claims:
        if not claim.judged_in(regime):
            continue
        here = (
            datasets
            if claim.runs == "protocol" or ablation_datasets is None
            else [d for d in datasets if d in ablation_datasets]
        )
        claim_margin = margin if claim.margin is None else claim.margin
        for dataset in here:
            paper_delta = claim.paper_difference(dataset)
            row = {
                "claim": claim.name,
                "kind": claim.kind,
                "claimed": f"A {claim.claimed} B",
                "dataset": dataset,
                "regime": regime,
                "unit": claim.unit,
                "margin": claim_margin,
                "paper Δ": "–" if paper_delta is None else paper_delta,
                "paper": claim.source,
                "checkpoint": _selection(frame, dataset, [claim.a, claim.b]),
            }
            try:
                paired = kit.paired_differences(
                    frame,
                    dataset,
                    claim.a,
                    claim.b,
                    claim.metric,
                    first_scale=claim.a_scale,
                    second_scale=claim.b_scale,
                )
            except KeyError:
                missing = [
                    v
                    for v in (claim.a, claim.b)
                    if frame[(frame["dataset"] == dataset) & (frame["variant"] == v)].empty
                ]
                reason = f"no {' / '.join(missing)} runs" if missing else f"no {claim.metric} in the runs' records"
                rows.append(
                    {
                        **row,
                        "Δ": math.nan,
                        "CI low": math.nan,
                        "CI high": math.nan,
                        "seeds": 0,
                        "verdict": f"not evaluated ({reason})",
                        "seeds to decide": "–",
                    }
                )
                continue
            verdict = kit.judge(paired.differences, margin=claim_margin)
            if claim.metric in kit.CENSORED_METRICS:
                verdict = kit.censor(verdict, **paired.censoring)
            rows.append(
                {
                    **row,
                    **verdict.columns(),
                    "verdict": verdict_text(claim, verdict),
                    "seeds to decide": verdict.seeds_to_decide if verdict.seeds_to_decide else "–",
                }
            )
    table = pd.DataFrame(rows, columns=[*CLAIM_COLUMNS, "outcome"])
    table["outcome"] = table["outcome"].fillna("not evaluated")
    return table


def verdict_text(claim: Claim, verdict: kit.Verdict) -> str:
    """The verdict as the claim reads it: for a claim of no difference ("A ≈ B") an interval outside the margin
    says the equivalence did *not* hold, whichever side it lies on."""
    if claim.claimed != "≈":
        return verdict.text
    return {
        "held": "not equivalent (A > B)",
        "reversed": "not equivalent (A < B)",
        "equivalent": "equivalent (the claim holds)",
    }.get(verdict.outcome, verdict.text)


def claims_markdown(claims: pd.DataFrame, config: CompareStudy) -> str:
    """``results/claims.md``: the rule, the protocol, then every claim × dataset."""
    shown = claims[CLAIM_COLUMNS].copy()
    shown["claim"] = [f"{name} ({kind})" for name, kind in zip(shown["claim"], shown["kind"])]
    protocols = [f"Protocol ({c.regime} regime): {c.protocol_text()}." for c in config.regime_configs()]
    lines = [
        "# Every claim, headline and ablation",
        "",
        *protocols,
        "",
        f"Regimes: {', '.join(c.regime for c in config.regime_configs())}; headline claims on {', '.join(config.datasets)} (seeds {_seed_text(config.seeds)}, "
        f"classic baselines {_seed_text(config.classic_seeds) if config.classic_methods else '–'}), ablation claims on "
        f"{', '.join(config.ablation_datasets) or '–'} (seeds {_seed_text(config.ablation_seeds) or '–'}).",
        "",
        f"Rule (declared before the runs, `dmlstudy.experiments.kit.judge`): Δ = mean of the per-seed paired differences "
        f"A_s − B_s (same seed: same backbone initialisation and batch sequence; only seeds both sides ran pair), "
        f"{round(100 * kit.CONFIDENCE)} % t-interval Δ ± t·sd/√n. **held**: interval above 0; **reversed**: below 0; "
        f"**equivalent**: inside ±margin ({config.margin:g} R@1 points unless the row says otherwise); **undecided**: otherwise, "
        "with the seeds the observed spread says would decide it; fewer than 2 paired seeds: no verdict. "
        'A claim "A ≈ B" is supported by *equivalent*. Claims on epochs-to-best (best epoch, seconds to best): a run '
        "that reached its epoch cap without `patience` evaluations after its best is censored (its true value is at "
        "least the recorded one), and a verdict that censoring could overturn is **undecided (censored)** — a rule "
        "added on 2026-11-24, after the first two-regime study (`kit.censor`). "
        "Paper Δ: the paper's own difference (its backbone and data), for scale.",
        "",
        shown.drop(columns="kind").to_markdown(index=False),
        "",
    ]
    return "\n".join(lines)


def write_claims(claims: pd.DataFrame, config: CompareStudy, *, folder: str | Path | None = None) -> list[Path]:
    """``claims.csv`` (every column) and ``claims.md`` (:func:`claims_markdown`) under ``folder`` (default
    :meth:`CompareStudy.results_folder`)."""
    folder = Path(folder) if folder else config.results_folder()
    csv_path, md_path = write_table(claims[[*CLAIM_COLUMNS, "outcome"]], folder / "claims")
    md_path.write_text(claims_markdown(claims, config))
    return [csv_path, md_path]


def claim_sentences(claims: pd.DataFrame) -> list[str]:
    """One sentence per evaluated claim and dataset, then one summary sentence, all from the numbers."""
    evaluated = claims[claims["outcome"] != "not evaluated"]
    if evaluated.empty:
        return ["No claim could be evaluated: the methods it compares did not run."]
    sentences = [_claim_sentence(dict(row)) for _, row in evaluated.iterrows()]
    counts = evaluated["outcome"].value_counts()
    decided = int(sum(counts.get(v, 0) for v in ("held", "reversed", "equivalent")))
    skipped = sorted(set(claims.loc[claims["outcome"] == "not evaluated", "claim"]))
    regimes = list(dict.fromkeys(evaluated["regime"])) if "regime" in evaluated else []
    summary = (
        f"Of {len(evaluated)} claim × dataset{' × regime' if len(regimes) > 1 else ''} comparisons, {decided} were decided: "
        + ", ".join(f"{int(counts.get(v, 0))} {v}" for v in ("held", "reversed", "equivalent"))
        + f"; {int(counts.get('undecided', 0))} undecided and {int(counts.get('no verdict', 0))} without a verdict (fewer than 2 paired seeds)."
        + (f" Not evaluated (runs missing): {', '.join(skipped)}." if skipped else "")
    )
    for regime_name in regimes or [None]:
        headline = evaluated[evaluated["kind"] == "headline"]
        if regime_name is not None:
            headline = headline[headline["regime"] == regime_name]
        if len(headline):
            where = f" ({regime_name} regime)" if len(regimes) > 1 else ""
            summary += f" Headline{where}: {int(headline['outcome'].isin(['held', 'reversed', 'equivalent']).sum())} of {len(headline)} decided."
    return [*sentences, summary]


def _claim_sentence(row: Mapping[str, Any]) -> str:
    interval = (
        f", {round(100 * kit.CONFIDENCE)} % CI [{row['CI low']:+.2f}, {row['CI high']:+.2f}]"
        if row["seeds"] >= 2
        else ""
    )
    paper = row["paper Δ"]
    paper_text = (
        f"the paper reports {paper:+.2f} ({row['paper']})"
        if paper != "–"
        else f"the paper gives no number ({row['paper']})"
    )
    regime_text = f" ({row['regime']})" if row.get("regime", "scratch") != "scratch" else ""
    return (
        f"{row['dataset']}{regime_text}: {row['claim']}: ours {row['Δ']:+.2f} {row['unit']}{interval} over {row['seeds']} paired seed(s); "
        f"{paper_text} → {row['verdict']}."
    )


def forest_figure(claims: pd.DataFrame) -> plt.Figure:
    """Δ with its t-interval per claim × dataset (top to bottom in table order, headline claims above the
    dashed line, ablation claims below), each row's ±margin band shaded, the verdict as the marker's colour
    (hollow: no verdict); claims not evaluated are left out. With several regimes (the ``regime`` column), each
    claim × dataset is one row with one marker per regime, side by side (shape: regime)."""
    rows = claims[claims["outcome"] != "not evaluated"].reset_index(drop=True)
    if "regime" not in rows:
        rows = rows.assign(regime="scratch")
    regimes = list(dict.fromkeys(rows["regime"]))
    keys = list(dict.fromkeys(zip(rows["claim"], rows["dataset"])))
    figure, axis = plt.subplots(figsize=(9.5, 0.34 * max(len(keys), 1) * (1 + 0.35 * (len(regimes) - 1)) + 1.8))
    position = {key: len(keys) - 1 - i for i, key in enumerate(keys)}
    offsets = {r: (0.0 if len(regimes) == 1 else 0.22 - 0.44 * i / (len(regimes) - 1)) for i, r in enumerate(regimes)}
    markers = dict(zip(regimes, ["o", "s", "^", "D"]))
    for _, row in rows.iterrows():
        y = position[(row["claim"], row["dataset"])]
        if row["regime"] == regimes[0]:
            axis.add_patch(plt.Rectangle((-row["margin"], y - 0.45), 2 * row["margin"], 0.9, color="0.92", linewidth=0))
        y += offsets[row["regime"]]
        colour = VERDICT_COLOURS.get(row["outcome"], "k")
        if row["seeds"] >= 2:
            axis.plot([row["CI low"], row["CI high"]], [y, y], color=colour, linewidth=2)
        axis.plot(
            row["Δ"], y, markers[row["regime"]], color=colour, markerfacecolor=colour if row["seeds"] >= 2 else "white"
        )
    axis.axvline(0, color="0.3", linewidth=0.8)
    kinds = dict(zip(zip(rows["claim"], rows["dataset"]), rows["kind"]))
    headline = sum(kinds[key] == "headline" for key in keys)
    if 0 < headline < len(keys):  # headline claims above, ablation claims below
        axis.axhline(len(keys) - headline - 0.5, color="0.5", linestyle="--", linewidth=0.8)
    units = dict(zip(zip(rows["claim"], rows["dataset"]), rows["unit"]))
    labels = [
        f"{claim} — {dataset}" + ("" if units[(claim, dataset)] == "R@1 points" else f" [{units[(claim, dataset)]}]")
        for claim, dataset in keys
    ]
    axis.set_yticks(range(len(keys)), labels[::-1], fontsize=7)
    axis.set_ylim(-0.6, len(keys) - 0.4)
    axis.set_xlabel(
        f"Δ = mean paired difference A − B (R@1 points unless marked), {round(100 * kit.CONFIDENCE)} % t-interval"
    )
    handles = [plt.Line2D([], [], marker="o", color=c, linestyle="none", label=v) for v, c in VERDICT_COLOURS.items()]
    if len(regimes) > 1:
        handles += [
            plt.Line2D([], [], marker=markers[r], color="0.3", linestyle="none", label=f"{r} regime") for r in regimes
        ]
    handles.append(plt.Rectangle((0, 0), 1, 1, color="0.92", label="±margin (equivalence)"))
    axis.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    axis.grid(axis="x", alpha=0.3)
    axis.set_title(
        "Every claim: paired Δ per seed, its interval and the verdict"
        + (f" ({' vs '.join(regimes)})" if len(regimes) > 1 else "")
    )
    figure.tight_layout()
    return figure


def caveats(config: CompareStudy, frame: pd.DataFrame) -> list[str]:
    """What limits the reading, with this study's actual settings."""
    parameters = frame.groupby("variant")["parameters"].first() if "parameters" in frame else pd.Series(dtype=float)
    base = f" ({parameters['ms'] / 1e6:.2f} M parameters with the MS head)" if "ms" in parameters else ""
    classic = f"; classic baselines {len(set(config.classic_seeds))} seed(s)" if config.classic_methods else ""
    return [
        f"Synthetic data: {', '.join(config.datasets)} stand in for CUB-200 / Cars196; the papers' effects were measured on real photographs.",
        f"Small backbone trained from scratch: {config.backbone}{base}, random initialisation — no ImageNet pre-training, which every paper uses "
        "and which several of the methods (prototypes, attention, local matching) build on.",
        f"Short training at low resolution: {config.epochs} epochs × {config.steps_per_epoch or 'full'} steps, {config.image_size} px, "
        f"d = {config.embedding_dim}, batch {config.classes_per_batch}×{config.samples_per_class}; the papers train for up to 100+ epochs at 224–227 px.",
        f"Seeds: {len(set(config.seeds))} for the main methods{classic}; a claim is decided only when the {round(100 * kit.CONFIDENCE)} % "
        f"t-interval of its per-seed paired differences excludes 0 or fits inside ±{config.margin:g} points.",
        "One protocol for every method (same backbone, size, batch, epochs, seeds): the papers each used their own, so their gains are not "
        "comparable with each other or with ours; the paper columns show only the direction and size each paper claims.",
        "Training seconds come from each run's records; on a shared machine they vary with the load at the time the run trained.",
    ]


# ----------------------------------------------------------------------------------------------
# Generalisation: ESD and spectral decay
# ----------------------------------------------------------------------------------------------
def geometry_table(frame: pd.DataFrame, *, metric: str, decimals: int = 3) -> pd.DataFrame:
    """Rows = methods, columns = datasets: :func:`kit.geometry_summary` of ``metric`` (``ESD`` or ``rho``) with the
    CRT paper's MS / +CRT numbers beside. The re-ranked row is left out (same embeddings as ``ms``)."""
    paper = numbers("crt", "ESD" if metric == "ESD" else "RHO")
    return kit.geometry_summary(
        own_embedding_rows(frame), metric=metric, paper=paper, label=method_label, decimals=decimals
    )


def own_embedding_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows with embeddings of their own: every row but the re-ranked one (its embeddings are the ``ms`` runs')."""
    return frame[frame["variant"] != RERANK]


def spectrum_figure(embeddings: Mapping[str, tuple[np.ndarray, np.ndarray]], *, dataset: str) -> plt.Figure:
    """Normalised singular-value spectra (drop_first = 0) of every method's test embeddings on one dataset."""
    from dmlstudy import plots

    named = {method_label(v): e for v, (e, _) in embeddings.items()}
    return plots.spectrum(
        named,
        drop_first=0,
        title=f"{dataset}: test-embedding spectra (drop_first = 0, first seed)",
        methods={method_label(v): v for v in embeddings},
    )


# ----------------------------------------------------------------------------------------------
# Projections and cost
# ----------------------------------------------------------------------------------------------
def cost_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per dataset and method: parameters (M), training seconds and seconds per epoch (mean ± std over seeds),
    and, for the re-ranked row, the re-ranking seconds."""
    metrics = [m for m in ("train_seconds", "seconds_per_epoch", "rerank_seconds") if m in frame.columns]
    table = summarize(frame, by=["dataset", "variant"], metrics=metrics, percent=False, decimals=1)
    parameters = frame.groupby(["dataset", "variant"], sort=False)["parameters"].first() / 1e6
    table.insert(
        2,
        "parameters (M)",
        [round(float(parameters.loc[(d, v)]), 3) for d, v in zip(table["dataset"], table["variant"])],
    )
    table.insert(1, "method", [method_label(v) for v in table["variant"]])
    if "rerank_seconds" in table:
        table["rerank_seconds"] = [
            text if v == RERANK else "–" for text, v in zip(table["rerank_seconds"], table["variant"])
        ]
    return table[[c for c in table.columns if not c.endswith(("_mean", "_std"))]]


def time_figure(frame: pd.DataFrame) -> plt.Figure:
    """R@1 (%) against training seconds per method, one panel per dataset, mean ± std over seeds. The re-ranked
    row sits at the MS runs' training time (its cost is at test time). Each method keeps its colour and marker of
    every figure (:func:`dmlstudy.plots.method_style`); labels are moved apart where points crowd (adjustText)."""
    from adjustText import adjust_text

    from dmlstudy import plots

    datasets = list(dict.fromkeys(frame["dataset"]))
    figure, axes = plt.subplots(1, len(datasets), figsize=(5.2 * len(datasets), 3.8), squeeze=False)
    for axis, dataset in zip(axes[0], datasets):
        rows = frame[frame["dataset"] == dataset]
        labels = []
        for variant, group in rows.groupby("variant", sort=False):
            x, y = group["train_seconds"], 100 * group["R@1"]
            style = plots.method_style(variant)
            axis.errorbar(
                x.mean(),
                y.mean(),
                xerr=x.std() if len(group) > 1 else None,
                yerr=y.std() if len(group) > 1 else None,
                marker=style.marker,
                color=style.colour,
                capsize=3,
                linestyle="none",
                label=method_label(variant),
            )
            labels.append(axis.text(x.mean(), y.mean(), method_label(variant), fontsize=8))
        axis.set(xlabel="training seconds (whole run)", ylabel="R@1 (%)", title=dataset)
        axis.grid(alpha=0.3)
        adjust_text(labels, ax=axis, arrowprops=dict(arrowstyle="-", color="0.5", linewidth=0.5))
    figure.suptitle("R@1 against training time (circles: the papers' methods; squares, triangles: classic baselines)")
    figure.tight_layout()
    plots.legend_outside(figure)
    return figure


# ----------------------------------------------------------------------------------------------
# figures/README.md
# ----------------------------------------------------------------------------------------------
FIGURE_PREFIXES = {  # file-name prefix → the notebook that writes figures with it (in notebook order)
    "datasets_": "00_datasets.ipynb",
    "train_": "01_train.ipynb",
    "crt_": "10_crt.ipynb",
    "diml_": "20_diml.ipynb",
    "cross_attention_": "30_cross_attention.ipynb",
    "dgcrl_": "40_dgcrl.ipynb",
    "compare_": "90_compare.ipynb",
    "claims_": "90_compare.ipynb",
    "explore_": "95_explore.ipynb",
}


FIGURE_COMMANDS = {  # figures that no notebook draws → the command that writes them
    "tuning_best_so_far.png": "`make tune` (`dmlstudy tune plans/tune.yaml`)",
    "tuning_best_so_far_pretrained.png": "`make tune` (`dmlstudy tune plans/tune_pretrained.yaml`)",
}


def figure_notebook(name: str) -> str | None:
    """The notebook that made figure ``name`` (by its longest matching prefix), or None."""
    matches = [prefix for prefix in FIGURE_PREFIXES if name.startswith(prefix)]
    return FIGURE_PREFIXES[max(matches, key=len)] if matches else None


def plan_entries(study: str) -> dict[str, str]:
    """Notebook file name → the entry of ``plans/<study>.yaml`` that runs it (empty when no such plan)."""
    plan = project_root() / "plans" / f"{study}.yaml"
    if not plan.is_file():
        return {}
    entries = (load_yaml(plan.read_text()) or {}).get("entries") or []
    return {Path(entry["notebook"]).name: entry["name"] for entry in entries if "notebook" in entry and "name" in entry}


def figures_readme(folder: str | Path, *, study: str = "") -> str:
    """The text of ``figures/README.md``: every PNG of ``folder``, grouped by the notebook that made it (in
    notebook order; unknown prefixes last), each with a line naming the notebook and the image embedded.
    With ``study``, each notebook's section also names its entry of ``plans/<study>.yaml`` and the executed
    notebook ``runs/<study>/<entry>/<notebook>``, whose cells list the runs each figure was drawn from."""
    folder = Path(folder)
    entries = plan_entries(study) if study else {}
    names = sorted(path.name for path in folder.glob("*.png"))
    order = list(dict.fromkeys(FIGURE_PREFIXES.values()))
    by_notebook: dict[str | None, list[str]] = {}
    for name in names:
        by_notebook.setdefault(figure_notebook(name), []).append(name)
    lines = [
        "# Figures",
        "",
        "Written by the study's notebooks (`make study` regenerates them from the run records; do not edit by hand).",
        "Each figure names the notebook that made it, from its file-name prefix.",
        "",
    ]
    for notebook in [*order, None]:
        if notebook not in by_notebook:
            continue
        lines += [f"## {notebook or 'not made by a notebook'}", ""]
        if notebook in entries:
            lines += [
                f"Plan entry `{entries[notebook]}` of `plans/{study}.yaml`; executed notebook "
                f"`runs/{study}/{entries[notebook]}/{notebook}`; runs under `runs/{study}/`.",
                "",
            ]
        for name in by_notebook[notebook]:
            made_by = (
                f"made by `notebooks/{notebook}`"
                if notebook
                else f"made by {FIGURE_COMMANDS.get(name, 'an unknown command (no known file-name prefix)')}"
            )
            lines += [f"**{name}** — {made_by}", "", f"![]({name})", ""]
    if not names:
        lines += ["(no figures yet)", ""]
    return "\n".join(lines)


def write_figures_readme(folder: str | Path, *, study: str = "") -> Path:
    """Write ``<folder>/README.md`` listing every PNG with its notebook (and plan entry, given ``study``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "README.md"
    path.write_text(figures_readme(folder, study=study))
    return path
