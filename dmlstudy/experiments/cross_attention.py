"""Notebook 30 (cross-image attention, seed 003): the study config, the runs, the tables and the figures.

``notebooks/30_cross_attention.ipynb`` calls only the functions here. Run names follow the protocol,
``<dataset>-<variant>-seed<seed>``: the plain MS baseline is the variant ``ms`` and the method with every
default (N = 6 shared blocks) is ``cross_attention`` (the comparison notebook reuses both). Other variants
are named from what differs from the defaults (:func:`variant`), so equal configurations share runs.

Decisions (stated in the notebook too):

* The N = 0 row of the N × n grid is the ``ms`` run: with no blocks the method is the MS baseline (same
  parameters created in the same order, same loss on s⁰; tested in ``tests/test_cross_attention.py``).
* sⁿ re-scoring is evaluated all-against-all on a seeded random subset of the test set (``rescoring_subset``
  images; the query itself excluded), since it costs one hierarchy per pair. Its R@1 is therefore higher
  than the full test set's (a smaller gallery); compare columns within the grid, not with the main table.
* Attention maps: for an image x, the weights over x's locations when x is conditioned on image a (same
  class) and on image b (another class), blocks 2, 4, 6, and their difference — "how a map changes when
  the conditioning image changes". Maps are drawn on the test-transformed image the network saw.
* Local parts: the query location of an image is its interior feature-map cell with the largest L2 norm
  (the most activated part; border cells are left out, zero padding dominates them); each other test image
  contributes its most similar cell (cosine of backbone features
  E(I)ₓᵧ, as the paper's Sec. 4.3.2); the top images are shown as crops of two cells around that cell.
* The "larger backbone without blocks" is timm's ``test_resnet`` at output stride 16 (a 4 × 4 grid like
  ours): the paper pairs ResNet-50 + blocks (27.7M) with a ResNet-101 baseline (45.3M).
* The paper's numbers are on real data with an ImageNet-pretrained ResNet-50 at 224 px and d = 512; they
  orient the reader and are not targets. SynBirds stands beside CUB and Glyphs beside Cars. Figure 3's
  values exist only as a plot in the paper; its reading (caption vs text) is quoted instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from matplotlib.patches import FancyBboxPatch, Rectangle

from dmlstudy import metrics as metric_functions
from dmlstudy import plots
from dmlstudy.experiments.kit import (
    arrow,
    as_grid,
    box,
    device_of,
    lookup,
    paper_column,
    paper_dataset,
    run_variants,
    without_numbers,
)
from dmlstudy.experiments.papers import numbers
from dmlstudy.experiments.protocol import ProtocolConfig, StudyConfig, mean_std_table, results_frame
from dmlstudy.methods import EVAL_BATCH_SIZE
from dmlstudy.methods.cross_attention import (
    AttentionRecorder,
    CrossAttention,
    conditional_retrieval,
    feature_maps,
    subset_indices,
)
from dmlstudy.plots import CORRECT, OVERLAY_CMAP, WRONG, seen_image
from dmlstudy.report import mean_std_text
from dmlstudy.run_data import load_datasets
from dmlstudy.train import RunResult
from dmlstudy.verdicts import effect_sentence, paired_differences

# ----------------------------------------------------------------------------------------------
# The paper's numbers (Kotovenko et al., CVPR 2023), from papers.yaml, in %.
# ----------------------------------------------------------------------------------------------
PAPER_TABLE1 = numbers("cross_attention", "TABLE1")  # paper dataset → variant → (R@1, R@2, NMI)
PAPER_PARAMETERS = numbers("cross_attention", "PARAMETERS")  # model → (parameters in millions, R@1 CUB, R@1 Cars)
PAPER_OVERHEAD_AT_128 = numbers(
    "cross_attention", "OVERHEAD_AT_128"
)  # training time per batch of 128, with blocks / without
PAPER_BLOCKS = numbers("cross_attention", "BLOCKS")  # N of every experiment in the paper
PAPER_FIGURE3_CAPTION = numbers("cross_attention", "FIGURE3_CAPTION")
PAPER_FIGURE3_TEXT = numbers("cross_attention", "FIGURE3_TEXT")


@dataclass
class CrossAttentionStudy(StudyConfig):
    """Parameters of ``notebooks/30_cross_attention.ipynb``: the protocol plus the method's ablations."""

    ablation_datasets: list = field(
        default_factory=lambda: ["synbirds"]
    )  # datasets of the N × n grid, the options and the parameter table
    ablation_seeds: list = field(default_factory=lambda: [0])  # seeds of the ablations
    block_counts: list = field(
        default_factory=lambda: [0, 6]
    )  # trained N, the rows of the grid (N 0: the ms run; N > 0: the cross_attention runs with N blocks)
    rescoring_subset: int = 100  # test images scored all-against-all with sⁿ (0: the whole test set)
    options: list = field(default_factory=list)  # extra variants: independent, residual, unconditional_loss
    larger_backbone: str = "test_resnet"  # MS without blocks on this (bigger) backbone; "" skips the table
    attention_blocks: list = field(default_factory=lambda: [2, 4, 6])  # blocks whose attention maps are drawn
    attention_examples: int = 2  # image triples (x, a same class, b other class) in the attention figure
    part_queries: int = 2  # query images of the local-part figure (one location each)
    part_neighbours: int = 6  # most similar locations shown per query

    def ablation_protocol(self) -> ProtocolConfig:
        """The protocol with the ablation seeds."""
        return self.protocol.with_seeds(self.ablation_seeds)


# ----------------------------------------------------------------------------------------------
# Variants and runs
# ----------------------------------------------------------------------------------------------
OPTION_KWARGS = {
    "independent": {"shared_blocks": False},
    "residual": {"residual": True},
    "unconditional_loss": {"unconditional_loss": True},
}
SHARED_RUNS = ("ms", "cross_attention")  # reused by the comparison notebook: trained exactly as the protocol says
FINAL_EVALUATION_ONLY = {"eval_every": 1_000_000}  # ablation-only runs: test metrics after the last epoch only


def method_defaults() -> dict[str, Any]:
    """The method's keyword arguments and their defaults (from the class signature)."""
    skip = {"backbone", "embedding_dim", "num_classes"}
    return {
        name: spec.default
        for name, spec in inspect.signature(CrossAttention.__init__).parameters.items()
        if name not in skip and spec.default is not inspect.Parameter.empty
    }


def variant(*, explicit: Sequence[str] = (), **method_kwargs: Any) -> tuple[str, dict[str, Any]]:
    """``(name, spec)`` of a cross-attention variant for :meth:`ProtocolConfig.grid`, named from what differs
    from the defaults; ``num_blocks=0`` is the ``ms`` baseline (the same model, see the module docstring).
    Arguments named in ``explicit`` stay in the spec and the name even at their default: a sweep's points
    must say their value, since the plain ``cross_attention`` row takes the study's tuned values."""
    defaults = method_defaults()
    unknown = sorted(set(method_kwargs) - set(defaults))
    if unknown:
        raise KeyError(f"variant: unknown cross-attention arguments {unknown}; valid: {sorted(defaults)}")
    kwargs = {key: value for key, value in sorted(method_kwargs.items()) if defaults[key] != value or key in explicit}
    if kwargs.get("num_blocks") == 0:
        return "ms", {"method": "ms"}
    spec: dict[str, Any] = {"method": "cross_attention"}
    if kwargs:
        spec["method_kwargs"] = kwargs
    return "-".join(["cross_attention", *(f"{key}={value}" for key, value in kwargs.items())]), spec


def grid_variants(block_counts: Sequence[int]) -> dict[int, tuple[str, dict]]:
    """Trained N → variant (``cross_attention-num_blocks=N``, N explicit even at the paper's 6, because the
    ``cross_attention`` row takes its tuned N); N = 0 is the ``ms`` run."""
    counts = sorted({int(n) for n in block_counts})
    if any(n < 0 for n in counts):
        raise ValueError(f"block_counts must be ≥ 0, got {counts}")
    return {n: variant(num_blocks=n, explicit=("num_blocks",)) for n in counts}


def option_variants(options: Sequence[str]) -> dict[str, tuple[str, dict]]:
    """The named options (``independent``, ``residual``, ``unconditional_loss``) at N = 6, plus the default."""
    unknown = sorted(set(options) - set(OPTION_KWARGS))
    if unknown:
        raise KeyError(f"options: unknown {unknown}; valid: {sorted(OPTION_KWARGS)}")
    return {
        "default (shared, no residual, MS on sᴺ)": variant(),
        **{name: variant(**OPTION_KWARGS[name]) for name in options},
    }


def larger_backbone_variant(name: str) -> tuple[str, dict]:
    """MS without blocks on a bigger backbone (ResNets at output stride 16, a 4 × 4 grid at 64 px)."""
    overrides: dict[str, Any] = {"backbone": name}
    if "resnet" in name:
        overrides["output_stride"] = 16
    return f"ms-backbone={name}", {"method": "ms", **overrides}


def ablation_grid(variants: Mapping[Any, tuple[str, dict]]) -> dict[str, dict]:
    """:func:`~dmlstudy.experiments.kit.as_grid`, with the ablation-only runs evaluated once.

    Runs only the ablations use (not ``ms`` / ``cross_attention``) are evaluated after their last epoch only:
    evaluation does not change training, so their final metrics are the same, and on 2 CPU cores a test-set
    evaluation per epoch costs about as much as the epoch itself.
    """
    return {
        name: spec if name in SHARED_RUNS else {**spec, **FINAL_EVALUATION_ONLY}
        for name, spec in as_grid(variants).items()
    }


def parameter_variants(larger_backbone: str) -> dict[str, dict]:
    """MS, MS + blocks (``cross_attention``) and MS on ``larger_backbone``, ready for :meth:`ProtocolConfig.grid`."""
    return ablation_grid(
        {
            "ms": ("ms", {"method": "ms"}),
            "cross_attention": variant(),
            "larger": larger_backbone_variant(larger_backbone),
        }
    )


def run_block_grid(
    protocol: ProtocolConfig, block_counts: Sequence[int], *, dataset: str
) -> dict[int, list[RunResult]]:
    """Train (or load) one model per trained N (and seed of ``protocol``) on ``dataset``: ``{N: [runs]}``."""
    variants = grid_variants(block_counts)
    results = run_variants(protocol, ablation_grid(variants), datasets=[dataset])
    return {count: [result for name, result in results if name == variants[count][0]] for count in variants}


def main_table(results: list[tuple[str, RunResult]]) -> tuple[pd.DataFrame, list[str]]:
    """MS vs cross-attention (evaluated with s⁰) per dataset: R@1, R@2, NMI (mean ± std, %), seconds per epoch,
    the paper's Table 1 numbers beside, and one computed sentence per dataset."""
    frame = results_frame(results)
    table = mean_std_table(frame, metrics=["R@1", "R@2", "NMI", "seconds_per_epoch"])
    sentences = []
    for dataset in dict.fromkeys(table["dataset"]):
        paper = PAPER_TABLE1.get(paper_dataset(dataset), {})
        for metric, index in (("R@1", 0), ("NMI", 2)):
            ours = paired_differences(frame, dataset, "cross_attention", "ms", metric)
            values = [paper.get(v, (None,) * 3)[index] for v in ("cross_attention", "ms")] if paper else [None, None]
            gain = values[0] - values[1] if None not in values else None
            sentences.append(
                effect_sentence(
                    f"{dataset}: cross-attention − MS, {metric}",
                    ours=ours,
                    paper=gain,
                    unit=f"{metric} points",
                )
            )
        slow = lookup(table, dataset, "cross_attention", "seconds_per_epoch")[0]
        base = lookup(table, dataset, "ms", "seconds_per_epoch")[0]
        sentences.append(
            f"{dataset}: training seconds per epoch (data loading included) with the blocks / without = "
            f"{slow / base:.2f} (the paper: {PAPER_OVERHEAD_AT_128:.2f} per batch of 128 with a ResNet-50, "
            f"whose backbone dominates the step; ours is small and the machine may be shared)."
        )
    shown = paper_column(
        table,
        PAPER_TABLE1,
        label=lambda name: f"paper R@1 / R@2 / NMI ({name})",
        show=lambda values: " / ".join("–" if v is None else f"{v:.1f}" for v in values),
    )
    return without_numbers(shown), sentences


def rescoring_grid(
    results: Mapping[int, list[RunResult]], *, subset: int, seed: int = 0, ks: Sequence[int] = (1,)
) -> pd.DataFrame:
    """The paper's Figure 3 on our data: R@1 (%) of sⁿ, all against all on a seeded test subset, for every
    trained N (rows) and inference level n ≤ N (columns), averaged over the runs (seeds) of each N; the last
    column is the full-test-set R@1 of s⁰ from the run's own evaluation.

    ``results`` maps N to its runs; N = 0 runs are MS baselines, scored at level 0 by their embeddings.
    """
    rows = []
    for count, runs in sorted(results.items()):
        scores: dict[int, list[float]] = {}
        for result in runs:
            for level, value in level_recalls(result, subset=subset, seed=seed, ks=ks).items():
                scores.setdefault(level, []).append(100.0 * value)
        rows.append(
            {
                "trained N": count,
                **{f"n={n}": float(np.mean(v)) for n, v in sorted(scores.items())},
                "full test R@1 (s⁰)": 100.0 * float(np.mean([r.metrics["R@1"] for r in runs])),
                "runs": len(runs),
            }
        )
    grid = pd.DataFrame(rows).set_index("trained N")
    levels = sorted((c for c in grid.columns if c.startswith("n=")), key=lambda c: int(c[2:]))
    return grid[[*levels, "full test R@1 (s⁰)", "runs"]]


def level_recalls(result: RunResult, *, subset: int, seed: int = 0, ks: Sequence[int] = (1,)) -> dict[int, float]:
    """R@1 of every level n ≤ N of one run on the seeded test subset (fractions)."""
    labels = np.asarray(result.embeddings["labels"])
    chosen = subset_indices(labels, subset, seed=seed)
    method = result.method
    if not isinstance(method, CrossAttention):  # the N = 0 row: the ms baseline's own embeddings
        values = metric_functions.retrieval_metrics(result.embeddings["embeddings"][chosen], labels[chosen], ks=ks)
        return {0: values["R@1"]}
    test = load_datasets(result.config)["query"]
    maps = feature_maps(method, torch.utils.data.Subset(test, chosen.tolist()), device=device_of(method))
    return {
        level: values["R@1"] for level, values in conditional_retrieval(method, maps, labels[chosen], ks=ks).items()
    }


def grid_readings(grid: pd.DataFrame) -> list[str]:
    """Computed sentences: does n > 0 help at test time (caption vs text), and how R@1 depends on N."""
    levels = [c for c in grid.columns if c.startswith("n=")]
    better, changes, last = 0, [], []
    trained = [n for n in grid.index if n > 0]
    for count in trained:
        base = grid.loc[count, "n=0"]
        later = [grid.loc[count, c] for c in levels if int(c[2:]) > 0 and not np.isnan(grid.loc[count, c])]
        better += int(max(later) > base)
        changes.extend(v - base for v in later)
        last.append(grid.loc[count, f"n={count}"] - base)
    sentences = []
    if trained:
        verdict = (
            "on our data sⁿ with n = N helps at test time, as the paper's text says (not its caption)"
            if np.mean(last) > 0
            else "on our data sⁿ with n = N hurts at test time, as the paper's caption says (not its text)"
        )
        sentences.append(
            f"Test-time level: some n > 0 beat s⁰ in {better} of {len(trained)} trained models; over all n > 0 the mean change is "
            f"{np.mean(changes):+.2f} R@1 points and at n = N it is {np.mean(last):+.2f} → {verdict}. "
            f"Caption: “{PAPER_FIGURE3_CAPTION}”; text: “{PAPER_FIGURE3_TEXT}”."
        )
    full = grid["full test R@1 (s⁰)"]
    best = int(full.idxmax())
    sentences.append(
        f"Trained N: the best full-test R@1 with s⁰ is at N = {best} ({full.max():.1f}); N = 0 (MS) gives {full.get(0, float('nan')):.1f}, "
        f"largest N = {int(full.index.max())} gives {full.iloc[-1]:.1f} (the paper: gains saturate around 6–8 blocks, best N = {PAPER_BLOCKS}; "
        f"{'single seed, no noise estimate' if int(grid['runs'].max()) < 2 else 'mean over seeds'})."
    )
    return sentences


def grid_heatmap(grid: pd.DataFrame, *, title: str = "") -> plt.Figure:
    """The N × n grid as a heat map (R@1 %, blank where n > N)."""
    levels = [c for c in grid.columns if c.startswith("n=")]
    values = grid[levels].to_numpy(dtype=float)
    figure, axis = plt.subplots(figsize=(1.0 + 0.75 * len(levels), 0.9 + 0.5 * len(grid)))
    image = axis.imshow(np.ma.masked_invalid(values), cmap="viridis", aspect="auto")
    for (row, column), value in np.ndenumerate(values):
        if not np.isnan(value):
            axis.text(
                column,
                row,
                f"{value:.1f}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if value < np.nanmean(values) else "black",
            )
    axis.set(
        xticks=range(len(levels)),
        xticklabels=[c[2:] for c in levels],
        yticks=range(len(grid)),
        yticklabels=[str(n) for n in grid.index],
        xlabel="inference level n (sⁿ)",
        ylabel="trained blocks N",
        title=title or "R@1 (%) of sⁿ on a test subset",
    )
    figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04)
    figure.tight_layout()
    return figure


def options_table(
    results: list[tuple[str, RunResult]], variants: Mapping[str, tuple[str, dict]]
) -> tuple[pd.DataFrame, list[str]]:
    """The options at N = 6 against the default (R@1, NMI; mean ± std), one sentence per option."""
    labels = {name: label for label, (name, _) in variants.items()}
    frame = results_frame(results)
    table = mean_std_table(frame, metrics=["R@1", "NMI"])
    table.insert(1, "setting", [labels.get(v, v) for v in table["variant"]])
    sentences = []
    default = variant()[0]
    for dataset in dict.fromkeys(table["dataset"]):
        for label, (name, _) in variants.items():
            if name != default:
                ours = paired_differences(frame, dataset, name, default)
                sentences.append(effect_sentence(f"{dataset}: {label} − default", ours=ours, paper=None))
    return table[[c for c in table.columns if not c.endswith(("_mean", "_std"))]], sentences


def parameter_table(results: list[tuple[str, RunResult]], *, larger: str) -> tuple[pd.DataFrame, list[str]]:
    """Parameters (training and inference) and R@1 of MS, MS + blocks, and MS on the larger backbone."""
    frame = results_frame(results)
    table = mean_std_table(frame, metrics=["R@1"])
    rows = []
    models = {
        "ms": "MS (protocol backbone)",
        "cross_attention": "MS + 6 cross-attention blocks",
        larger: "MS, larger backbone, no blocks",
    }
    for name, label in models.items():
        result = next((r for v, r in results if v == name), None)
        if result is None:
            continue
        method = result.method
        blocks = sum(p.numel() for p in method.blocks.parameters()) if isinstance(method, CrossAttention) else 0
        total = sum(p.numel() for p in method.parameters())
        row = {
            "model": label,
            "backbone": result.config.backbone,
            "parameters (training)": total,
            "parameters (inference)": total - blocks,
        }
        for dataset in dict.fromkeys(table["dataset"]):
            row[f"R@1 {dataset}"] = mean_std_text(*lookup(table, dataset, name))
        rows.append(row)
    shown = pd.DataFrame(rows)
    sentences = []
    if len(rows) == 3:
        ca_params, big_params = rows[1]["parameters (training)"], rows[2]["parameters (training)"]
        for dataset in dict.fromkeys(table["dataset"]):
            paper = (
                PAPER_PARAMETERS["ResNet-50 + 6 blocks"][1 if paper_dataset(dataset) == "CUB" else 2]
                - PAPER_PARAMETERS["ResNet-101, MS, no blocks"][1 if paper_dataset(dataset) == "CUB" else 2]
            )
            sentences.append(
                effect_sentence(
                    f"{dataset}: MS + blocks ({ca_params / 1e6:.2f}M) − larger backbone ({big_params / 1e6:.2f}M)",
                    ours=paired_differences(frame, dataset, "cross_attention", larger),
                    paper=paper,
                )
            )
    return shown, sentences


def gradient_variants(block_counts: Sequence[int] = (1, 2, 6)) -> dict[str, tuple[str, dict]]:
    """MS, the default method at several N, and the two options that give φ a direct path to the loss."""
    variants = {"MS (no blocks)": ("ms", {"method": "ms"})}
    variants.update({f"N = {n}": variant(num_blocks=int(n)) for n in block_counts if int(n) > 0})
    variants["N = 6, residual"] = variant(residual=True)
    variants["N = 6, + MS on s⁰"] = variant(unconditional_loss=True)
    return variants


def initial_gradients(
    protocol: ProtocolConfig, *, dataset: str, variants: Mapping[str, tuple[str, dict]], seed: int = 0
) -> pd.DataFrame:
    """‖∂L/∂W‖ of the test-time embedding layer φ and of the first convolution at initialisation, on one
    class-balanced training batch, per variant (same seed, so the same backbone and φ weights).

    In the paper's block φ⁰ reaches the loss only as the *query* of level 1, whose output is the query of
    level 2, and so on: each level passes the gradient through the attention logits, which are small at
    initialisation (unit-norm q̂, 1/√d), so the test-time embedding layer may receive almost nothing.
    """
    from dmlstudy.data import ClassBalancedBatchSampler
    from dmlstudy.run_model import build_model

    train = load_datasets(protocol.train_config(dataset=dataset, seed=seed, name="ms", method="ms"))["train"]
    sampler = ClassBalancedBatchSampler(
        train.labels,
        classes_per_batch=protocol.classes_per_batch,
        samples_per_class=protocol.samples_per_class,
        num_batches=1,
        seed=seed,
    )
    indices = next(iter(sampler))
    torch.manual_seed(seed)
    images = torch.stack([train[i][0] for i in indices])
    labels = torch.as_tensor(np.asarray(train.labels)[indices])
    rows = []
    for label, (name, spec) in variants.items():
        config = protocol.train_config(dataset=dataset, seed=seed, name=name, **spec)
        method = build_model(config, train.num_classes).train()
        loss, _ = method.loss(images, labels)
        loss.backward()
        first_conv = next(  # the first trained convolution (a stem-cached backbone's stem is frozen)
            m for m in method.backbone.modules() if isinstance(m, torch.nn.Conv2d) and m.weight.requires_grad
        )
        rows.append(
            {
                "variant": label,
                "loss": float(loss.detach()),
                "‖∂L/∂W_φ‖": float(method.embedding.weight.grad.norm()),
                "‖∂L/∂W_conv1‖": float(first_conv.weight.grad.norm()),
            }
        )
    return pd.DataFrame(rows).set_index("variant")


def gradient_reading(table: pd.DataFrame) -> str:
    """Computed sentence: how much gradient reaches φ with the paper's block, relative to MS."""
    base = table.loc["MS (no blocks)", "‖∂L/∂W_φ‖"]
    deepest = max(
        (label for label in table.index if label.startswith("N = ") and "," not in label),
        key=lambda label: int(label.split()[-1]),
    )
    ratio = table.loc[deepest, "‖∂L/∂W_φ‖"] / base
    fixes = ", ".join(f"{label}: {table.loc[label, '‖∂L/∂W_φ‖'] / base:.2g}×" for label in table.index if "," in label)
    return (
        f"At initialisation the test-time layer φ receives {ratio:.2g}× the gradient of MS with {deepest} "
        f"({'vanishing' if ratio < 1e-3 else 'comparable' if ratio > 0.1 else 'attenuated'}); with a direct path: {fixes}."
    )


# ----------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------
def hierarchy_diagram(*, levels: int = 3, channels: int = 128, grid: int = 4, embedding_dim: int = 128) -> plt.Figure:
    """The hierarchy of Eq. 4 for one pair (i, j): each level of image i attends over E_i (keys/values, blue)
    with the previous level of image j as its query (orange), and vice versa; sᴺ compares the last pair."""
    figure, axis = plt.subplots(figsize=(10, 1.9 + 0.95 * levels))
    top = 0.9 + levels
    axis.set(xlim=(0, 10), ylim=(-0.55, top + 1.0))
    axis.axis("off")
    columns = {"i": 3.05, "j": 6.95}  # centres of the two embedding columns
    memories = {"i": 0.75, "j": 9.25}  # centres of the feature-map boxes, outside the columns
    width = 2.7
    for name, x in columns.items():
        other = "j" if name == "i" else "i"
        side = memories[name]
        axis.add_patch(
            FancyBboxPatch(
                (side - 0.55, 0.45), 1.1, top - 0.45, boxstyle="round,pad=0.05", facecolor="#c6dbef", edgecolor="0.3"
            )
        )
        axis.text(
            side,
            (top + 0.45) / 2,
            f"E_{name}\n{grid}×{grid}×{channels}\n\nLN,\nthen\nK, V\n(once)",
            ha="center",
            va="center",
            fontsize=8,
        )
        box(axis, (x, 0.9), f"φ⁰({name}) = Linear(avgpool E_{name})", width=width, height=0.55, colour="#e5f5e0")
        start, edge = (side + 0.55, x - width / 2) if name == "i" else (side - 0.55, x + width / 2)
        arrow(axis, (start, 0.9), (edge, 0.9), colour="0.35")
        for level in range(1, levels + 1):
            y = 0.9 + level
            box(
                axis,
                (x, y),
                f"φ{_sup(level)}({name}|{other}) = CA(φ{_sup(level - 1)}({other}|{name}), E_{name}, E_{name})",
                width=width,
                height=0.55,
            )
            edge = x - width / 2 if name == "i" else x + width / 2
            arrow(axis, (side + (0.55 if name == "i" else -0.55), y), (edge, y), colour="#3182bd", linestyle=":")
    inner_i, inner_j = columns["i"] + width / 2, columns["j"] - width / 2
    for level in range(1, levels + 1):  # queries cross over: level n of i is conditioned on level n − 1 of j
        y = 0.9 + level
        arrow(axis, (inner_j, y - 1.0), (inner_i, y), colour="#e6550d")
        arrow(axis, (inner_i, y - 1.0), (inner_j, y), colour="#e6550d")
    axis.text(
        5.0,
        top + 0.55,
        f"s{_sup(levels)}(i, j) = cos(φ{_sup(levels)}(i|j), φ{_sup(levels)}(j|i))  →  Multi-Similarity loss",
        ha="center",
        fontsize=9.5,
        color="#a50f15",
    )
    axis.text(
        5.0,
        -0.3,
        "grey: average pooling;  orange: the query q̂ = the OTHER image's previous level, normalised;  "
        f"blue dotted: keys and values from the image's own feature map;  d = {embedding_dim}",
        ha="center",
        va="center",
        fontsize=7.5,
    )
    axis.set_title(
        "Training only — a B × B × d tensor per level for all ordered pairs of the batch; test time uses φ⁰ alone",
        fontsize=9,
    )
    return figure


def _sup(number: int) -> str:
    return str(number).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


def attention_triples(labels: np.ndarray, count: int, *, seed: int = 0) -> list[tuple[int, int, int]]:
    """``count`` seeded triples (x, a, b): a from x's class, b from another class."""
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    triples = []
    for x in rng.permutation(len(labels)):
        same = np.flatnonzero((labels == labels[x]) & (np.arange(len(labels)) != x))
        other = np.flatnonzero(labels != labels[x])
        if len(same) and len(other):
            triples.append((int(x), int(rng.choice(same)), int(rng.choice(other))))
        if len(triples) == count:
            break
    return triples


def attention_figure(
    method: CrossAttention, dataset, triples: Sequence[tuple[int, int, int]], *, blocks: Sequence[int] = (2, 4, 6)
) -> plt.Figure:
    """For each triple (x, a, b): Attn over x's locations at the given blocks when x is conditioned on a (top),
    on b (bottom), and their difference (middle, red = more weight when conditioned on a). Each panel is scaled
    by its own largest value (titles give it; uniform attention is 1/hw); two colourbars give the scaled units."""
    blocks = [n for n in blocks if 1 <= n <= method.num_blocks]
    if not blocks:
        raise ValueError(f"attention_figure: none of the blocks is in 1..{method.num_blocks}")
    figure, axes = plt.subplots(
        3 * len(triples), len(blocks) + 1, figsize=(1.7 * (len(blocks) + 1), 1.75 * 3 * len(triples)), squeeze=False
    )
    device = device_of(method)
    overlays = {}  # is-difference → the last overlay drawn with that scale (for the colourbars)
    for example, (x, a, b) in enumerate(triples):
        images = torch.stack([dataset[i][0] for i in (x, a, b)]).to(device)
        was_training = method.training
        method.eval()
        with torch.no_grad(), AttentionRecorder(method) as recorder:
            maps = method.backbone(images)
            method.conditional_embeddings(maps, num_levels=max(blocks))
        method.train(was_training)
        height, width = maps.shape[-2:]
        picture = seen_image(dataset, x)
        rows = 3 * example
        for offset, (index, label) in enumerate(
            ((a, "conditioned on a\n(same class)"), (x, "image x"), (b, "conditioned on b\n(other class)"))
        ):
            axis = axes[rows + offset, 0]
            axis.imshow(seen_image(dataset, index))
            axis.set_ylabel(label, fontsize=7)
        for column, level in enumerate(blocks, start=1):
            weights = recorder.maps[level - 1]  # 3 × 3 × T; [0, j] = x conditioned on image j
            on_a, on_b = (weights[0, j].reshape(height, width).numpy() for j in (1, 2))
            for offset, (heat, cmap, limits) in enumerate(
                ((on_a, OVERLAY_CMAP, (0, 1)), (on_a - on_b, "RdBu_r", (-1, 1)), (on_b, OVERLAY_CMAP, (0, 1)))
            ):
                axis = axes[rows + offset, column]
                axis.imshow(picture)
                bound = float(np.abs(heat).max()) or 1.0
                vmin, vmax = limits
                overlays[offset == 1] = axis.imshow(
                    heat / bound,
                    cmap=cmap,
                    alpha=0.55,
                    vmin=vmin,
                    vmax=vmax,
                    interpolation="bilinear",
                    extent=(-0.5, picture.shape[1] - 0.5, picture.shape[0] - 0.5, -0.5),
                )
                axis.set_title(
                    f"block {level}, "
                    + (f"a − b, max |Δ| {bound:.2f}" if offset == 1 else f"max weight {heat.max():.2f}"),
                    fontsize=7,
                )
    for axis in axes.flat:
        axis.set_xticks([])
        axis.set_yticks([])
    figure.tight_layout()
    panels = axes[:, 1:].ravel()
    plots.overlay_colourbar(figure, overlays[False], panels, label="attention / panel maximum")
    plots.overlay_colourbar(figure, overlays[True], panels, label="(a − b) / panel max |Δ|", pad=0.04)
    return figure


def attention_statistics(method: CrossAttention, dataset, triples: Sequence[tuple[int, int, int]]) -> pd.DataFrame:
    """Per block: mean entropy of the attention (nats; uniform = log T) and mean total-variation distance
    between x's maps conditioned on a and on b — numbers behind the figure's "deeper blocks focus"."""
    device = device_of(method)
    rows: dict[int, dict[str, list[float]]] = {}
    was_training = method.training
    method.eval()
    for x, a, b in triples:
        images = torch.stack([dataset[i][0] for i in (x, a, b)]).to(device)
        with torch.no_grad(), AttentionRecorder(method) as recorder:
            method.conditional_embeddings(method.backbone(images))
        for level, weights in enumerate(recorder.maps, start=1):
            entropy = -(weights * weights.clamp_min(1e-12).log()).sum(-1)
            stats = rows.setdefault(level, {"entropy": [], "TV(x|a, x|b)": []})
            stats["entropy"].append(float(entropy.mean()))
            stats["TV(x|a, x|b)"].append(0.5 * float((weights[0, 1] - weights[0, 2]).abs().sum()))
    method.train(was_training)
    table = pd.DataFrame({level: {k: float(np.mean(v)) for k, v in stats.items()} for level, stats in rows.items()}).T
    table.index.name = "block"
    return table.round(3)


def part_discovery(
    method: CrossAttention,
    dataset,
    *,
    queries: int = 2,
    neighbours: int = 6,
    seed: int = 0,
    batch_size: int = EVAL_BATCH_SIZE,
) -> tuple[plt.Figure, pd.DataFrame]:
    """Local parts (the paper's Sec. 4.3.2, Fig. 5): for the most activated location of a query image, the
    test images whose best-matching location (cosine of backbone features) is most similar, drawn as crops
    framed blue (same class as the query) or vermillion; with the share of same-class matches per query."""
    device = device_of(method)
    maps = feature_maps(method, dataset, batch_size=batch_size, device=device)  # N × C × H × W
    count, channels, height, width = maps.shape
    locations = F.normalize(maps.flatten(2).transpose(1, 2), dim=-1)  # N × T × C
    labels = np.asarray(dataset.labels)
    chosen = np.random.default_rng(seed).choice(count, size=min(queries, count), replace=False)
    figure, axes = plt.subplots(
        len(chosen), neighbours + 1, figsize=(1.45 * (neighbours + 1), 1.6 * len(chosen)), squeeze=False
    )
    rows = []
    interior = torch.zeros(height, width, dtype=torch.bool, device=maps.device)
    interior[1:-1, 1:-1] = True
    if not interior.any():  # grids smaller than 3 × 3 have no interior
        interior[:] = True
    for row, query in enumerate(chosen):
        activation = maps[query].norm(dim=0).masked_fill(~interior, float("-inf"))  # H × W
        cell = int(activation.flatten().argmax())
        similarity = torch.einsum("c,ntc->nt", locations[query, cell], locations)  # N × T
        best, where = similarity.max(dim=1)
        best[query] = float("-inf")
        order = best.argsort(descending=True)[:neighbours].cpu().numpy()
        picture = seen_image(dataset, query)
        _crop_axis(axes[row, 0], picture, cell, (height, width), frame="#ff7f00", title="query part")
        same = 0
        for column, other in enumerate(order, start=1):
            colour = CORRECT if labels[other] == labels[query] else WRONG
            same += int(labels[other] == labels[query])
            _crop_axis(
                axes[row, column],
                seen_image(dataset, int(other)),
                int(where[other]),
                (height, width),
                frame=colour,
                title=f"cos {float(best[other]):.2f}",
                crop=True,
            )
        rows.append(
            {
                "query image": int(query),
                "location (row, col)": divmod(cell, width),
                "same class among top": f"{same}/{len(order)}",
                "chance": f"{(np.sum(labels == labels[query]) - 1) / (count - 1):.3f}",
            }
        )
    figure.tight_layout()
    return figure, pd.DataFrame(rows)


def _crop_axis(
    axis, picture: np.ndarray, cell: int, grid: tuple[int, int], *, frame: str, title: str, crop: bool = False
) -> None:
    """Show the whole picture with the cell outlined, or (``crop``) a two-cell window around the cell, framed."""
    rows, columns = grid
    size_y, size_x = picture.shape[0] / rows, picture.shape[1] / columns
    row, column = divmod(cell, columns)
    if crop:
        centre_y, centre_x = (row + 0.5) * size_y, (column + 0.5) * size_x
        top = int(np.clip(round(centre_y - size_y), 0, picture.shape[0] - 2 * size_y))
        left = int(np.clip(round(centre_x - size_x), 0, picture.shape[1] - 2 * size_x))
        patch = picture[top : top + int(2 * size_y), left : left + int(2 * size_x)]
        axis.imshow(patch)
        axis.add_patch(
            Rectangle((0, 0), patch.shape[1] - 1, patch.shape[0] - 1, fill=False, edgecolor=frame, linewidth=4)
        )
    else:
        axis.imshow(picture)
        axis.add_patch(
            Rectangle(
                (column * size_x - 0.5, row * size_y - 0.5), size_x, size_y, fill=False, edgecolor=frame, linewidth=2
            )
        )
    axis.set_title(title, fontsize=7)
    axis.set_xticks([])
    axis.set_yticks([])


def attention_reading(statistics: pd.DataFrame) -> str:
    """Computed sentence: does attention sharpen with depth (the paper: deeper blocks focus on fewer details)?"""
    first, last = statistics.index.min(), statistics.index.max()
    entropy_first, entropy_last = statistics.loc[first, "entropy"], statistics.loc[last, "entropy"]
    verdict = (
        "sharper in the deeper block, as the paper describes"
        if entropy_last < entropy_first
        else "NOT sharper in the deeper block"
    )
    return (
        f"Attention entropy block {first} → block {last}: {entropy_first:.3f} → {entropy_last:.3f} nats → {verdict}; "
        f"maps of x conditioned on a vs b differ by a total variation of {statistics['TV(x|a, x|b)'].mean():.3f} on average "
        f"(0: the conditioning image does not matter)."
    )


def parts_reading(table: pd.DataFrame) -> str:
    """Computed sentence: share of same-class matches among the retrieved parts against chance."""
    hits = [tuple(int(v) for v in text.split("/")) for text in table["same class among top"]]
    share = sum(h for h, _ in hits) / max(sum(n for _, n in hits), 1)
    chance = float(np.mean(table["chance"].astype(float)))
    verdict = "above" if share > chance else "not above"
    return f"Local parts: {share:.0%} of the retrieved parts come from the query's class (chance {chance:.1%}) → {verdict} chance."
