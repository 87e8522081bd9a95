"""DGCRL study: the notebook's config, the paper's numbers, the variants and their run names, the
measurements on finished runs (Recall@K, best epoch, centre accuracy and correlation), the side-by-side timing
of the training step, and the computations behind the teaching figures (Eq. 8, the decorrelation toy)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.data import Subset

from dmlstudy import metrics as metric_functions
from dmlstudy.data import build_dataset, build_transforms
from dmlstudy.experiments.kit import StudyConfig, method_defaults, variant_name, with_reference
from dmlstudy.experiments.papers.numbers import numbers
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
from dmlstudy.rows import SHARED_VARIANTS
from dmlstudy.run.checkpoint_selection import best_epoch_censored, selection_evaluations
from dmlstudy.run.data import load_datasets, training_class_count
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.run.train import RunResult, TrainConfig, build_optimizer

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
    """DGCRL's keyword arguments and their defaults (:func:`~dmlstudy.experiments.kit.method_defaults`)."""
    return method_defaults(DGCRL)


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
    is chosen from (:func:`dmlstudy.run.checkpoint_selection.selection_evaluations`: validation classes after the warm-up when the
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


def run_rows(results: list[tuple[str, RunResult]], ks: Sequence[int], extra=None) -> pd.DataFrame:
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


# ----------------------------------------------------------------------------------------------
# α sweep (Fig. 3) and loss comparison (Table 3): per-run rows
# ----------------------------------------------------------------------------------------------
def alpha_runs(
    results: list[tuple[str, RunResult]], variants: Mapping[float, tuple[str, dict]], *, ks: Sequence[int], items: int
) -> pd.DataFrame:
    """One row per (dataset, α, seed): test Recall@K and the centres' accuracy on training images."""
    alpha_of = {name: alpha for alpha, (name, _) in variants.items()}
    return run_rows(
        results,
        ks,
        lambda variant, result: {"alpha": alpha_of[variant], "train accuracy": training_accuracy(result, items=items)},
    )


def alpha_means(runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`alpha_runs` averaged over seeds: one row per (dataset, α)."""
    return runs.groupby(["dataset", "alpha"], sort=True).mean(numeric_only=True).drop(columns="seed").reset_index()


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

    return run_rows(results, ks, extra)


def steps_per_epoch(result: RunResult) -> int:
    """Training steps of one epoch of the run (its ``steps_per_epoch`` or a full pass)."""
    config = result.config
    if config.steps_per_epoch:
        return int(config.steps_per_epoch)
    return len(load_datasets(config)["train"]) // (config.classes_per_batch * config.samples_per_class)


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
    """Median seconds of one training step (forward, loss, backward, the optimizer step of a run) per variant, measured
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
        # a run's own optimizer at the protocol's lr (its optimizer, head_lr and weight decay are TrainConfig's)
        optimizers[name] = build_optimizer(TrainConfig(lr=protocol.lr), models[name])[0]
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


def train_classes_of(protocol: ProtocolConfig, dataset: str) -> int:
    """Number of training classes a run of ``protocol`` on ``dataset`` sees (for the timing models' centres)."""
    config = protocol.train_config(dataset=dataset, method="ms", seed=0, name="probe")
    return training_class_count(config)
