"""CRT's own part of notebook 10 (Kan et al., NeurIPS 2022): its parameters, what no declaration can say (each run
scored on both branches, MS vs +CRT per backbone, parameters and FLOPs, ESD and ρ per split) and its figures; its
tables and variants are ``crt.yaml``. Parameters and FLOPs (``torch.utils.flop_counter``, 2 FLOPs per
multiply-add) are counted for one image at the paper's 227 px (ViTs with 16-px patches at 224 px); the paper's
numbers (MiT-B1 on CUB for the ablations) orient the reader, they are not targets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from torch.utils.data import Subset
from torch.utils.flop_counter import FlopCounterMode

from dmlstudy import metrics as metric_functions
from dmlstudy import plots
from dmlstudy.experiments import ablations, kit
from dmlstudy.findings.numbers import numbers
from dmlstudy.methods import build_method
from dmlstudy.methods.crt import CRT, BranchEmbedder, prototype_correlation
from dmlstudy.models import build_backbone
from dmlstudy.models.backbones import Backbone
from dmlstudy.run.evaluation import embed
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.run.train import RunResult
from dmlstudy.study.grids import mean_std_table, results_frame
from dmlstudy.study.report import mean_std_text
from dmlstudy.verdicts import effect_sentence, judge, paired_differences

COMPLEXITY_OUTPUT_STRIDE = {"test_resnet": 16}  # as trained in the study; full-size ResNets at their own stride 32
PAPER_NAME_OF_BACKBONE = {"resnet50": "ResNet-50", "deit_small_patch16_224": "DeiT-S"}  # timm name → the paper's


@dataclass
class CRTStudy(kit.StudyConfig):
    """Parameters of ``notebooks/10_crt.ipynb``: the protocol plus CRT's sweeps. Empty lists skip a table."""

    ablation_datasets: list = field(default_factory=lambda: ["synbirds"])  # datasets of the ablation tables
    ablation_seeds: list = field(default_factory=lambda: [0])  # seeds of the ablation tables
    components: bool = True  # full / −CRT / −CRT−Consistency table
    multi_perspective: bool = True  # K1 and K2 both 1 against the default 64
    shared_ablation: bool = True  # shared prototype bank against two banks
    k1_values: list = field(default_factory=lambda: [1])  # K1 sweep (separate banks, K2 at 64); 64 is always added
    k2_values: list = field(default_factory=lambda: [1])  # K2 sweep (separate banks, K1 at 64); 64 is always added
    lambda2_values: list = field(default_factory=lambda: [0.0])  # λ2 sweep; 0.9 (the default run) is always added
    batch_sizes: list = field(default_factory=lambda: [32])  # total batch N (P·M) at the protocol M; its N added
    dim_pairs: list = field(default_factory=lambda: [[32, 64]])  # (d, D) scored on both branches; (128, 1024) added
    backbones: list = field(default_factory=lambda: ["test_vit"])  # MS vs +CRT per backbone; the protocol's added
    complexity_backbones: list = field(
        default_factory=lambda: ["test_resnet", "test_vit"]
    )  # whole backbones counted after the protocol's
    complexity_image_size: int = 227  # pixels of the params/FLOPs count (227 as in the paper)
    geometry_splits: list = field(default_factory=lambda: ["test"])  # ESD/ρ on these splits (test, train)
    geometry_drop_first: list = field(default_factory=lambda: [0, 1])  # ρ with these many singular values dropped
    heatmap_prototypes: int = 8  # prototypes shown in the code heat maps
    tsne_classes: int = 5  # test classes in the t-SNE plots

    def ablation_protocol(self) -> ProtocolConfig:
        """The protocol with the ablation seeds (the ablation tables run on ``ablation_datasets``)."""
        return self.protocol.with_seeds(self.ablation_seeds)


DECLARED = ablations.declaration("crt", config=CRTStudy)


# ----------------------------------------------------------------------------------------------
# (d, D) pairs scored on both branches
# ----------------------------------------------------------------------------------------------
def dim_variants(pairs: Sequence[Sequence[int]], protocol: ProtocolConfig) -> dict[tuple[int, int], ablations.Variant]:
    """(d, D) → variant; (protocol d, CRT's default D), the ``crt`` run, always included."""
    high = kit.method_defaults(CRT)["high_dim"]
    pairs = sorted({tuple(int(v) for v in pair) for pair in pairs} | {(protocol.embedding_dim, high)})
    return {
        (d, D): ablations.variant(
            DECLARED, kwargs={"high_dim": D}, overrides={} if d == protocol.embedding_dim else {"embedding_dim": d}
        )
        for d, D in pairs
    }


def branch_r1(result: RunResult, branch: int) -> float:
    """Test R@1 of one branch of a trained CRT run (branch 1: the run's own record)."""
    if branch == 1:
        return result.metrics["R@1"]
    query = kit.evaluation_split(result.config, "test")
    embedder = BranchEmbedder(result.method, branch)
    embeddings = embed(embedder, query, batch_size=result.config.eval_batch_size, device=kit.device_of(result.method))
    return metric_functions.retrieval_metrics(embeddings, np.asarray(query.labels), ks=(1,))["R@1"]


def dims_table(results, variants: Mapping[tuple[int, int], ablations.Variant]) -> tuple[pd.DataFrame, list[str]]:
    """R@1 of branch 1 (d) and branch 2 (D) per (d, D) pair, mean ± std over seeds, the paper's beside; readings:
    does branch 2 beat branch 1 in most pairs, as in the paper, and does a larger d help branch 1?"""
    paper, pair_of = numbers("crt", "DIMS"), {name: pair for pair, (name, _) in variants.items()}
    frame = pd.DataFrame(
        {"dataset": r.config.dataset, "variant": v, "seed": r.config.seed, "branch": b, "R@1": branch_r1(r, b)}
        for v, r in results
        for b in (1, 2)
    )
    by_branch = {b: mean_std_table(frame[frame["branch"] == b], metrics=["R@1"]) for b in (1, 2)}
    rows, sentences = [], []
    for dataset in dict.fromkeys(frame["dataset"]):
        wins = []
        for name, (d, D) in pair_of.items():
            cells = [kit.lookup(by_branch[b], dataset, name) for b in (1, 2)]
            rows.append(
                {"dataset": dataset, "d": d, "D": D, "runs": cells[0][2]}
                | {f"branch {b} R@1": mean_std_text(*cell) for b, cell in zip((1, 2), cells)}
                | {f"paper branch {b}": paper.get((d, D), ("–", "–"))[b - 1] for b in (1, 2)}
            )
            wins.append(cells[1][0] > cells[0][0])
        theirs = [b2 > b1 for pair in pair_of.values() if pair in paper for b1, b2 in [paper[pair]]]
        held = (sum(wins) > len(wins) / 2) == (sum(theirs) > len(theirs) / 2)
        sentences.append(
            f"{dataset}: branch 2 (D) beats branch 1 (d) in {sum(wins)}/{len(wins)} of our (d, D) pairs; the paper's "
            f"in {sum(theirs)}/{len(theirs)} of the same pairs → {'direction held' if held else 'direction NOT reproduced'}."
        )
        low, high = min(pair_of.values()), max(pair_of.values())
        if low[0] != high[0]:
            ours = paired_differences(frame[frame["branch"] == 1], dataset, variants[high][0], variants[low][0])
            gain = paper[high][0] - paper[low][0] if low in paper and high in paper else None
            what = f"{dataset}: branch 1 at d = {high[0]} − d = {low[0]}"
            sentences.append(effect_sentence(what, ours=ours, paper=gain))
    return pd.DataFrame(rows), sentences


# ----------------------------------------------------------------------------------------------
# MS vs +CRT per backbone
# ----------------------------------------------------------------------------------------------
def backbone_variants(backbones: Sequence[str], protocol: ProtocolConfig) -> dict[str, dict[str, ablations.Variant]]:
    """Per backbone: MS and CRT on it (the protocol backbone's pair is ``ms`` / ``crt``)."""
    names = [protocol.backbone, *[b for b in backbones if b != protocol.backbone]]
    return {
        name: {
            method: ablations.variant(DECLARED, method=method, overrides=kit.backbone_overrides(name, protocol))
            for method in ("ms", "crt")
        }
        for name in names
    }


def backbone_table(results, variants: Mapping[str, Mapping[str, ablations.Variant]]) -> tuple[pd.DataFrame, list[str]]:
    """MS vs +CRT per backbone with the study's verdict on "+CRT > MS", and the paper's per-backbone gains."""
    paper, frame, table = numbers("crt", "BACKBONES"), results_frame(results), kit.summary(results)
    columns = ["dataset", "backbone", "runs", "MS R@1", "+CRT R@1", "gain", "verdict"]
    rows, sentences = [], []
    for dataset in dict.fromkeys(table["dataset"]):
        outcomes = []
        for backbone, pair in variants.items():
            verdict = judge(paired_differences(frame, dataset, pair["crt"][0], pair["ms"][0]).differences)
            outcomes.append(verdict.outcome)
            ms, crt = (kit.lookup(table, dataset, pair[m][0]) for m in ("ms", "crt"))
            values = [dataset, backbone, ms[2], mean_std_text(*ms), mean_std_text(*crt), f"{verdict.mean:+.2f}"]
            rows.append(dict(zip(columns, [*values, verdict.text])))
        stand_in = kit.paper_dataset(dataset, "CUB")
        wins = sum(values[stand_in][1] > values[stand_in][0] for values in paper.values())
        counts = ", ".join(f"{outcomes.count(o)} {o}" for o in dict.fromkeys(outcomes))
        sentences.append(
            f"{dataset}: +CRT > MS on our {len(variants)} backbones (paired seeds): {counts}; the paper's +CRT beat MS "
            f"on {wins}/{len(paper)} backbones ({stand_in})."
        )
    return pd.DataFrame(rows), sentences


# ----------------------------------------------------------------------------------------------
# Parameters and FLOPs
# ----------------------------------------------------------------------------------------------
def _flops(function, *args) -> int:
    with FlopCounterMode(display=False) as counter:
        function(*args)
    return int(counter.get_total_flops())


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def complexity_row(
    name: str, *, image_size: int = 227, embedding_dim: int = 128, backbone: Backbone | None = None
) -> dict[str, Any]:
    """Parameters (M) and GFLOPs of one image: the backbone, MS (backbone + FC) and CRT (branch 1 at test time; both
    branches in training). A ViT whose patch size does not divide ``image_size`` is counted at the nearest smaller
    multiple (column ``px``). ``backbone``: count this one (built at ``image_size``; ``name`` labels it) instead of
    the registry's ``name``; layers it keeps but never runs (:meth:`~dmlstudy.models.trunk_cache.StemCachedBackbone.idle_modules`) are not
    counted. Column ``C``: the channels of the feature map CRT codes."""
    torch.manual_seed(0)
    stride = COMPLEXITY_OUTPUT_STRIDE.get(name) if backbone is None else None
    options = {"output_stride": stride} if stride else {}
    size = image_size
    if backbone is None:
        backbone = build_backbone(name, image_size=image_size, **options)
        patch = np.atleast_1d(getattr(getattr(backbone.model, "patch_embed", None), "patch_size", 1))[0]
        if (size := image_size - image_size % int(patch)) != image_size:
            backbone = build_backbone(name, image_size=size, **options)
    backbone = backbone.eval()
    idle = sum(p.numel() for module in getattr(backbone, "idle_modules", list)() for p in module.parameters())
    image = torch.randn(1, 3, size, size)
    ms, crt = (
        build_method(m, backbone=backbone, embedding_dim=embedding_dim, num_classes=2).eval() for m in ("ms", "crt")
    )
    with torch.no_grad():
        feature_map = backbone(image)
        return {
            "backbone": name,
            "px": size,
            "output stride": stride or "own",
            "C": int(feature_map.shape[1]),
            "grid": "×".join(map(str, feature_map.shape[2:])),
            "backbone params (M)": (_count(backbone) - idle) / 1e6,
            "MS params (M)": (_count(ms) - idle) / 1e6,
            "+CRT params, test (M)": (_count(crt) - idle - _count(crt.heads[1])) / 1e6,
            "+CRT params, train (M)": (_count(crt) - idle) / 1e6,
            "backbone GFLOPs": _flops(backbone, image) / 1e9,
            "MS GFLOPs": _flops(ms, image) / 1e9,
            "+CRT GFLOPs, test": _flops(crt, image) / 1e9,
            "+CRT GFLOPs, train fwd": _flops(crt.embed_branches, image) / 1e9,
        }


def run_config(protocol: ProtocolConfig, *, seed: int = 0):
    """The :class:`~dmlstudy.run.train.TrainConfig` of the protocol's ``crt`` run on its first dataset."""
    return protocol.train_config(dataset=protocol.datasets[0], method=DECLARED.method, seed=seed, name=DECLARED.method)


def untrained_model(protocol: ProtocolConfig, *, seed: int = 0) -> CRT:
    """CRT as the protocol's runs build it before their first step (:func:`~dmlstudy.run.model.build_model`): their
    backbone, with the weights their regime starts from, and fresh prototypes and heads (seeded). Figures drawn
    from it have the runs' real sizes: in the ``imagenet`` regime EfficientNet-Lite0's last stage, C = 320, without
    the 1 × 1 ``conv_head`` (1,280) that the runs leave out."""
    from dmlstudy.run.model import build_model

    return build_model(run_config(protocol, seed=seed), num_classes=2)


def complexity_table(
    backbones: Sequence[str],
    *,
    image_size: int = 227,
    embedding_dim: int = 128,
    protocol: ProtocolConfig | None = None,
):
    """Our params/FLOPs per backbone (:func:`complexity_row`), the paper's table (backbones only), and per backbone
    CRT's extra cost over MS (the paper names the two branches' training cost as a limitation). With ``protocol``,
    the first row is the protocol's backbone as its runs build it (:func:`~dmlstudy.run.model.run_backbone`; in the
    ``imagenet`` regime without ``conv_head``, C = 320), counted at ``image_size``, its ImageNet weights not
    loaded (counting needs none); a listed backbone of the same name is then the registry's whole network."""
    from dmlstudy.run.model import run_backbone

    paper = numbers("crt", "COMPLEXITY")
    rows = []
    if protocol is not None:
        config = dataclasses.replace(run_config(protocol), image_size=image_size, pretrained=False, checkpoint_path="")
        label = f"{config.backbone}, as the study's runs train it"
        backbone = run_backbone(config)
        rows.append(complexity_row(label, image_size=image_size, embedding_dim=embedding_dim, backbone=backbone))
    rows += [complexity_row(n, image_size=image_size, embedding_dim=embedding_dim) for n in backbones]
    ours = pd.DataFrame(rows).round(3)
    ours["paper backbone (params M, GFLOPs)"] = [
        paper.get(PAPER_NAME_OF_BACKBONE.get(n, ""), "–") for n in ours["backbone"]
    ]
    sentences = [
        f"{r['backbone']} at {r['px']} px: +CRT has {r['+CRT params, test (M)'] / r['MS params (M)']:.1f}× the parameters "
        f"of MS at test time and {r['+CRT params, train (M)'] / r['MS params (M)']:.1f}× in training; FLOPs "
        f"+{100 * (r['+CRT GFLOPs, test'] / r['MS GFLOPs'] - 1):.1f} % at test time, "
        f"+{100 * (r['+CRT GFLOPs, train fwd'] / r['MS GFLOPs'] - 1):.1f} % in the training forward pass."
        for r in ours.to_dict("records")
    ]
    theirs = pd.DataFrame([{"backbone": n, "params (M)": p, "FLOPs (G)": f} for n, (p, f) in paper.items()])
    return ours, theirs, sentences


# ----------------------------------------------------------------------------------------------
# ESD and spectral decay per split
# ----------------------------------------------------------------------------------------------
def split_geometry_table(
    results, *, splits: Sequence[str], drop_first: Sequence[int]
) -> tuple[pd.DataFrame, list[str]]:
    """ESD and ρ (per ``drop_first``) of MS vs +CRT per split, mean ± std over seeds, beside the paper's pairs
    (Baseline, +CRT); per dataset and split, whether +CRT raised ESD and lowered ρ as the paper reports."""
    frame = kit.split_geometry(results, splits=splits, drop_first=drop_first)
    values = [c for c in frame.columns if c == "ESD" or c.startswith("rho")]
    grouped = frame.groupby(["dataset", "split", "variant"], sort=False)[values]
    means = grouped.mean()
    table = means.round(3).astype(str) + " ± " + grouped.std().fillna(0.0).round(3).astype(str)
    table.insert(0, "runs", grouped.size())
    table = table.reset_index()
    papers = {"ESD": numbers("crt", "ESD"), "rho": numbers("crt", "RHO")}  # paper dataset → (Baseline, +CRT)
    for name, column in (("ESD", "paper ESD ↑"), ("rho", "paper ρ ↓")):
        pairs = [papers[name].get(kit.paper_dataset(d)) for d in table["dataset"]]
        table[column] = [
            pair[v == "crt"] if pair and v in ("ms", "crt") else "–" for pair, v in zip(pairs, table["variant"])
        ]
    sentences = []
    for (dataset, split), group in means.groupby(level=["dataset", "split"], sort=False):
        group = group.droplevel(["dataset", "split"])
        if not {"ms", "crt"} <= set(group.index):
            continue
        parts = []
        for column in values:
            ours, pair = (
                group.loc["crt", column] - group.loc["ms", column],
                papers["ESD" if column == "ESD" else "rho"].get(kit.paper_dataset(dataset)),
            )
            paper = (
                f" (paper {pair[1] - pair[0]:+.2f}: {'held' if np.sign(ours) == np.sign(pair[1] - pair[0]) else 'NOT reproduced'})"
                if pair
                else ""
            )
            parts.append(f"{column} +CRT − MS = {ours:+.3f}{paper}")
        sentences.append(
            f"{dataset} ({split} split): " + "; ".join(parts) + " (ρ's drop_first is unstated in the paper)."
        )
    return table, sentences


# ----------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------
def transform_figure(method: CRT, *, image_size: int = 64) -> plt.Figure:
    """An annotated diagram of the coded residual transform with the real sizes of ``method``."""
    with torch.no_grad():
        was_training = method.training
        method.eval()
        feature_map = method.backbone(torch.zeros(1, 3, image_size, image_size, device=kit.device_of(method)))
        method.train(was_training)
    channels, height, width = feature_map.shape[1:]
    d, high = method.branch_dims
    figure, axis = plt.subplots(figsize=(13, 4.4))
    axis.set(xlim=(0, 14), ylim=(0, 5.2))
    axis.axis("off")
    image = plots.box(axis, (0.75, 2.5), f"image\n3×{image_size}×{image_size}", width=1.3)
    text = f"backbone map X\n{channels}×{height}×{width}\n= {height * width} tokens x_j"
    features = plots.box(axis, (3.3, 2.5), text, width=1.9, height=1.1)
    plots.link(axis, image, features, "backbone")
    bank = "one shared bank" if method.shared else "a bank per branch"
    text = f"codes a_jk =\nsoftplus(x_jᵀc_k)\n{height * width}×{method.K1}\n(K = {method.K1} prototypes c_k,\n{bank})"
    codes = plots.box(axis, (6.3, 2.5), text, width=2.1, height=1.5, colour="#fee6ce")
    plots.link(axis, features, codes)
    residual = plots.box(
        axis, (9.1, 2.5), f"r_k = Σ_j a_jk (x_j − c_k)\n{method.K1}×{channels}", width=2.3, colour="#fee6ce"
    )
    plots.link(axis, codes, residual)
    first = plots.box(axis, (12.3, 4.0), f"f¹ = (1/K) Σ_k Γ¹_k r_k\nd = {d} (test time)", width=2.5, colour="#e5f5e0")
    second = plots.box(axis, (12.3, 1.0), f"f² = (1/K) Σ_k Γ²_k r_k\nD = {high}", width=2.5, colour="#e5f5e0")
    plots.link(axis, residual, first, "Γ¹_k: C → d", shift=(-0.75, 0.0))
    plots.link(axis, residual, second, "Γ²_k: C → D", shift=(-0.75, -0.3))
    losses = {
        (12.3, 2.5): "L_CON = mean |S¹ − S²|\n(batch cosine matrices)",
        (12.3, 4.75): "L_MS(f¹)",
        (12.3, 0.1): "L_MS(f²)",
        (6.3, 1.45): "L_DIV = mean over k ≠ j of |cos(c_k, c_j)|",
    }
    for (x, y), text in losses.items():
        axis.text(x, y, text, ha="center", va="top" if y == 1.45 else "center", fontsize=8, color="#a50f15")
    axis.set_title("Coded residual transform: L = L_DIV + λ1 (L_MS(f¹) + L_MS(f²)) + λ2 L_CON", fontsize=10)
    return figure


def branch_tsne_figure(result: RunResult, *, classes: int = 10, seed: int = 0) -> plt.Figure:
    """t-SNE (:func:`dmlstudy.experiments.kit.projection_figure`) of branch-2 (D) and branch-1 (d) test embeddings of
    the first ``classes`` test classes of one CRT run."""
    query = kit.evaluation_split(result.config, "test")
    labels = np.asarray(query.labels)
    keep = np.flatnonzero(np.isin(labels, np.unique(labels)[:classes]))
    panels = {}
    for branch in (2, 1):
        embedder = BranchEmbedder(result.method, branch)
        embeddings = embed(
            embedder,
            Subset(query, keep.tolist()),
            batch_size=result.config.eval_batch_size,
            device=kit.device_of(result.method),
        )
        panels[f"branch {branch}: {'D' if branch == 2 else 'd'} = {embeddings.shape[1]}"] = (embeddings, labels[keep])
    title = f"{result.config.dataset}, CRT's two branches"
    return kit.projection_figure(panels, kind="tsne", classes=classes, seed=seed, title=title)


def random_prototype_cosine(channels: int) -> float:
    """The mean |cos| between two independent random directions in ``channels`` dimensions, ``√(2 / (π C))`` for
    large C (each cosine is then nearly normal with variance 1/C): what L_DIV starts from with randomly drawn
    prototypes (0.045 at C = 320, 0.022 at C = 1,280)."""
    return math.sqrt(2.0 / (math.pi * channels))


def off_diagonal(matrix: np.ndarray) -> np.ndarray:
    """The entries of a square matrix off its diagonal (K(K−1) values)."""
    return matrix[~np.eye(len(matrix), dtype=bool)]


def prototype_correlation_figure(method: CRT, *, untrained: CRT | None = None, branch: int = 1) -> plt.Figure:
    """The K × K |cos(c_k, c_j)| between the prototypes of ``method`` (and of ``untrained``, the same CRT before
    training, when given) with the diagonal masked (it is 1 by definition), on one colour scale fitted to the
    off-diagonal of both, and a histogram of the off-diagonal values of each beside the mean |cos| of random
    directions (:func:`random_prototype_cosine`).

    Decision: on a 0–1 scale with the diagonal at 1, a bank at |cos| 0.000 and one at 0.045 looked the same; what
    L_DIV changes is only visible on the off-diagonal's own scale, and most plainly as two histograms."""
    banks = {"trained": prototype_correlation(method, branch=branch).cpu().numpy()}
    if untrained is not None:
        banks["untrained"] = prototype_correlation(untrained, branch=branch).cpu().numpy()
    count, channels = len(banks["trained"]), method.bank(branch).prototypes.shape[1]
    off = {name: off_diagonal(matrix) for name, matrix in banks.items()}
    top = max(max((values.max() for values in off.values() if values.size), default=0.0), 1e-3)
    figure, axes = plt.subplots(1, len(banks) + 1, figsize=(4.4 * (len(banks) + 1), 3.8))
    colours = {"trained": plots.PALETTE[0], "untrained": plots.PALETTE[1]}
    for axis, (name, matrix) in zip(axes, banks.items()):
        masked = np.ma.masked_array(matrix, mask=np.eye(count, dtype=bool))
        cmap = plt.get_cmap(plots.HEATMAP_CMAP).with_extremes(bad="0.85")  # the masked diagonal in grey
        summary = f"off-diagonal mean {off[name].mean():.3f}, max {off[name].max():.3f}" if off[name].size else "K = 1"
        plots.heatmap(
            axis, masked, title=f"{name}\n{summary}", label="|cos| (diagonal grey)", cmap=cmap, vmin=0, vmax=top
        )
        axis.title.set_fontsize(9)
        axis.set(xlabel="prototype j", ylabel="prototype k")
        plots.integer_ticks(axis, "x")
        plots.integer_ticks(axis, "y")
    histogram = axes[-1]
    bins = np.linspace(0.0, top, 31)
    for name, values in off.items():
        histogram.hist(
            values,
            bins=bins,
            color=colours[name],
            histtype="step",  # outlines: the two histograms stay readable where they overlap
            linewidth=1.8,
            label=f"{name} (mean {values.mean():.3f})" if values.size else name,
        )
    expected = random_prototype_cosine(channels)
    histogram.axvline(
        expected, color="0.2", linestyle="--", linewidth=1, label=f"random directions, √(2/(πC)) = {expected:.3f}"
    )
    histogram.set(
        xlabel="|cos(c_k, c_j)|, k ≠ j", ylabel="prototype pairs (log scale)", title="off-diagonal |cos|", xlim=(0, top)
    )
    histogram.set_yscale(
        "log"
    )  # a trained bank piles every pair into the first bin; the untrained spread stays visible
    histogram.title.set_fontsize(9)
    figure.tight_layout(rect=(0, 0, 1, 0.9))  # the top tenth for the title, clear of the log axis' top label
    top = max(axis.get_tightbbox().y1 for axis in axes) / figure.bbox.height  # the panels' titles, after layout
    figure.suptitle(
        f"Prototype correlations, K = {count} prototypes in C = {channels} dimensions (L_DIV pushes k ≠ j to 0)",
        y=top + 0.02,
        va="bottom",
    )  # just above the panels' titles, however tall the square heat maps leave them
    plots.legend_outside(figure, [histogram])
    return figure
