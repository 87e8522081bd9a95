"""DGCRL's own part of notebook 40 (Zheng et al., Towards Optimal Fine Grained Retrieval via Decorrelated Centralized
Loss with Normalize-Scale Layer, AAAI 2019): its parameters, the per-run measurements its tables declare (the centres'
training accuracy and correlation), what no declaration can say (the α readings of the paper's Fig. 3, which prints
no numbers; the loss comparison's epochs to best and side-by-side seconds, the paper's Table 3 and speed-up) and its
figures (Eq. 8, the decorrelation toy, the α sweep, the loss curves); its tables and variants are ``dgcrl.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.data import Subset

from dmlstudy import plots
from dmlstudy.experiments import ablations, kit
from dmlstudy.findings.numbers import numbers
from dmlstudy.methods.dgcrl import (
    DGCRL,
    centre_accuracy,
    centre_orthogonality_loss,
    centre_softmax_loss,
    gram_schmidt_gradient,
    mean_abs_cosine,
    normalize_scale,
)
from dmlstudy.rows import method_label
from dmlstudy.run.checkpoint_selection import evaluation_column, selection_evaluations
from dmlstudy.run.data import load_datasets
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.run.train import RunResult
from dmlstudy.study.grids import mean_std_table
from dmlstudy.verdicts import censor, judge, paired_differences

COLUMN_DECIMALS = {"best R@1 (%)": 1, "s/epoch (run)": 2, "s/epoch (side by side)": 2, "s to best": 1}
STABLE_ALPHA = 16.0  # the paper's Fig. 3: R@K stable for α ≥ 16


@dataclass
class DGCRLStudy(kit.StudyConfig):
    """Parameters of ``notebooks/40_dgcrl.ipynb``: the protocol plus DGCRL's sweeps. Empty lists skip a table."""

    main_variants: list = field(default_factory=lambda: ["ms", "softmax", "dgcrl"])  # main table rows (all seeds)
    ablation_datasets: list = field(default_factory=lambda: ["synbirds"])  # datasets of the ablation tables
    ablation_seeds: list = field(default_factory=lambda: [0])  # seeds of the ablation tables
    alphas: list = field(default_factory=lambda: [1.0])  # α of the N-S sweep (Fig. 3: 1 … 256); 128 is always added
    lambdas: list = field(default_factory=list)  # λ of the Gram–Schmidt push (Table 2: 0, .1, .2, .4); 0.1 added
    losses: list = field(default_factory=lambda: ["triplet-ns"])  # Table 3: triplet-ns, lifted-ns, gcrl; dgcrl added
    decorrelations: list = field(default_factory=list)  # beside the default paper hook: code, none
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
        if self.timing_clock not in kit.CLOCKS:
            raise ValueError(f"parameter 'timing_clock': unknown {self.timing_clock!r}; valid: {sorted(kit.CLOCKS)}")
        for table in DECLARED.tables:  # an unknown row or choice fails here, before any training
            ablations.table_rows(DECLARED, table, self)

    def ablation_protocol(self) -> ProtocolConfig:
        """The protocol with the ablation seeds (the ablation tables run on ``ablation_datasets``)."""
        return self.protocol.with_seeds(self.ablation_seeds)


# ----------------------------------------------------------------------------------------------
# Per-run measurements the declaration's ``columns`` name: function(result, config)
# ----------------------------------------------------------------------------------------------
def training_accuracy(result: RunResult, config: DGCRLStudy) -> float:
    """Classification accuracy (%) of the run's centres on ``config.accuracy_items`` training images (Fig. 3, right)."""
    if not isinstance(result.method, DGCRL) or result.method.centres is None:
        raise TypeError(f"training_accuracy needs a DGCRL run with class centres, got {type(result.method).__name__}")
    train = kit.evaluation_split(result.config, "train")  # evenly spaced images, test-time transforms
    chosen = np.linspace(0, len(train) - 1, min(config.accuracy_items, len(train))).round().astype(int)
    subset = Subset(train, np.unique(chosen).tolist())
    return 100 * centre_accuracy(result.method, subset, batch_size=result.config.eval_batch_size)


def centre_correlation(result: RunResult, config: Any = None) -> float:
    """Mean |cos| between the run's final centres (as the loss uses them); NaN without centres."""
    method = result.method
    if not isinstance(method, DGCRL) or method.centres is None:
        return float("nan")
    with torch.no_grad():
        return float(mean_abs_cosine(method.effective_centres()))


DECLARED = ablations.declaration("dgcrl", config=DGCRLStudy, measurements=(training_accuracy, centre_correlation))


# ----------------------------------------------------------------------------------------------
# The α readings (Fig. 3 prints no numbers)
# ----------------------------------------------------------------------------------------------
def alpha_readings(runs: pd.DataFrame) -> list[str]:
    """Paper: poor for small α, stable for α ≥ 16. Checked per dataset by the study's rule on the per-seed R@1 of
    :func:`~dmlstudy.experiments.ablations.run_frame` (column ``α``): "α = default > the smallest α" (poor at small
    α: held), and "α = default ≈ α" for every other α ≥ 16 (stable: equivalent)."""
    reference = kit.method_defaults(DGCRL)["alpha"]
    runs = runs.assign(variant=runs["α"].map(lambda alpha: f"{alpha:g}"))
    sentences = []
    for dataset, group in runs.groupby("dataset"):
        alphas = sorted(set(group["α"]))
        if len(alphas) < 2 or reference not in alphas:
            sentences.append(f"{dataset}: fewer than two α or no α = {reference:g}, no direction to check.")
            continue

        def verdict(alpha, claimed=">", group=group, dataset=dataset):
            return judge(
                paired_differences(group, dataset, f"{reference:g}", f"{alpha:g}").differences, claimed=claimed
            )

        small = verdict(alphas[0])
        text = (
            f"{dataset}: R@1 at α = {reference:g} − α = {alphas[0]:g}: {small.interval_text()} → {small.text} "
            f"(the paper: poor at small α, i.e. held)"
        )
        stable = [alpha for alpha in alphas if alpha >= STABLE_ALPHA and alpha != reference]
        if stable:
            text += f"; α = {reference:g} − α ≥ {STABLE_ALPHA:g}: " + "; ".join(
                f"α = {a:g} {verdict(a, '≈').interval_text()} → {verdict(a, '≈').text}" for a in stable
            )
            text += " (the paper: stable, i.e. equivalent)"
        sentences.append(text + ".")
    return sentences


# ----------------------------------------------------------------------------------------------
# Losses at equal settings (Table 3) and training speed
# ----------------------------------------------------------------------------------------------
def loss_frame(results, config: DGCRLStudy, *, step_seconds: dict[str, float] | None = None) -> pd.DataFrame:
    """Per run of the ``losses`` table (:func:`~dmlstudy.experiments.ablations.run_frame`): the first epoch of its best
    R@1 among the evaluations its reported checkpoint is chosen from, the run's own seconds per epoch, and (given the
    side-by-side ``step_seconds`` per run name, :func:`~dmlstudy.experiments.kit.step_seconds`) seconds per epoch and
    training seconds to the best epoch."""
    frame = ablations.run_frame(DECLARED, "losses", results, config)
    rows = []
    for variant, result in results:
        evaluated = selection_evaluations(result.history, result.config.warmup_epochs)  # those the run chose from
        epoch, value = int(evaluated.idxmax()), float(evaluated.max())
        seconds = result.history.get("train_seconds")
        row = {"best epoch": epoch, "best R@1 (%)": 100 * value, "epochs run": int(result.history["epoch"].max())}
        row["s/epoch (run)"] = float(seconds.mean()) if seconds is not None else float("nan")
        if step_seconds and variant in step_seconds:
            c = result.config  # its steps per epoch: the run's own count, or a full pass over its training set
            steps = c.steps_per_epoch or len(load_datasets(c)["train"]) // (c.classes_per_batch * c.samples_per_class)
            row["s/epoch (side by side)"] = step_seconds[variant] * steps
            row["s to best"] = row["s/epoch (side by side)"] * epoch
        rows.append(row)
    return pd.concat([frame, pd.DataFrame(rows, index=frame.index)], axis=1)


def loss_table(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Mean ± std of :func:`loss_frame` per dataset and loss, the paper's Table 3 beside, and the speed readings."""
    spec = DECLARED.table("losses")
    label = spec.get("label", "setting")
    measured = [c for c in frame.columns if c.startswith("R@") or c in ("best epoch", "epochs run", *COLUMN_DECIMALS)]
    table = ablations.with_decimals(mean_std_table(frame, metrics=measured), COLUMN_DECIMALS)
    labels = dict(zip(frame["variant"], frame[label]))
    table.insert(2, label, [labels[v] for v in table["variant"]])
    paper = numbers(DECLARED.paper, spec["paper"]["table"])
    table["paper epochs"] = [paper[v][0] if v in paper else "–" for v in table[label]]
    table["paper R@1"] = [paper[v][1][0] if v in paper else "–" for v in table[label]]
    sentences = [loss_reading(table, dataset, frame=frame) for dataset in table["dataset"].unique()]
    return kit.without_numbers(table), sentences


def loss_reading(table: pd.DataFrame, dataset: str, *, frame: pd.DataFrame) -> str:
    """The paper's "20 epochs vs 100" and "5× faster than triplet" on ``dataset``: the claim "the faster loss's best
    epoch ≤ 1/speed-up of the slower's" (the sweep's reference against the ``speed`` row ``dgcrl.yaml`` declares),
    judged by the study's rule on the per-seed paired differences (epochs, margin 1 epoch), and by
    :func:`~dmlstudy.verdicts.censor` when runs reached the epoch cap still improving."""
    spec = DECLARED.table("losses")
    fast, slow = spec["sweep"]["reference"], spec["paper_specific"]["speed"]["slower"]
    speedup, paper = (
        numbers(DECLARED.paper, spec["paper_specific"]["speed"]["paper"]),
        numbers(DECLARED.paper, spec["paper"]["table"]),
    )
    here = table[table["dataset"] == dataset].set_index(spec["label"])
    name = dict(zip(here.index, here["variant"]))
    epochs_run = int(here["epochs run_mean"].max())
    at_cap = [v for v in here.index if here.loc[v, "best epoch_mean"] >= epochs_run]
    text = (
        f"{dataset}: best R@1 reached at epoch "
        + ", ".join(f"{v} {here.loc[v, 'best epoch_mean']:.1f}" for v in here.index)
        + f" (of {epochs_run}; {len(at_cap)}/{len(here)} losses peak at the last epoch, so their epochs-to-best is "
        "capped by the budget)"
    )
    if slow in here.index:
        ratio = here.loc[slow, "best epoch_mean"] / here.loc[fast, "best epoch_mean"]
        paired = paired_differences(frame, dataset, name[slow], name[fast], "best epoch", first_scale=1 / speedup)
        speed = censor(judge(paired.differences), **paired.censoring)
        text += (
            f". {slow} needs {ratio:.1f}× the epochs of {fast} (paper {paper[slow][0]}/{paper[fast][0]} = "
            f"{paper[slow][0] / paper[fast][0]:.1f}×); {slow}'s best epoch / "
            f"{speedup:.0f} − {fast}'s: {speed.interval_text('epochs')} → {speed.text}"
        )
        if "s to best_mean" in here.columns and np.isfinite(here.loc[fast, "s to best_mean"]):
            per_epoch = here.loc[slow, "s/epoch (side by side)_mean"] / here.loc[fast, "s/epoch (side by side)_mean"]
            text += (
                f"; with side-by-side step times ({slow}/{fast} per epoch {per_epoch:.2f}×) training time to the best "
                f"epoch is {here.loc[slow, 's to best_mean'] / here.loc[fast, 's to best_mean']:.1f}× (the paper "
                f"claims {speedup:.0f}×)"
            )
    return text + f". Highest R@1: {max(here.index, key=lambda v: here.loc[v, 'R@1_mean'])} (paper: {fast})."


# ----------------------------------------------------------------------------------------------
# Teaching figures: Eq. 8, the decorrelation toy, the α sweep, the loss curves
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
    """Three centres in 3-D (so they can become orthogonal), started strongly correlated, trained by SGD under a
    decorrelation variant. With ``with_loss`` the centres also get the margin-softmax gradient (α = 2, m = 0.5) of 40
    fixed random features (no class structure, so the loss alone barely separates them); without it only the
    decorrelation acts (the ``paper`` push, or the ``code`` regulariser and clamp). Returns the centres at every
    step (``steps + 1`` × 3 × 3) and their mean |cos| per step."""
    generator = torch.Generator().manual_seed(seed)
    features = normalize_scale(torch.randn(40, 3, generator=generator), alpha=2.0)
    labels = torch.arange(40) % 3
    centres = torch.nn.Parameter(torch.ones(3, 3) + 0.3 * torch.randn(3, 3, generator=generator))
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
    panels = [("start", next(iter(alone.values()))["centres"][0]), *[(n, r["centres"][-1]) for n, r in alone.items()]]
    for index, (title, centres) in enumerate(panels):
        axis = figure.add_subplot(1, len(panels) + 1, index + 1, projection="3d")
        unit = centres / np.linalg.norm(centres, axis=1, keepdims=True)
        for k, vector in enumerate(unit):
            axis.quiver(0, 0, 0, *vector, color=f"C{k}", linewidth=2, arrow_length_ratio=0.15)
        axis.set(xlim=(-1, 1), ylim=(-1, 1), zlim=(-1, 1))
        for ticks in (axis.set_xticks, axis.set_yticks, axis.set_zticks):  # three ticks: nine crowd a small 3-D box
            ticks([-1, 0, 1])
        axis.set_title(f"{title}\nmean |cos| {float(mean_abs_cosine(torch.as_tensor(centres))):.2f}", fontsize=9)
        axis.tick_params(labelsize=7, pad=0)
    axis = figure.add_subplot(1, len(panels) + 1, len(panels) + 1)
    for name, run in {**alone, **with_loss}.items():
        axis.plot(run["abs_cos"], label=name, linestyle="--" if name in alone else "-")
    axis.set(xlabel="SGD step", ylabel="mean |cos(w_i, w_j)|", title="centre correlation")
    axis.grid(alpha=0.3)
    plots.integer_ticks(axis)
    figure.tight_layout()
    plots.legend_outside(figure, [axis])
    return figure


def alpha_figure(runs: pd.DataFrame) -> plt.Figure:
    """Paper Fig. 3 on our data: test Recall@K (left) and training accuracy (right) against α (log₂ axis), averaged
    over the seeds of :func:`~dmlstudy.experiments.ablations.run_frame` (Recall@K as fractions, accuracy in %).
    With fewer than :data:`dmlstudy.plots.MIN_SWEEP_VALUES` values of α the points are not joined."""
    recall_columns = [c for c in runs.columns if c.startswith("R@")]
    frame = runs.groupby(["dataset", "α"], sort=True)[[*recall_columns, "train accuracy"]].mean().reset_index()
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    alphas = sorted(set(frame["α"]))
    linestyle = plots.sweep_linestyle(alphas)
    for dataset, group in frame.groupby("dataset"):
        dashes = linestyle if linestyle == "none" or dataset == frame["dataset"].iloc[0] else "--"
        for index, column in enumerate(recall_columns):
            colour = plots.PALETTE[index % len(plots.PALETTE)]
            left.plot(group["α"], 100 * group[column], ls=dashes, marker="o", color=colour, label=f"{column} {dataset}")
        label = f"train accuracy {dataset}"
        right.plot(group["α"], group["train accuracy"], ls=dashes, marker="s", color="k", label=label)
    few = "" if linestyle == "-" else f" (only {len(alphas)} α value{'s' if len(alphas) > 1 else ''}: points, no curve)"
    panels = ((left, "test Recall@K", "Recall@K (%)"), (right, "training accuracy (centres)", "accuracy (%)"))
    for axis, title, ylabel in panels:
        axis.set_xscale("log", base=2)
        axis.set(xlabel="α (N-S scale)", ylabel=ylabel, title=title + few)
        plots.plain_log_ticks(axis, alphas)
        axis.grid(alpha=0.3)
    figure.tight_layout()
    plots.legend_outside(figure)
    return figure


def loss_curves(results: list[tuple[str, RunResult]], *, metric: str = "R@1") -> plt.Figure:
    """``metric`` per evaluated epoch of each loss (validation classes when the runs have them, else test; first
    seed per dataset and loss), each in its method's style (:func:`dmlstudy.plots.method_style`)."""
    datasets = sorted({result.config.dataset for _, result in results})
    figure, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.4), squeeze=False)
    seen: set[tuple[str, str]] = set()
    for variant, result in sorted(results, key=lambda item: item[1].config.seed):
        if (result.config.dataset, variant) in seen:
            continue
        seen.add((result.config.dataset, variant))
        axis = axes[0, datasets.index(result.config.dataset)]
        column, classes = evaluation_column(result.history, metric)
        history, style = result.history.dropna(subset=[column]), plots.method_style(variant)
        line = {"marker": style.marker, "color": style.colour, "label": method_label(variant)}
        axis.plot(history["epoch"], 100 * history[column], **line)
        axis.set(xlabel="epoch", ylabel=f"{classes} {metric} (%)", title=result.config.dataset)
    for axis in axes[0]:
        axis.grid(alpha=0.3)
        plots.integer_ticks(axis)
    figure.tight_layout()
    plots.legend_outside(figure)
    return figure
