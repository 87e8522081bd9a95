"""The comparison's tables, one row per method: retrieval (mean ± std over seeds, best per column in bold), the
embedding geometry (ESD, ρ) beside the CRT paper's numbers and the cost (parameters, seconds), with the figures
that go with the last two (singular-value spectra, R@1 against training time)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dmlstudy import plots
from dmlstudy.experiments import ablations, kit
from dmlstudy.findings.numbers import numbers, reporting
from dmlstudy.metrics import class_subset_recall
from dmlstudy.rows import is_reranked, method_label
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.run.train import RunResult
from dmlstudy.study.grids import results_frame
from dmlstudy.study.report import seed_text, summarize, write_table

RETRIEVAL_TAIL = ("RP", "MAP@R", "NMI")  # columns after the four Recall@K
DECIMALS = 1  # percent, as displayed
FEWER_SEEDS_MARK = "†"


# ----------------------------------------------------------------------------------------------
# Retrieval
# ----------------------------------------------------------------------------------------------
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


def table_metrics(frame: pd.DataFrame) -> list[str]:
    """The first four Recall@K columns present (by K), then RP, MAP@R and NMI where present."""
    ks = sorted(int(c[2:]) for c in frame.columns if c.startswith("R@") and c[2:].isdigit() and frame[c].notna().any())
    return [f"R@{k}" for k in ks[:4]] + [c for c in RETRIEVAL_TAIL if c in frame.columns and frame[c].notna().any()]


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
    seeds = frame.groupby(["dataset", "variant", "group"], sort=False)["seed"].apply(seed_text).tolist()
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


def table_note(
    *, seeds: Sequence[int], classic_seeds: Sequence[int] = (), rerank: tuple[int, int] | None = None
) -> str:
    """The note printed beside the table: when the classic baselines ran with fewer ``classic_seeds`` than the
    main methods' ``seeds`` (empty: no classic baselines in the table), and on the re-ranked row when the table
    has one (``rerank``: its ``(top_k, grid)``); "" when neither."""
    notes = []
    if classic_seeds and len(set(classic_seeds)) < len(set(seeds)):
        notes.append(
            f"{FEWER_SEEDS_MARK} classic baselines ran with {len(set(classic_seeds))} seed(s) "
            f"({seed_text(classic_seeds)}) only, the main methods with {len(set(seeds))} "
            f"({seed_text(seeds)}): their mean ± std is over fewer runs."
        )
    if rerank is not None:
        top_k, grid = rerank
        notes.append(
            f"MS + DIML re-ranking: the MS runs' cosine top-{top_k} re-ranked by cos + s_struct "
            f"({grid} × {grid} local embeddings); NMI is the MS embeddings' "
            "(re-ranking changes neighbour order, not the embeddings)."
        )
    return " ".join(notes)


def comparison_markdown(table: pd.DataFrame, protocol: ProtocolConfig, *, dataset: str, note: str = "") -> str:
    """The Markdown of one dataset's table: title, the line of the ``protocol`` it ran under, the table (best per
    column in bold), then ``note`` (:func:`table_note`)."""
    rows = table[table["dataset"] == dataset]
    metrics = [m for m in table_metrics_of(table) if rows[f"{m}_mean"].notna().any()]
    shown = bold_best(rows, metrics)[["method", "seeds", *metrics]]
    lines = [
        f"### {dataset} ({protocol.regime} regime): retrieval (%), mean ± std over seeds, best per column in bold",
        "",
        f"Protocol: {protocol.protocol_text()}.",
        "",
        shown.to_markdown(index=False),
    ]
    if note:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def table_metrics_of(table: pd.DataFrame) -> list[str]:
    """The metric columns of a :func:`comparison_table` (those with a ``best`` flag), in order."""
    return [c[len("best ") :] for c in table.columns if c.startswith("best ")]


def table_suffix(regime: str) -> str:
    """The end of a regime's table names: ``""`` for the scratch regime (the study's first tables keep their
    names), else ``_<regime>``."""
    return "" if regime == "scratch" else f"_{regime}"


def write_comparison(
    table: pd.DataFrame, protocol: ProtocolConfig, folder: str | Path, *, note: str = ""
) -> list[Path]:
    """``compare_main_<dataset><suffix>.csv`` (all columns, numbers included) and ``.md``
    (:func:`comparison_markdown`: protocol line, bold best, ``note``) per dataset under ``folder``; the suffix
    names the protocol's regime (:func:`table_suffix`)."""
    paths = []
    for dataset in dict.fromkeys(table["dataset"]):
        csv_path, md_path = write_table(
            table[table["dataset"] == dataset],
            Path(folder) / f"compare_main_{dataset}{table_suffix(protocol.regime)}",
        )
        md_path.write_text(comparison_markdown(table, protocol, dataset=dataset, note=note))
        paths += [csv_path, md_path]
    return paths


# ----------------------------------------------------------------------------------------------
# Generalisation: ESD and spectral decay
# ----------------------------------------------------------------------------------------------
def geometry_table(frame: pd.DataFrame, *, metric: str, decimals: int = 3) -> pd.DataFrame:
    """Rows = methods, columns = datasets: :func:`kit.geometry_summary` of ``metric`` (``ESD`` or ``rho``) with the
    numbers of the paper that measures them (:func:`~dmlstudy.findings.numbers.reporting`: the CRT paper's MS / +CRT)
    beside. The re-ranked rows are left out (the same embeddings as the runs they re-rank)."""
    table = "ESD" if metric == "ESD" else "RHO"
    paper = numbers(reporting(table), table)
    return kit.geometry_summary(
        own_embedding_rows(frame),
        metric=metric,
        paper=paper,
        pair=geometry_pair(),
        label=method_label,
        decimals=decimals,
    )


def geometry_pair() -> tuple[str, str]:
    """The runs of the geometry claim (ESD up and ρ down against its baseline) of the paper that measures the
    geometry (the CRT paper): the rows of its declaration's main table, baseline first."""
    declared = ablations.declaration(reporting("ESD"))
    baseline, method = (name for name, _ in ablations.table_rows(declared, "main").values())
    return baseline, method


def geometry_readings(frame: pd.DataFrame) -> list[str]:
    """:func:`kit.geometry_readings` of the rows with embeddings of their own, for the CRT paper's pair."""
    return kit.geometry_readings(own_embedding_rows(frame), pair=geometry_pair())


def own_embedding_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows with embeddings of their own: every row but the re-ranked ones (their embeddings are those of the runs
    they re-rank, :func:`~dmlstudy.rows.is_reranked`)."""
    return frame[[not is_reranked(name) for name in frame["variant"]]]


def scale_table(
    results: Sequence[tuple[str, RunResult]], *, validation_classes: Mapping[str, int], draws: int = 20
) -> pd.DataFrame:
    """Validation and test R@1 on one scale, per row and dataset, mean ± std over seeds (percent): ``val R@1``
    (each run's chosen checkpoint on the validation fold), ``test R@1`` (every test class) and ``test R@1 at
    the validation's class count``: each run's test embeddings read on ``draws`` random subsets of
    ``validation_classes[dataset]`` test classes (:func:`dmlstudy.metrics.class_subset_recall`, seed = the
    run's seed), the mean over the draws. Runs without a validation fold are left out."""
    records = []
    for variant, result in results:
        dataset = result.config.dataset
        if "val_R@1" not in result.metrics or dataset not in validation_classes:
            continue
        embeddings, labels = result.embeddings["embeddings"], result.embeddings["labels"]
        subsets = class_subset_recall(
            embeddings, labels, classes=validation_classes[dataset], draws=draws, seed=result.config.seed
        )
        records.append(
            {
                "method": method_label(variant),
                "dataset": dataset,
                "validation classes": validation_classes[dataset],
                "test classes": len(np.unique(labels)),
                "val R@1": result.metrics["val_R@1"],
                "test R@1": result.metrics["R@1"],
                "test R@1 at the validation's class count": float(subsets.mean()),
            }
        )
    frame = pd.DataFrame.from_records(records)
    if frame.empty:
        return frame
    by = ["method", "dataset", "validation classes", "test classes"]
    metrics = ["val R@1", "test R@1", "test R@1 at the validation's class count"]
    return summarize(frame.assign(**{m: frame[m] * 100 for m in metrics}), by=by, metrics=metrics, percent=False)


def spectrum_figure(embeddings: Mapping[str, tuple[np.ndarray, np.ndarray]], *, dataset: str) -> plt.Figure:
    """Normalised singular-value spectra (drop_first = 0) of every method's test embeddings on one dataset."""
    named = {method_label(v): e for v, (e, _) in embeddings.items()}
    return plots.spectrum(
        named,
        drop_first=0,
        title=f"{dataset}: test-embedding spectra (drop_first = 0, first seed)",
        methods={method_label(v): v for v in embeddings},
    )


# ----------------------------------------------------------------------------------------------
# Cost
# ----------------------------------------------------------------------------------------------
SECONDS_RANGE = "train_seconds (min–max)"  # the cost table's column of training seconds over seeds, fastest–slowest


def cost_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per dataset and method: parameters (M), training seconds and seconds per epoch (mean ± std over seeds),
    the training seconds' range over seeds (:data:`SECONDS_RANGE`, ``min–max``: what the recall-vs-time figure
    draws, since a mean ± std of skewed times can reach below 0 s), and, for the re-ranked row, the re-ranking
    seconds."""
    metrics = [m for m in ("train_seconds", "seconds_per_epoch", "rerank_seconds") if m in frame.columns]
    table = summarize(frame, by=["dataset", "variant"], metrics=metrics, percent=False, decimals=1)
    if "train_seconds" in frame.columns:
        seconds = frame.groupby(["dataset", "variant"], sort=False)["train_seconds"].agg(["min", "max"])
        table.insert(
            table.columns.get_loc("train_seconds") + 1,
            SECONDS_RANGE,
            [
                f"{seconds.loc[(d, v), 'min']:.1f}–{seconds.loc[(d, v), 'max']:.1f}"
                for d, v in zip(table["dataset"], table["variant"])
            ],
        )
    parameters = frame.groupby(["dataset", "variant"], sort=False)["parameters"].first() / 1e6
    table.insert(
        2,
        "parameters (M)",
        [round(float(parameters.loc[(d, v)]), 3) for d, v in zip(table["dataset"], table["variant"])],
    )
    table.insert(1, "method", [method_label(v) for v in table["variant"]])
    if "rerank_seconds" in table:
        table["rerank_seconds"] = [
            text if is_reranked(v) else "–" for text, v in zip(table["rerank_seconds"], table["variant"])
        ]
    return table[[c for c in table.columns if not c.endswith(("_mean", "_std"))]]


def time_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """What :func:`time_figure` draws, per dataset and row: training seconds (``seconds_mean``, ``seconds_std``,
    and their range ``seconds_min``, ``seconds_max``) and test R@1 in % (``recall_mean``, ``recall_std``), over
    seeds (std NaN for one seed)."""
    records = []
    for (dataset, variant), group in frame.groupby(["dataset", "variant"], sort=False):
        seconds, recall = group["train_seconds"], 100 * group["R@1"]
        records.append(
            {
                "dataset": dataset,
                "variant": variant,
                "seconds_mean": seconds.mean(),
                "seconds_std": seconds.std() if len(group) > 1 else np.nan,
                "seconds_min": seconds.min(),
                "seconds_max": seconds.max(),
                "recall_mean": recall.mean(),
                "recall_std": recall.std() if len(group) > 1 else np.nan,
            }
        )
    return pd.DataFrame.from_records(records)


def time_summary_of_tables(folder: str | Path, *, regime: str) -> pd.DataFrame:
    """:func:`time_summary` read back from a study's published tables in ``folder``: ``compare_cost.csv`` (training
    seconds, ``mean ± std``, and their range over seeds where the table has it, of the protocol's regime) and
    ``compare_main_<dataset><suffix>.csv`` of that ``regime`` (R@1 mean and std; :func:`table_suffix`), so the
    figure can be redrawn without the runs. A table written before it recorded the range gives NaN for it (the
    figure then draws no spread of training time)."""
    folder = Path(folder)
    cost = pd.read_csv(folder / "compare_cost.csv")
    mains = [
        pd.read_csv(folder / f"compare_main_{dataset}{table_suffix(regime)}.csv")
        for dataset in cost["dataset"].unique()
    ]
    recall = pd.concat(mains).set_index(["dataset", "variant"])

    def mean_std(text: str) -> tuple[float, float]:
        mean, _, std = str(text).partition("±")
        return float(mean), float(std) if std.strip() else np.nan

    def low_high(text) -> tuple[float, float]:
        low, _, high = str(text).partition("–")
        return (float(low), float(high)) if high.strip() else (np.nan, np.nan)

    ranges = cost[SECONDS_RANGE] if SECONDS_RANGE in cost.columns else [""] * len(cost)
    records = []
    for dataset, variant, seconds, extent in zip(cost["dataset"], cost["variant"], cost["train_seconds"], ranges):
        if (dataset, variant) not in recall.index:
            continue
        row = recall.loc[(dataset, variant)]
        seconds_mean, seconds_std = mean_std(seconds)
        seconds_min, seconds_max = low_high(extent)
        records.append(
            {
                "dataset": dataset,
                "variant": variant,
                "seconds_mean": seconds_mean,
                "seconds_std": seconds_std,
                "seconds_min": seconds_min,
                "seconds_max": seconds_max,
                "recall_mean": float(row["R@1_mean"]),
                "recall_std": float(row["R@1_std"]),
            }
        )
    return pd.DataFrame.from_records(records)


def time_figure(frame: pd.DataFrame) -> plt.Figure:
    """R@1 (%) against training seconds per method, one panel per dataset: the mean over seeds, R@1 ± its std, the
    training seconds' range over seeds (``frame``: one row per run; :func:`draw_time_figure` draws a
    :func:`time_summary`)."""
    return draw_time_figure(time_summary(frame))


def draw_time_figure(summary: pd.DataFrame) -> plt.Figure:
    """:func:`time_figure` from its :func:`time_summary`. The re-ranked row sits at the MS runs' training time (its
    cost is at test time). Each method keeps its colour and marker of every figure
    (:func:`dmlstudy.plots.method_style`) and is named in a column right of its panel, at its point's height, with
    a leader line (:func:`dmlstudy.plots.label_points`): names beside crowded points overprinted each other and
    the error bars.

    Decision (the spread): training time is drawn from the fastest to the slowest seed, never as mean ± std, which
    for a skewed time (one long seed) reached below 0 s; R@1 as mean ± std. Bars have no caps, which on both axes
    framed every marker in a square; the marker is drawn over its bars."""
    datasets = list(dict.fromkeys(summary["dataset"]))
    figure, axes = plt.subplots(1, len(datasets), figsize=(6.4 * len(datasets), 4.0), squeeze=False)
    labels = {}
    for axis, dataset in zip(axes[0], datasets):
        points = []
        for row in summary[summary["dataset"] == dataset].itertuples(index=False):
            style = plots.method_style(row.variant)
            spread = (row.seconds_min, row.seconds_max)
            axis.errorbar(
                row.seconds_mean,
                row.recall_mean,
                xerr=None
                if np.isnan(spread).any()
                else [[row.seconds_mean - spread[0]], [spread[1] - row.seconds_mean]],
                yerr=None if np.isnan(row.recall_std) else row.recall_std,
                marker=style.marker,
                markersize=7,
                markeredgecolor="white",
                color=style.colour,
                elinewidth=1.2,
                capsize=0,
                linestyle="none",
                label=method_label(row.variant),
            )
            points.append((row.seconds_mean, row.recall_mean, method_label(row.variant), style.colour))
        axis.set(xlabel="training seconds (whole run)", ylabel="R@1 (%)", title=dataset)
        axis.set_xlim(left=0)
        axis.grid(alpha=0.3)
        labels[axis] = points
    ranges = (
        "training seconds from the fastest to the slowest seed"
        if summary["seconds_min"].notna().any()
        else ("no spread of training time: these tables did not record it")
    )
    figure.suptitle(
        "R@1 against training time (circles: the papers' methods; squares: classic baselines)\n"
        f"mean over seeds; bars: R@1 ± std, {ranges}",
        fontsize=10,
    )
    figure.tight_layout()  # the panels' final height first: the names are spaced in it
    for axis, points in labels.items():
        plots.label_points(axis, points)
    figure.tight_layout()  # then room for the names
    return figure
