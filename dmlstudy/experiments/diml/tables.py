"""DIML tables and readings: the K and G sweeps and DIML training against the baseline, beside the paper."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from dmlstudy.experiments.diml.study import BASE_LOSS_NAMES, METRICS, PAPER_DATASETS, PAPER_GRID, PAPER_TRUNCATION
from dmlstudy.study.report import summarize
from dmlstudy.verdicts import effect_sentence, paired_differences

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
