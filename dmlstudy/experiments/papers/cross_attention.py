"""Cross-image attention's own part of notebook 30 (Kotovenko et al., Cross-Image-Attention for Conditional
Embeddings in Deep Metric Learning, CVPR 2023): its parameters, what no declaration can say (the sⁿ re-scoring
grid of the paper's Figure 3, the parameter table, the readings of the gradient, attention and part tables) and its
figures; its tables and variants are ``cross_attention.yaml``, whose header states the study's decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from matplotlib.patches import FancyBboxPatch

from dmlstudy import metrics as metric_functions
from dmlstudy import plots
from dmlstudy.experiments import ablations
from dmlstudy.experiments.kit import StudyConfig, device_of, lookup, paper_dataset
from dmlstudy.explanations import COLOURBAR_SPACE, kind_colourbars
from dmlstudy.findings.numbers import numbers
from dmlstudy.methods.cross_attention import (
    CrossAttention,
    conditional_retrieval,
    feature_maps,
    recorded_attention,
    subset_indices,
)
from dmlstudy.plots import OVERLAY_CMAP, arrow, box, seen_image
from dmlstudy.run.data import load_datasets
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.run.train import RunResult
from dmlstudy.study.grids import mean_std_table, results_frame
from dmlstudy.study.report import mean_std_text
from dmlstudy.verdicts import effect_sentence, paired_differences


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


DECLARED = ablations.declaration("cross_attention", config=CrossAttentionStudy)
PAPER_PARAMETERS = numbers(DECLARED.paper, "PARAMETERS")  # model → (parameters in millions, R@1 CUB, R@1 Cars)
PAPER_BLOCKS = numbers(DECLARED.paper, "BLOCKS")  # N of every experiment in the paper
PAPER_FIGURE3_CAPTION = numbers(DECLARED.paper, "FIGURE3_CAPTION")
PAPER_FIGURE3_TEXT = numbers(DECLARED.paper, "FIGURE3_TEXT")


# ----------------------------------------------------------------------------------------------
# Runs beyond the declared tables
# ----------------------------------------------------------------------------------------------
def block_runs(config: CrossAttentionStudy) -> dict[str, dict[int, list[RunResult]]]:
    """Train (or load) the declaration's ``blocks`` sweep: dataset → trained N → its runs (one per ablation
    seed); N = 0 is the ``ms`` run."""
    rows = ablations.table_rows(DECLARED, "blocks", config)
    if any(count < 0 for count in rows):
        raise ValueError(f"block_counts must be ≥ 0, got {sorted(rows)}")
    results = ablations.run_table(DECLARED, "blocks", config)
    return {
        dataset: {
            count: [r for name, r in results if name == rows[count][0] and r.config.dataset == dataset]
            for count in rows
        }
        for dataset in config.ablation_datasets
    }


# ----------------------------------------------------------------------------------------------
# Measurements on trained models and their readings
# ----------------------------------------------------------------------------------------------
def rescoring_grid(
    results: Mapping[int, list[RunResult]], *, subset: int, seed: int = 0, ks: Sequence[int] = (1,)
) -> pd.DataFrame:
    """The paper's Figure 3 on our data: R@1 (%) of sⁿ, all against all on a seeded test subset, for every
    trained N (rows) and inference level n ≤ N (columns), averaged over the runs (seeds) of each N; the last
    column is the full-test-set R@1 of s⁰ from the run's own evaluation. N = 0 runs (MS) score level 0 by their
    embeddings."""
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
    if not isinstance(method, CrossAttention):  # the N = 0 row: the MS baseline's own embeddings
        values = metric_functions.retrieval_metrics(result.embeddings["embeddings"][chosen], labels[chosen], ks=ks)
        return {0: values["R@1"]}
    test = torch.utils.data.Subset(load_datasets(result.config)["query"], chosen.tolist())
    maps = feature_maps(method, test, device=device_of(method))
    return {n: values["R@1"] for n, values in conditional_retrieval(method, maps, labels[chosen], ks=ks).items()}


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


def parameter_table(
    results: list[tuple[str, RunResult]], config: CrossAttentionStudy
) -> tuple[pd.DataFrame, list[str]]:
    """Parameters (training and inference) and R@1 of the declared ``parameters`` rows (the baseline, the method,
    the baseline on the larger backbone), and the reading of the method against the larger backbone."""
    rows = ablations.table_rows(DECLARED, "parameters", config)
    frame = results_frame(results)
    table = mean_std_table(frame, metrics=["R@1"])
    shown = []
    for label, (name, _) in rows.items():
        result = next((r for v, r in results if v == name), None)
        if result is None:
            continue
        method = result.method
        blocks = sum(p.numel() for p in method.blocks.parameters()) if isinstance(method, CrossAttention) else 0
        total = sum(p.numel() for p in method.parameters())
        row = {"model": label, "backbone": result.config.backbone, "parameters (training)": total}
        row["parameters (inference)"] = total - blocks
        for dataset in dict.fromkeys(table["dataset"]):
            row[f"R@1 {dataset}"] = mean_std_text(*lookup(table, dataset, name))
        shown.append(row)
    sentences = []
    if len(shown) == len(rows):
        blocks_name, larger_name = (name for name, _ in list(rows.values())[1:])
        ours, big = shown[1]["parameters (training)"], shown[2]["parameters (training)"]
        paper_ours, paper_big = PAPER_PARAMETERS["ResNet-50 + 6 blocks"], PAPER_PARAMETERS["ResNet-101, MS, no blocks"]
        for dataset in dict.fromkeys(table["dataset"]):
            column = 1 if paper_dataset(dataset) == "CUB" else 2
            sentences.append(
                effect_sentence(
                    f"{dataset}: MS + blocks ({ours / 1e6:.2f}M) − larger backbone ({big / 1e6:.2f}M)",
                    ours=paired_differences(frame, dataset, blocks_name, larger_name),
                    paper=paper_ours[column] - paper_big[column],
                )
            )
    return pd.DataFrame(shown), sentences


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
    chance = float(np.mean(table["chance (%)"].astype(float))) / 100
    verdict = "above" if share > chance else "not above"
    return f"Local parts: {share:.0%} of the retrieved parts come from the query's class (chance {chance:.1%}) → {verdict} chance."


# ----------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------
def grid_heatmap(grid: pd.DataFrame, *, title: str = "") -> plt.Figure:
    """The N × n grid as a heat map (R@1 %, blank where n > N)."""
    levels = grid[[c for c in grid.columns if c.startswith("n=")]].rename(columns=lambda column: column[2:])
    title = title or "R@1 (%) of sⁿ on a test subset"
    return plots.table_heatmap(
        levels, xlabel="inference level n (sⁿ)", ylabel="trained blocks N", title=title, label="R@1 (%)"
    )


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
        shape = {"boxstyle": "round,pad=0.05", "facecolor": "#c6dbef", "edgecolor": "0.3"}
        axis.add_patch(FancyBboxPatch((side - 0.55, 0.45), 1.1, top - 0.45, **shape))
        memory = f"E_{name}\n{grid}×{grid}×{channels}\n\nLN,\nthen\nK, V\n(once)"
        axis.text(side, (top + 0.45) / 2, memory, ha="center", va="center", fontsize=8)
        box(axis, (x, 0.9), f"φ⁰({name}) = Linear(avgpool E_{name})", width=width, height=0.55, colour="#e5f5e0")
        start, edge = (side + 0.55, x - width / 2) if name == "i" else (side - 0.55, x + width / 2)
        arrow(axis, (start, 0.9), (edge, 0.9), colour="0.35")
        for level in range(1, levels + 1):
            y = 0.9 + level
            equation = f"φ{_sup(level)}({name}|{other}) = CA(φ{_sup(level - 1)}({other}|{name}), E_{name}, E_{name})"
            box(axis, (x, y), equation, width=width, height=0.55)
            edge = x - width / 2 if name == "i" else x + width / 2
            arrow(axis, (side + (0.55 if name == "i" else -0.55), y), (edge, y), colour="#3182bd", linestyle=":")
    inner_i, inner_j = columns["i"] + width / 2, columns["j"] - width / 2
    for level in range(1, levels + 1):  # queries cross over: level n of i is conditioned on level n − 1 of j
        y = 0.9 + level
        arrow(axis, (inner_j, y - 1.0), (inner_i, y), colour="#e6550d")
        arrow(axis, (inner_i, y - 1.0), (inner_j, y), colour="#e6550d")
    similarity = f"s{_sup(levels)}(i, j) = cos(φ{_sup(levels)}(i|j), φ{_sup(levels)}(j|i))  →  Multi-Similarity loss"
    axis.text(5.0, top + 0.55, similarity, ha="center", fontsize=9.5, color="#a50f15")
    legend = (
        "grey: average pooling;  orange: the query q̂ = the OTHER image's previous level, normalised;  "
        f"blue dotted: keys and values from the image's own feature map;  d = {embedding_dim}"
    )
    axis.text(5.0, -0.3, legend, ha="center", va="center", fontsize=7.5)
    axis.set_title(
        "Training only — a B × B × d tensor per level for all ordered pairs of the batch; test time uses φ⁰ alone",
        fontsize=9,
    )
    return figure


def _sup(number: int) -> str:
    return str(number).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


def drawn_blocks(requested: Sequence[int], num_blocks: int) -> tuple[list[int], str]:
    """The blocks an attention figure draws for a model with ``num_blocks`` blocks, and a sentence saying which
    and why: the ``requested`` blocks the model has, and always its last block (the deepest attention, which the
    paper's depth claim is about), in increasing order. A requested block past the model's last is named as left
    out (a model trained with N blocks has no block N + 1: its tuned N decides, 5 on emoji)."""
    if num_blocks < 1:
        raise ValueError(f"drawn_blocks: the model has no attention block (num_blocks = {num_blocks})")
    kept = sorted({n for n in requested if 1 <= n <= num_blocks} | {num_blocks})
    missing = sorted({n for n in requested if n > num_blocks})
    sentence = f"The model has {num_blocks} block{'s' * (num_blocks != 1)}; drawn: {_listed(kept)}"
    if missing:
        sentence += f" ({_listed(missing)} asked for, which it does not have; its last block {num_blocks} instead)"
    elif num_blocks not in requested:
        sentence += f" (its last block {num_blocks} added)"
    return kept, sentence + "."


def _listed(numbers: Sequence[int]) -> str:
    words = [str(n) for n in numbers]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def attention_figure(
    method: CrossAttention, dataset, triples: Sequence[tuple[int, int, int]], *, blocks: Sequence[int] = (2, 4, 6)
) -> plt.Figure:
    """For each triple (x, a, b): Attn over x's locations at the blocks :func:`drawn_blocks` chooses when x is
    conditioned on a (top), on b (bottom), and their difference (middle, red = more weight when conditioned on a).
    Each panel is scaled by its own largest value (titles give it; uniform attention is 1/hw); one colour bar per
    kind, under the maps, gives the scaled units."""
    blocks, _ = drawn_blocks(blocks, method.num_blocks)
    figure, axes = plt.subplots(
        3 * len(triples), len(blocks) + 1, figsize=(1.7 * (len(blocks) + 1), 1.75 * 3 * len(triples)), squeeze=False
    )
    device = device_of(method)
    overlays = {}  # is-difference → the last overlay drawn with that scale (for the colourbars)
    for example, (x, a, b) in enumerate(triples):
        images = torch.stack([dataset[i][0] for i in (x, a, b)]).to(device)
        maps, recorded = recorded_attention(method, images, num_levels=max(blocks))
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
            weights = recorded[level - 1]  # 3 × 3 × T; [0, j] = x conditioned on image j
            on_a, on_b = (weights[0, j].reshape(height, width).numpy() for j in (1, 2))
            for offset, (heat, cmap, limits) in enumerate(
                ((on_a, OVERLAY_CMAP, (0, 1)), (on_a - on_b, "RdBu_r", (-1, 1)), (on_b, OVERLAY_CMAP, (0, 1)))
            ):
                axis = axes[rows + offset, column]
                axis.imshow(picture)
                bound = float(np.abs(heat).max()) or 1.0
                extent = (-0.5, picture.shape[1] - 0.5, picture.shape[0] - 0.5, -0.5)
                shown = {"cmap": cmap, "alpha": 0.55, "vmin": limits[0], "vmax": limits[1], "interpolation": "bilinear"}
                overlays[offset == 1] = axis.imshow(heat / bound, extent=extent, **shown)
                scale = f", a − b\nmax |Δ| {bound:.2f}" if offset == 1 else f"\nmax weight {heat.max():.2f}"
                axis.set_title(f"block {level}{scale}", fontsize=7)
    for axis in axes.flat:
        axis.set_xticks([])
        axis.set_yticks([])
    figure.tight_layout(rect=(0, COLOURBAR_SPACE / figure.get_figheight(), 1, 1))
    kinds = [(overlays[False], "attention / panel maximum"), (overlays[True], "(a − b) / panel max |Δ|")]
    kind_colourbars(figure, axes, kinds)
    return plots.credit(figure, dataset)
