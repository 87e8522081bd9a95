"""DGCRL tables and their readings: the main table, the α, λ, loss and decorrelation comparisons, each
beside the paper's numbers, with the study's verdicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from dmlstudy.experiments.dgcrl.study import (
    PAPER_KS,
    PAPER_LAMBDA,
    PAPER_LOSSES,
    PAPER_SPEEDUP_OVER_TRIPLET,
    PAPER_TABLE1,
    VARIANT_LABELS,
    centre_correlation,
    run_rows,
)
from dmlstudy.experiments.kit import paper_dataset, without_numbers
from dmlstudy.run.train import RunResult
from dmlstudy.study.grids import mean_std_table, results_frame
from dmlstudy.study.report import mean_std_text
from dmlstudy.verdicts import Verdict, censor, judge, paired_differences

COLUMN_DECIMALS = {
    "best R@1 (%)": 1,
    "centre |cos|": 3,
    "train accuracy": 3,
    "s/epoch (run)": 2,
    "s/epoch (side by side)": 2,
    "s to best": 1,
}


def _mean_table(
    frame: pd.DataFrame, metrics: Sequence[str], *, by: Sequence[str] = ("dataset", "variant")
) -> pd.DataFrame:
    """:func:`mean_std_table`, with the non-retrieval columns of :data:`COLUMN_DECIMALS` shown at their own precision."""
    table = mean_std_table(frame, metrics=list(metrics), by=tuple(by))
    for column, decimals in COLUMN_DECIMALS.items():
        if column in metrics:
            table[column] = [
                mean_std_text(m, s, n, decimals=decimals)
                for m, s, n in zip(table[f"{column}_mean"], table[f"{column}_std"], table["runs"])
            ]
    return table


def _paper_recall(values: Sequence[float] | None, ks: Sequence[int]) -> str:
    if values is None:
        return "–"
    lookup = dict(zip(PAPER_KS, values))
    return " / ".join(f"{lookup[k]:.1f}" for k in ks if k in lookup) or "–"


# ----------------------------------------------------------------------------------------------
# Main table: MS vs softmax without N-S vs DGCRL
# ----------------------------------------------------------------------------------------------
MAIN_METRICS = ("R@1", "R@2", "R@4", "R@8", "MAP@R", "NMI")


def main_table(results: list[tuple[str, RunResult]]) -> tuple[pd.DataFrame, list[str]]:
    """Mean ± std per dataset and variant, the paper's Table 1 R@1 beside (DGCRL, CUB / Cars), one sentence per dataset."""
    frame = results_frame(results)
    metrics = [m for m in MAIN_METRICS if m in frame.columns]
    table = mean_std_table(frame, metrics=metrics)
    table["paper R@1"] = [_paper_r1(dataset, variant) for dataset, variant in zip(table["dataset"], table["variant"])]
    table.insert(2, "setting", [VARIANT_LABELS.get(v, v) for v in table["variant"]])
    return without_numbers(table), [main_sentence(frame, dataset) for dataset in table["dataset"].unique()]


def _paper_r1(dataset: str, variant: str) -> str:
    paper = paper_dataset(dataset, "CUB")
    values = PAPER_TABLE1[paper].get(variant)
    return f"{values[0]:.1f} ({paper})" if values else "–"


def _verdict(frame: pd.DataFrame, dataset: str, first: str, second: str) -> Verdict | None:
    """:func:`~dmlstudy.verdicts.judge` of "``first`` > ``second``" in R@1 from per-seed paired runs
    (None when either has no run on ``dataset``)."""
    try:
        return judge(paired_differences(frame, dataset, first, second).differences)
    except KeyError:
        return None


def _compare(name_a: str, name_b: str, verdict: Verdict) -> str:
    """ "A − B: Δ R@1 points, CI, seeds → verdict" for the claim "A > B"."""
    return f"{name_a} − {name_b}: {verdict.interval_text()} → {verdict.text}"


def main_sentence(frame: pd.DataFrame, dataset: str) -> str:
    """Did DGCRL beat the plain softmax (the N-S + margin + decorrelation effect) and MS on ``dataset``?
    ``frame``: one row per run (:func:`results_frame`). The paper's direction is read by the study's rule
    (:func:`~dmlstudy.verdicts.judge` of the per-seed paired differences)."""
    if frame[(frame["dataset"] == dataset) & (frame["variant"] == "dgcrl")].empty:
        return f"{dataset}: no dgcrl run, nothing to compare."
    verdicts = {other: _verdict(frame, dataset, "dgcrl", other) for other in ("softmax", "ms")}
    parts = [
        _compare("DGCRL", label, verdicts[other])
        for other, label in (("softmax", "softmax without N-S"), ("ms", "MS"))
        if verdicts[other] is not None
    ]
    softmax = verdicts["softmax"]
    verdict = "cannot be checked (no softmax run)" if softmax is None else softmax.text
    return (
        f"{dataset}: R@1 "
        + "; ".join(parts)
        + f". The paper's direction (N-S layer and centre loss above a plain softmax "
        f"pipeline): {verdict}."
    )


def alpha_sentence(runs: pd.DataFrame, *, reference: float = 128.0) -> list[str]:
    """Paper: poor for small α, stable for α ≥ 16. Checked per dataset by the study's rule
    (:func:`~dmlstudy.verdicts.judge`) on :func:`alpha_runs`' per-seed R@1: "α = ``reference`` (the
    default) > the smallest α" (poor at small α: held), and "α = ``reference`` ≈ α" for every other α ≥ 16
    (stable: equivalent)."""
    sentences = []
    runs = runs.assign(variant=runs["alpha"].map(lambda alpha: f"{alpha:g}"))
    for dataset, group in runs.groupby("dataset"):
        alphas = sorted(set(group["alpha"]))
        if len(alphas) < 2 or reference not in alphas:
            sentences.append(f"{dataset}: fewer than two α or no α = {reference:g}, no direction to check.")
            continue

        def verdict(alpha: float, claimed: str = ">", group: pd.DataFrame = group, dataset: str = dataset) -> Verdict:
            differences = paired_differences(group, dataset, f"{reference:g}", f"{alpha:g}").differences
            return judge(differences, claimed=claimed)

        smallest = alphas[0]
        small = verdict(smallest)
        text = (
            f"{dataset}: R@1 at α = {reference:g} − α = {smallest:g}: {small.interval_text()} → {small.text} "
            f"(the paper: poor at small α, i.e. held)"
        )
        stable = [alpha for alpha in alphas if alpha >= 16 and alpha != reference]
        if stable:
            text += f"; α = {reference:g} − α ≥ 16: " + "; ".join(
                f"α = {alpha:g} {verdict(alpha, '≈').interval_text()} → {verdict(alpha, '≈').text}" for alpha in stable
            )
            text += " (the paper: stable, i.e. equivalent)"
        sentences.append(text + ".")
    return sentences


# ----------------------------------------------------------------------------------------------
# λ table (Table 2), loss comparison (Table 3), decorrelation variants
# ----------------------------------------------------------------------------------------------
def recall_table(
    results: list[tuple[str, RunResult]],
    *,
    ks: Sequence[int],
    key: Mapping[str, Any] | None = None,
    key_name: str = "setting",
    extra=None,
) -> pd.DataFrame:
    """Mean ± std of Recall@K (and any ``extra`` per-run numbers) per dataset and variant, labelled by ``key``."""
    frame = run_rows(results, ks, extra)
    metrics = [c for c in frame.columns if c not in ("variant", "dataset", "seed")]
    table = _mean_table(frame, metrics)
    table.insert(2, key_name, [(key or {}).get(v, VARIANT_LABELS.get(v, v)) for v in table["variant"]])
    return table


def lambda_table(
    results: list[tuple[str, RunResult]], variants: Mapping[float, tuple[str, dict]], *, ks: Sequence[int]
) -> tuple[pd.DataFrame, list[str]]:
    """Recall@K per λ, the paper's Table 2 beside, and the sentence: did λ = 0.1 beat λ = 0?"""
    lambda_of = {name: value for value, (name, _) in variants.items()}
    table = recall_table(
        results, ks=ks, key=lambda_of, key_name="λ", extra=lambda v, r: {"centre |cos|": centre_correlation(r)}
    )
    table["paper R@K (CUB)"] = [_paper_recall(PAPER_LAMBDA.get(lambda_of[v]), ks) for v in table["variant"]]
    sentences = []
    for dataset in table["dataset"].unique():
        here = table[table["dataset"] == dataset]
        r1 = dict(zip(here["λ"], here["R@1_mean"]))
        best = max(r1, key=r1.get)
        text = f"{dataset}: best λ here is {best:g} (R@1 {r1[best]:.1f}); the paper's best is 0.1"
        if 0.0 in r1 and 0.1 in r1:
            text += (
                f"; λ = 0.1 − λ = 0 = {r1[0.1] - r1[0.0]:+.1f} points (paper +1.2): the push "
                f"{'helped' if r1[0.1] > r1[0.0] else 'did not help'}"
            )
        sentences.append(text + ".")
    return without_numbers(table), sentences


def decorrelation_table(
    results: list[tuple[str, RunResult]], variants: Mapping[str, tuple[str, dict]], *, ks: Sequence[int]
) -> tuple[pd.DataFrame, list[str]]:
    """The three decorrelations side by side: Recall@K and the final centres' mean |cos|."""
    label_of = {name: decorrelation for decorrelation, (name, _) in variants.items()}
    table = recall_table(
        results,
        ks=ks,
        key=label_of,
        key_name="decorrelation",
        extra=lambda v, r: {"centre |cos|": centre_correlation(r)},
    )
    sentences = []
    for dataset in table["dataset"].unique():
        here = table[table["dataset"] == dataset].set_index("decorrelation")
        parts = [
            f"{name}: R@1 {here.loc[name, 'R@1_mean']:.1f}, centre |cos| {here.loc[name, 'centre |cos|_mean']:.3f}"
            for name in here.index
        ]
        text = f"{dataset}: " + "; ".join(parts)
        if {"paper", "none"} <= set(here.index):
            gain = here.loc["paper", "R@1_mean"] - here.loc["none", "R@1_mean"]
            decorrelated = here.loc["paper", "centre |cos|_mean"] < here.loc["none", "centre |cos|_mean"]
            text += (
                f". The paper hook {'did' if decorrelated else 'did not'} leave the centres less correlated than no "
                f"decorrelation and changed R@1 by {gain:+.1f} points"
            )
        sentences.append(text + ".")
    return without_numbers(table), sentences


def loss_table(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Mean ± std of :func:`loss_frame` per dataset and loss, the paper's Table 3 beside, and the speed sentences."""
    metrics = [c for c in frame.columns if c not in ("variant", "dataset", "seed", "best_epoch_censored")]
    table = _mean_table(frame, metrics)
    table.insert(2, "loss", [VARIANT_LABELS.get(v, v) for v in table["variant"]])
    table["paper epochs"] = [PAPER_LOSSES[v][0] if v in PAPER_LOSSES else "–" for v in table["variant"]]
    table["paper R@1"] = [PAPER_LOSSES[v][1][0] if v in PAPER_LOSSES else "–" for v in table["variant"]]
    sentences = [loss_sentence(table, dataset, frame=frame) for dataset in table["dataset"].unique()]
    return without_numbers(table), sentences


def loss_sentence(table: pd.DataFrame, dataset: str, *, frame: pd.DataFrame) -> str:
    """The paper's "20 epochs vs 100" and "5× faster than triplet", measured on ``dataset``: the claim
    "DGCRL's best epoch ≤ 1/5 of triplet's" is judged by the study's rule on the per-seed paired differences
    triplet best epoch / 5 − DGCRL best epoch (epochs; ``frame`` from :func:`loss_frame`), margin 1 epoch, and
    by :func:`verdicts.censor` when runs reached the epoch cap still improving."""
    here = table[table["dataset"] == dataset].set_index("variant")
    if "dgcrl" not in here.index:
        return f"{dataset}: no dgcrl run."
    epochs_run = int(here["epochs run_mean"].max())
    at_cap = [v for v in here.index if here.loc[v, "best epoch_mean"] >= epochs_run]
    text = (
        f"{dataset}: best R@1 reached at epoch "
        + ", ".join(f"{v} {here.loc[v, 'best epoch_mean']:.1f}" for v in here.index)
        + f" (of {epochs_run}; {len(at_cap)}/{len(here)} losses peak at the last epoch, so their epochs-to-best is capped by the budget)"
    )
    if "triplet-ns" in here.index:
        epoch_ratio = here.loc["triplet-ns", "best epoch_mean"] / here.loc["dgcrl", "best epoch_mean"]
        paired = paired_differences(
            frame, dataset, "triplet-ns", "dgcrl", "best epoch", first_scale=1 / PAPER_SPEEDUP_OVER_TRIPLET
        )
        speed = censor(judge(paired.differences), **paired.censoring)
        text += (
            f". Triplet needs {epoch_ratio:.1f}× the epochs of DGCRL (paper 100/20 = 5.0×); triplet's best epoch / "
            f"{PAPER_SPEEDUP_OVER_TRIPLET:.0f} − DGCRL's: {speed.interval_text('epochs')} → {speed.text}"
        )
        if "s to best_mean" in here.columns and np.isfinite(here.loc["dgcrl", "s to best_mean"]):
            time_ratio = here.loc["triplet-ns", "s to best_mean"] / here.loc["dgcrl", "s to best_mean"]
            per_epoch = (
                here.loc["triplet-ns", "s/epoch (side by side)_mean"] / here.loc["dgcrl", "s/epoch (side by side)_mean"]
            )
            text += (
                f"; with side-by-side step times (triplet/DGCRL per epoch {per_epoch:.2f}×) training time to the best "
                f"epoch is {time_ratio:.1f}× (the paper claims {PAPER_SPEEDUP_OVER_TRIPLET:.0f}×)"
            )
    best = max(here.index, key=lambda v: here.loc[v, "R@1_mean"])
    return text + f". Highest R@1: {VARIANT_LABELS.get(best, best)} (paper: DGCRL)."
