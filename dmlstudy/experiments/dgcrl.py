"""Notebook 40 (DGCRL, seed 004): the study config, the runs of every table, the tables, readings and figures.

``notebooks/40_dgcrl.ipynb`` calls only the functions here. Run names follow the protocol,
``<dataset>-<variant>-seed<seed>``: the MS baseline is ``ms``, DGCRL with every default is ``dgcrl`` (the
comparison notebook reuses both). Other variants are named by :data:`NAMED_VARIANTS` or, for sweeps, from
what differs from the defaults (:func:`dgcrl_variant`), so one configuration asked for by two tables is one
run (α = 128, λ = 0.1 and the ``paper`` decorrelation are all the ``dgcrl`` run).

Decisions (stated in the notebook too):

* The "softmax without N-S" baseline is ``dgcrl`` with ``normalize_scale=False, margin=0,
  decorrelation="none"``: the plain softmax classifier on the same pooled, projected feature.
* The loss comparison (paper Table 3: "the same setting of the rest components") keeps DGCRL's head
  (avg ‖ max pooling → projection → N-S) and swaps the loss: ``triplet-ns``, ``lifted-ns`` (pair losses of
  pytorch-metric-learning on that head; they normalise the embeddings, so α plays no role for them),
  ``gcrl`` (Eq. 2) and ``dgcrl``. "Epochs to best" is the first epoch with the run's highest test R@1
  (evaluated every epoch), capped by the protocol's epoch count.
* Seconds per epoch come from two sources: each run's own records (noisy on a shared machine: runs happen
  at different times) and :func:`step_seconds`, which times the training step of every loss side by side
  in one process, interleaved, and multiplies by the steps of one full pass.
* Recall@K up to K = 32 (the paper's tables) is recomputed from each run's stored test embeddings, so the
  runs keep the dataset's standard K list and stay shareable with other notebooks.
* Training accuracy (paper Fig. 3, right) is measured with the centres on ``accuracy_items`` training
  images (evenly spaced, test-time transforms).
* Paper numbers are ImageNet-pretrained ResNet-50 on CUB / Cars; they orient, they are not targets.
  SynBirds stands beside CUB and Glyphs beside Cars.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.data import Subset

from dmlstudy import metrics as metric_functions
from dmlstudy.checkpoint_selection import best_epoch_censored, evaluation_column, selection_evaluations
from dmlstudy.data import build_dataset, build_transforms
from dmlstudy.experiments.kit import (
    first_seed_embeddings,
    paper_dataset,
    projection_figure,
    variant_name,
    with_reference,
    without_numbers,
)
from dmlstudy.experiments.papers import numbers
from dmlstudy.experiments.protocol import ProtocolConfig, StudyConfig, mean_std_table, results_frame
from dmlstudy.experiments.rows import SHARED_VARIANTS
from dmlstudy.methods import build_method
from dmlstudy.methods.dgcrl import (
    DGCRL,
    centre_accuracy,
    centre_orthogonality_loss,
    centre_softmax_loss,
    gram_schmidt_gradient,
    mean_abs_cosine,
    normalize_scale,
)
from dmlstudy.models import build_backbone
from dmlstudy.paths import data_root
from dmlstudy.records import seed_everything
from dmlstudy.report import mean_std_text
from dmlstudy.run_data import load_datasets, training_class_count
from dmlstudy.train import OPTIMIZERS, RunResult
from dmlstudy.verdicts import Verdict, censor, judge, paired_differences

# ----------------------------------------------------------------------------------------------
# The paper's numbers (Zheng et al., AAAI 2019), from papers.yaml. Recall@K in %, K = 1 … 32.
# ----------------------------------------------------------------------------------------------
PAPER_KS = numbers("dgcrl", "KS")
PAPER_TABLE1 = numbers("dgcrl", "TABLE1")  # Table 1, ResNet-50 (ImageNet): paper dataset → variant → R@1 … R@32
PAPER_LAMBDA = numbers("dgcrl", "LAMBDA")  # Table 2 (CUB): λ → R@1 … R@32
PAPER_LOSSES = numbers("dgcrl", "LOSSES")  # Table 3 (CUB): loss → (training epochs, R@1 … R@32)
PAPER_SPEEDUP_OVER_TRIPLET = numbers("dgcrl", "SPEEDUP_OVER_TRIPLET")
PAPER_ALPHA = numbers("dgcrl", "ALPHA")

NAMED_VARIANTS: dict[str, dict[str, Any]] = {
    "ms": {"method": "ms"},
    "softmax": SHARED_VARIANTS["softmax"],
    "dgcrl": {"method": "dgcrl"},
    "gcrl": {"method": "gcrl"},
    "triplet-ns": {"method": "dgcrl", "method_kwargs": {"loss": "triplet"}},
    "lifted-ns": {"method": "dgcrl", "method_kwargs": {"loss": "lifted"}},
}
VARIANT_LABELS = {
    "ms": "MS baseline",
    "softmax": "softmax without N-S",
    "dgcrl": "DGCRL",
    "gcrl": "GCRL (Eq. 2)",
    "triplet-ns": "triplet (N-S head)",
    "lifted-ns": "lifted structure (N-S head)",
}
KWARG_TAGS = {"decorrelation_weight": "lambda", "decorrelation": "decor"}  # DGCRL arguments abbreviated in run names


@dataclass
class DGCRLStudy(StudyConfig):
    """Parameters of ``notebooks/40_dgcrl.ipynb``: the protocol plus DGCRL's sweeps. Empty lists skip a table."""

    main_variants: list = field(
        default_factory=lambda: ["ms", "softmax", "dgcrl"]
    )  # main table on every dataset and seed
    ablation_datasets: list = field(default_factory=lambda: ["synbirds"])  # datasets of the ablation tables
    ablation_seeds: list = field(default_factory=lambda: [0])  # seeds of the ablation tables
    alphas: list = field(default_factory=lambda: [1.0])  # α of the N-S sweep (Fig. 3: 1 … 256); 128 is always added
    lambdas: list = field(
        default_factory=lambda: []
    )  # λ of the Gram–Schmidt push (Table 2: 0, .1, .2, .4); 0.1 is added
    losses: list = field(
        default_factory=lambda: ["triplet-ns"]
    )  # Table 3 losses (triplet-ns, lifted-ns, gcrl); dgcrl is added
    decorrelations: list = field(default_factory=lambda: [])  # beside the default paper hook: code, none
    table_ks: list = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])  # K of the Recall@K tables (the paper's)
    accuracy_items: int = 128  # training images scored with the centres (Fig. 3, right)
    timing_rounds: int = 1  # side-by-side timed training steps per loss (after one warm-up step)
    timing_clock: str = "cpu"  # cpu (one thread's CPU time: steady on a shared machine) or wall
    toy_steps: int = 40  # SGD steps of the decorrelation toy
    tsne_variants: list = field(default_factory=lambda: ["dgcrl"])  # t-SNE panels (ablation dataset, first seed)
    tsne_classes: int = 10  # test classes in the t-SNE plots
    tsne_iterations: int = 300  # t-SNE optimisation steps (scikit-learn's minimum is 250)

    def __post_init__(self) -> None:
        super().__post_init__()
        checks = {
            "main_variants": (self.main_variants, set(NAMED_VARIANTS)),
            "losses": (self.losses, {"triplet-ns", "lifted-ns", "gcrl", "dgcrl"}),
            "decorrelations": (self.decorrelations, {"paper", "code", "none"}),
            "tsne_variants": (self.tsne_variants, set(NAMED_VARIANTS)),
            "timing_clock": ([self.timing_clock], {"cpu", "wall"}),
        }
        for name, (values, valid) in checks.items():
            unknown = [value for value in values if value not in valid]
            if unknown:
                raise ValueError(f"parameter {name!r}: unknown values {unknown}; valid: {sorted(valid)}")

    def ablation_protocol(self) -> ProtocolConfig:
        """The protocol with the ablation seeds (the ablation tables run on ``ablation_datasets``)."""
        return self.protocol.with_seeds(self.ablation_seeds)


# ----------------------------------------------------------------------------------------------
# Variants and their runs
# ----------------------------------------------------------------------------------------------
def dgcrl_defaults() -> dict[str, Any]:
    """DGCRL's keyword arguments and their defaults (from the class signature)."""
    skip = {"backbone", "embedding_dim", "num_classes"}
    return {
        name: spec.default
        for name, spec in inspect.signature(DGCRL.__init__).parameters.items()
        if name not in skip and spec.default is not inspect.Parameter.empty
    }


def _format(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def dgcrl_variant(*, explicit: Sequence[str] = (), **method_kwargs: Any) -> tuple[str, dict[str, Any]]:
    """``(name, spec)`` of a DGCRL variant, named from what differs from the defaults.

    ``dgcrl_variant()`` is ``("dgcrl", {"method": "dgcrl"})``; ``dgcrl_variant(alpha=1.0)`` is
    ``("dgcrl-alpha=1", …)``; ``decorrelation_weight`` is shown as ``lambda``, ``decorrelation`` as ``decor``.
    Arguments named in ``explicit`` stay in the spec and the name even at their default: the α sweep's points
    say their α (``dgcrl-alpha=128``), since the plain ``dgcrl`` row takes the study's tuned values.
    """
    defaults = dgcrl_defaults()
    unknown = sorted(set(method_kwargs) - set(defaults))
    if unknown:
        raise KeyError(f"dgcrl_variant: unknown DGCRL arguments {unknown}; valid: {sorted(defaults)}")
    kwargs = {key: value for key, value in sorted(method_kwargs.items()) if defaults[key] != value or key in explicit}
    spec: dict[str, Any] = {"method": "dgcrl"}
    if kwargs:
        spec["method_kwargs"] = kwargs
    return variant_name("dgcrl", kwargs, short=KWARG_TAGS, show=_format), spec


def named_variants(names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The specs of :data:`NAMED_VARIANTS` by name; an unknown name lists the valid ones."""
    unknown = [name for name in names if name not in NAMED_VARIANTS]
    if unknown:
        raise KeyError(f"unknown variants {unknown}; valid: {sorted(NAMED_VARIANTS)}")
    return {name: NAMED_VARIANTS[name] for name in names}


def alpha_variants(alphas: Sequence[float]) -> dict[float, tuple[str, dict]]:
    return {
        alpha: dgcrl_variant(alpha=float(alpha), explicit=("alpha",))
        for alpha in with_reference([float(a) for a in alphas], 128.0)
    }


def lambda_variants(lambdas: Sequence[float]) -> dict[float, tuple[str, dict]]:
    return {
        value: dgcrl_variant(decorrelation_weight=float(value))
        for value in with_reference([float(v) for v in lambdas], 0.1)
    }


def decorrelation_variants(decorrelations: Sequence[str]) -> dict[str, tuple[str, dict]]:
    order = ["paper", *[d for d in ("code", "none") if d in decorrelations]]
    return {name: dgcrl_variant(decorrelation=name) for name in order}


def loss_variants(losses: Sequence[str]) -> dict[str, dict]:
    order = [name for name in ("triplet-ns", "lifted-ns", "gcrl") if name in losses]
    unknown = sorted(set(losses) - {"triplet-ns", "lifted-ns", "gcrl", "dgcrl"})
    if unknown:
        raise KeyError(f"unknown losses {unknown}; valid: triplet-ns, lifted-ns, gcrl (dgcrl is always added)")
    return named_variants([*order, "dgcrl"])


# ----------------------------------------------------------------------------------------------
# Measurements on finished runs
# ----------------------------------------------------------------------------------------------
def recall_at(result: RunResult, ks: Sequence[int]) -> dict[str, float]:
    """Recall@K for ``ks`` (those below the number of test items) from the run's stored test embeddings."""
    embeddings, labels = result.embeddings["embeddings"], result.embeddings["labels"]
    usable = [int(k) for k in ks if int(k) < len(labels)]
    return {f"R@{k}": value for k, value in metric_functions.recall_at_k(embeddings, labels, usable).items()}


def best_epoch(history: pd.DataFrame, *, metric: str = "R@1", warmup_epochs: int = 0) -> tuple[int, float]:
    """``(epoch, value)`` of the first evaluation with the highest ``metric`` among those the reported checkpoint
    is chosen from (:func:`dmlstudy.train.selection_evaluations`: validation classes after the warm-up when the
    run has them, so the epoch its reported checkpoint comes from)."""
    evaluated = selection_evaluations(history, warmup_epochs, metric)
    if evaluated.empty:
        raise ValueError(f"best_epoch: the history has no {metric!r} evaluations after warm-up epoch {warmup_epochs}")
    return int(evaluated.idxmax()), float(evaluated.max())


def training_subset(result: RunResult, *, items: int):
    """``items`` evenly spaced training images of the run's classes, with test-time transforms."""
    config = result.config
    root = Path(config.data_root or data_root()) / config.dataset
    train = build_dataset(config.dataset, root, "train", transform=build_transforms(config.image_size, train=False))
    keep = np.flatnonzero(train.labels < config.train_classes) if config.train_classes else np.arange(len(train))
    chosen = keep[np.unique(np.linspace(0, len(keep) - 1, min(items, len(keep))).round().astype(int))]
    return Subset(train, chosen.tolist())


def training_accuracy(result: RunResult, *, items: int = 512) -> float:
    """Classification accuracy of the run's centres on ``items`` training images (paper Fig. 3, right)."""
    if not isinstance(result.method, DGCRL) or result.method.centres is None:
        raise TypeError(f"training_accuracy needs a DGCRL run with class centres, got {type(result.method).__name__}")
    return centre_accuracy(
        result.method, training_subset(result, items=items), batch_size=result.config.eval_batch_size
    )


def centre_correlation(result: RunResult) -> float:
    """Mean |cos| between the run's final centres (as the loss uses them); NaN without centres."""
    method = result.method
    if not isinstance(method, DGCRL) or method.centres is None:
        return float("nan")
    with torch.no_grad():
        return float(mean_abs_cosine(method.effective_centres()))


def _rows(results: list[tuple[str, RunResult]], ks: Sequence[int], extra=None) -> pd.DataFrame:
    rows = []
    for variant, result in results:
        row = {
            "variant": variant,
            "dataset": result.config.dataset,
            "seed": result.config.seed,
            **recall_at(result, ks),
        }
        row.update(extra(variant, result) if extra else {})
        rows.append(row)
    return pd.DataFrame(rows)


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


# ----------------------------------------------------------------------------------------------
# α sweep (Fig. 3)
# ----------------------------------------------------------------------------------------------
def alpha_runs(
    results: list[tuple[str, RunResult]], variants: Mapping[float, tuple[str, dict]], *, ks: Sequence[int], items: int
) -> pd.DataFrame:
    """One row per (dataset, α, seed): test Recall@K and the centres' accuracy on training images."""
    alpha_of = {name: alpha for alpha, (name, _) in variants.items()}
    return _rows(
        results,
        ks,
        lambda variant, result: {"alpha": alpha_of[variant], "train accuracy": training_accuracy(result, items=items)},
    )


def alpha_means(runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`alpha_runs` averaged over seeds: one row per (dataset, α)."""
    return runs.groupby(["dataset", "alpha"], sort=True).mean(numeric_only=True).drop(columns="seed").reset_index()


def alpha_figure(frame: pd.DataFrame) -> plt.Figure:
    """Paper Fig. 3 on our data: test Recall@K (left) and training accuracy (right) against α (log₂ axis).

    With fewer than :data:`dmlstudy.plots.MIN_SWEEP_VALUES` values of α the points are not joined (two values
    are a comparison, not a curve) and the title says how many values there are."""
    from dmlstudy import plots

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    recall_columns = [c for c in frame.columns if c.startswith("R@")]
    alphas = sorted(set(frame["alpha"]))
    linestyle = plots.sweep_linestyle(alphas)
    for dataset, group in frame.groupby("dataset"):
        dashes = linestyle if linestyle == "none" or dataset == frame["dataset"].iloc[0] else "--"
        for index, column in enumerate(recall_columns):
            left.plot(
                group["alpha"],
                100 * group[column],
                linestyle=dashes,
                marker="o",
                color=plots.PALETTE[index % len(plots.PALETTE)],
                label=f"{column} {dataset}",
            )
        right.plot(
            group["alpha"],
            100 * group["train accuracy"],
            linestyle=dashes,
            marker="s",
            color="k",
            label=f"train accuracy {dataset}",
        )
    few = "" if linestyle == "-" else f" (only {len(alphas)} α value{'s' if len(alphas) > 1 else ''}: points, no curve)"
    for axis, title, ylabel in (
        (left, "test Recall@K", "Recall@K (%)"),
        (right, "training accuracy (centres)", "accuracy (%)"),
    ):
        axis.set_xscale("log", base=2)
        axis.set(xlabel="α (N-S scale)", ylabel=ylabel, title=title + few)
        plots.plain_log_ticks(axis, alphas)
        axis.grid(alpha=0.3)
    figure.tight_layout()
    plots.legend_outside(figure)
    return figure


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
    frame = _rows(results, ks, extra)
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


def loss_frame(
    results: list[tuple[str, RunResult]],
    *,
    ks: Sequence[int],
    step_seconds_by_variant: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """Per run: Recall@K, the epoch of the best test R@1, the run's own seconds per epoch, and (if given) the
    side-by-side step time × steps per epoch and the training time to the best epoch."""

    def extra(variant: str, result: RunResult) -> dict[str, float]:
        epoch, value = best_epoch(result.history, warmup_epochs=result.config.warmup_epochs)
        steps = result.history.get("train_seconds")
        row = {
            "best epoch": epoch,
            "best R@1 (%)": 100 * value,
            "epochs run": int(result.history["epoch"].max()),
            "s/epoch (run)": float(steps.mean()) if steps is not None else float("nan"),
            "best_epoch_censored": best_epoch_censored(
                result.history, result.config.patience, result.config.warmup_epochs
            ),
        }
        if step_seconds_by_variant and variant in step_seconds_by_variant:
            row["s/epoch (side by side)"] = step_seconds_by_variant[variant] * steps_per_epoch(result)
            row["s to best"] = row["s/epoch (side by side)"] * epoch
        return row

    return _rows(results, ks, extra)


def steps_per_epoch(result: RunResult) -> int:
    """Training steps of one epoch of the run (its ``steps_per_epoch`` or a full pass)."""
    config = result.config
    if config.steps_per_epoch:
        return int(config.steps_per_epoch)
    return len(load_datasets(config)["train"]) // (config.classes_per_batch * config.samples_per_class)


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


def loss_curves(results: list[tuple[str, RunResult]], *, metric: str = "R@1") -> plt.Figure:
    """``metric`` per evaluated epoch of each loss (validation classes when the runs have them, else test; first
    seed per dataset and loss), each in its method's style
    (:func:`dmlstudy.plots.method_style`; variants that are no method row keep a colour of their own)."""
    from dmlstudy import plots

    datasets = sorted({result.config.dataset for _, result in results})
    figure, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.4), squeeze=False)
    seen: set[tuple[str, str]] = set()
    for variant, result in results:
        key = (result.config.dataset, variant)
        if key in seen:
            continue
        seen.add(key)
        axis = axes[0, datasets.index(result.config.dataset)]
        column, classes = evaluation_column(result.history, metric)
        history = result.history.dropna(subset=[column])
        style = plots.method_style(variant)
        axis.plot(
            history["epoch"],
            100 * history[column],
            marker=style.marker,
            color=style.colour,
            label=VARIANT_LABELS.get(variant, variant),
        )
        axis.set(xlabel="epoch", ylabel=f"{classes} {metric} (%)", title=result.config.dataset)
    for axis in axes[0]:
        axis.grid(alpha=0.3)
        plots.integer_ticks(axis)
    figure.tight_layout()
    plots.legend_outside(figure)
    return figure


# ----------------------------------------------------------------------------------------------
# Side-by-side timing of the training step of each loss
# ----------------------------------------------------------------------------------------------
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def step_seconds(
    protocol: ProtocolConfig,
    variants: Mapping[str, Mapping[str, Any]],
    *,
    num_classes: int,
    rounds: int = 3,
    seed: int = 0,
    clock: str = "wall",
) -> dict[str, float]:
    """Median seconds of one training step (forward, loss, backward, AdamW step) per variant, measured
    interleaved in this process on one random batch of the protocol's shape (after one warm-up step each).

    ``clock="cpu"`` measures this process's CPU time with torch restricted to one thread for the measurement
    (restored afterwards): much steadier than wall time on a machine shared with other jobs; the ratios
    between losses are what it is for."""
    if clock not in CLOCKS:
        raise ValueError(f"step_seconds: clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    threads = torch.get_num_threads()
    if clock == "cpu":
        torch.set_num_threads(1)
    try:
        return _interleaved_steps(
            protocol, variants, num_classes=num_classes, rounds=rounds, seed=seed, now=CLOCKS[clock]
        )
    finally:
        torch.set_num_threads(threads)


def _interleaved_steps(
    protocol: ProtocolConfig,
    variants: Mapping[str, Mapping[str, Any]],
    *,
    num_classes: int,
    rounds: int,
    seed: int,
    now,
) -> dict[str, float]:
    """The measurement of :func:`step_seconds` with the clock ``now``: round 0 warms up, later rounds alternate the order."""
    seed_everything(seed)
    batch = protocol.classes_per_batch * protocol.samples_per_class
    images = torch.randn(batch, 3, protocol.image_size, protocol.image_size)
    labels = torch.arange(protocol.classes_per_batch).repeat_interleave(protocol.samples_per_class) % num_classes
    models, optimizers = {}, {}
    for name, spec in variants.items():
        backbone = build_backbone(protocol.backbone, image_size=protocol.image_size)
        models[name] = build_method(
            spec["method"],
            backbone=backbone,
            embedding_dim=protocol.embedding_dim,
            num_classes=num_classes,
            **dict(spec.get("method_kwargs") or {}),
        )
        groups = models[name].parameter_groups(lr=protocol.lr, head_lr=1e-2, weight_decay=1e-4)
        optimizers[name] = OPTIMIZERS["adamw"]([{k: v for k, v in g.items() if k != "name"} for g in groups])
    timings: dict[str, list[float]] = {name: [] for name in variants}
    for round_index in range(rounds + 1):
        order = list(variants) if round_index % 2 == 0 else list(reversed(list(variants)))
        for name in order:
            started = now()
            loss, _ = models[name].loss(images, labels)
            optimizers[name].zero_grad(set_to_none=True)
            loss.backward()
            optimizers[name].step()
            if round_index:
                timings[name].append(now() - started)
    return {name: float(np.median(values)) for name, values in timings.items()}


# ----------------------------------------------------------------------------------------------
# Teaching figures: Eq. 8 and the decorrelation toy
# ----------------------------------------------------------------------------------------------
def distance_softmax_gap(
    *, alpha: float = 128.0, classes: int = 5, dim: int = 8, equal_norms: bool = True, seed: int = 0
) -> float:
    """max |softmax(x̂ Wᵀ) − softmax(−½‖x̂ − w_j‖²)| over a random batch: 0 when every ‖w_j‖ is equal (Eq. 8)."""
    generator = torch.Generator().manual_seed(seed)
    scaled = normalize_scale(torch.randn(16, dim, generator=generator, dtype=torch.float64), alpha=alpha)
    centres = torch.randn(classes, dim, generator=generator, dtype=torch.float64)
    if equal_norms:
        centres = F.normalize(centres, dim=1) * 3.0
    distances = torch.cdist(scaled, centres)
    return float(((scaled @ centres.T).softmax(1) - (-0.5 * distances**2).softmax(1)).abs().max())


def toy_decorrelation(
    *, decorrelation: str, weight: float = 1.0, with_loss: bool = True, steps: int = 60, lr: float = 0.5, seed: int = 0
) -> dict[str, Any]:
    """Three centres in 3-D (so they can become orthogonal), started strongly correlated, trained by SGD under a decorrelation variant.

    With ``with_loss`` the centres also get the margin-softmax gradient (α = 2, m = 0.5) of 40 fixed random
    features (no class structure, so the loss alone barely separates the centres); without it only the
    decorrelation acts (the ``paper`` push, or the ``code`` regulariser and clamp). Returns the centres at
    every step (``steps + 1`` × 3 × 3) and their mean |cos| per step.
    """
    generator = torch.Generator().manual_seed(seed)
    classes, dim = 3, 3
    features = normalize_scale(torch.randn(40, dim, generator=generator), alpha=2.0)
    labels = torch.arange(40) % classes
    centres = torch.nn.Parameter(torch.ones(classes, dim) + 0.3 * torch.randn(classes, dim, generator=generator))
    optimizer = torch.optim.SGD([centres], lr=lr)
    history = [centres.detach().clone()]
    for _ in range(steps):
        used = centres
        if decorrelation == "paper":
            used = centres.view_as(centres)
            used.register_hook(lambda g, values=centres.detach(): gram_schmidt_gradient(g, values, weight=weight))  # noqa: B008 (the centres when the hook is made)
        loss = centre_softmax_loss(features, used, labels, margin=0.5)[0] if with_loss else 0.0 * used.sum()
        if decorrelation == "code":
            loss = loss + 0.5 * centre_orthogonality_loss(used)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if decorrelation == "code":
            with torch.no_grad():
                centres.clamp_(min=0.0)
        history.append(centres.detach().clone())
    trajectory = torch.stack(history)
    return {"centres": trajectory.numpy(), "abs_cos": np.array([float(mean_abs_cosine(c)) for c in trajectory])}


def toy_figure(*, steps: int = 60, paper_weight: float = 1.0) -> plt.Figure:
    """Unit centres before and after the decorrelation alone (3-D arrows), and mean |cos| per step, alone and
    together with the softmax loss (λ = 0 vs λ = ``paper_weight``)."""
    from dmlstudy import plots

    alone = {
        f"paper push alone (λ = {paper_weight:g})": toy_decorrelation(
            decorrelation="paper", weight=paper_weight, with_loss=False, steps=steps
        ),
        "code regulariser alone": toy_decorrelation(decorrelation="code", with_loss=False, steps=steps),
    }
    with_loss = {
        "softmax + paper, λ = 0": toy_decorrelation(decorrelation="paper", weight=0.0, steps=steps),
        f"softmax + paper, λ = {paper_weight:g}": toy_decorrelation(
            decorrelation="paper", weight=paper_weight, steps=steps
        ),
        "softmax + code": toy_decorrelation(decorrelation="code", steps=steps),
    }
    figure = plt.figure(figsize=(13, 3.8))
    panels = [
        ("start", next(iter(alone.values()))["centres"][0]),
        *[(name, run["centres"][-1]) for name, run in alone.items()],
    ]
    for index, (title, centres) in enumerate(panels):
        axis = figure.add_subplot(1, len(panels) + 1, index + 1, projection="3d")
        unit = centres / np.linalg.norm(centres, axis=1, keepdims=True)
        for k, vector in enumerate(unit):
            axis.quiver(0, 0, 0, *vector, color=f"C{k}", linewidth=2, arrow_length_ratio=0.15)
        axis.set(xlim=(-1, 1), ylim=(-1, 1), zlim=(-1, 1))
        axis.set_title(f"{title}\nmean |cos| {float(mean_abs_cosine(torch.as_tensor(centres))):.2f}", fontsize=9)
        axis.tick_params(labelsize=6)
    axis = figure.add_subplot(1, len(panels) + 1, len(panels) + 1)
    for name, run in {**alone, **with_loss}.items():
        axis.plot(run["abs_cos"], label=name, linestyle="--" if name in alone else "-")
    axis.set(xlabel="SGD step", ylabel="mean |cos(w_i, w_j)|", title="centre correlation")
    axis.grid(alpha=0.3)
    plots.integer_ticks(axis)
    figure.tight_layout()
    plots.legend_outside(figure, [axis])
    return figure


def tsne_figure(
    results: list[tuple[str, RunResult]],
    *,
    variants: Sequence[str],
    classes: int = 10,
    iterations: int = 300,
    seed: int = 0,
) -> plt.Figure:
    """t-SNE (:func:`~dmlstudy.experiments.kit.projection_figure`) of the test embeddings of the first ``classes``
    test classes, one panel per variant (its first seed on the first run's dataset)."""
    embeddings = first_seed_embeddings(results, variants=variants)
    dataset = next((result.config.dataset for variant, result in results if variant in embeddings), "")
    return projection_figure(
        embeddings,
        kind="tsne",
        classes=classes,
        seed=seed,
        title=dataset,
        label=lambda v: VARIANT_LABELS.get(v, v),
        iterations=iterations,
    )


def train_classes_of(protocol: ProtocolConfig, dataset: str) -> int:
    """Number of training classes a run of ``protocol`` on ``dataset`` sees (for the timing models' centres)."""
    config = protocol.train_config(dataset=dataset, method="ms", seed=0, name="probe")
    return training_class_count(config)
