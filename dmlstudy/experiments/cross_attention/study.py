"""Cross-attention study: the notebook's config, the paper's numbers, the runs its declaration
(``papers/cross_attention.yaml``: the main table, the block sweep, the options) does not name, and the
measurements on trained models (sⁿ re-scoring, attention statistics)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from dmlstudy import metrics as metric_functions
from dmlstudy.experiments import ablations
from dmlstudy.experiments.kit import StudyConfig, backbone_overrides, device_of, method_defaults
from dmlstudy.experiments.papers.numbers import numbers
from dmlstudy.methods.cross_attention import (
    AttentionRecorder,
    CrossAttention,
    conditional_retrieval,
    feature_maps,
    subset_indices,
)
from dmlstudy.run.data import load_datasets
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.run.train import RunResult

# ----------------------------------------------------------------------------------------------
# The paper's numbers (Kotovenko et al., CVPR 2023), from papers.yaml, in %.
# ----------------------------------------------------------------------------------------------
PAPER_PARAMETERS = numbers("cross_attention", "PARAMETERS")  # model → (parameters in millions, R@1 CUB, R@1 Cars)
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
# Runs beyond the declaration (papers/cross_attention.yaml)
# ----------------------------------------------------------------------------------------------
DECLARED = ablations.declaration("cross_attention")


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


def parameter_variants(larger_backbone: str, protocol: ProtocolConfig) -> dict[str, ablations.Variant]:
    """MS, MS + blocks (``cross_attention``) and MS on ``larger_backbone`` (evaluated after its last epoch only:
    only this table reads it), by role."""
    name, spec = ablations.variant(DECLARED, method="ms", overrides=backbone_overrides(larger_backbone, protocol))
    return {
        "ms": ablations.variant(DECLARED, method="ms"),
        "cross_attention": ablations.variant(DECLARED),
        "larger": (name, {**spec, **ablations.FINAL_EVALUATION_ONLY}),
    }


def gradient_variants(block_counts: Sequence[int] = (1, 2, 6)) -> dict[str, ablations.Variant]:
    """MS, the default method at several N, and the two options that give φ a direct path to the loss."""
    default = method_defaults(CrossAttention)["num_blocks"]
    variants = {"MS (no blocks)": ablations.variant(DECLARED, method="ms")}
    variants.update(
        {f"N = {n}": ablations.variant(DECLARED, kwargs={"num_blocks": int(n)}) for n in block_counts if int(n) > 0}
    )
    variants[f"N = {default}, residual"] = ablations.variant(DECLARED, kwargs={"residual": True})
    variants[f"N = {default}, + MS on s⁰"] = ablations.variant(DECLARED, kwargs={"unconditional_loss": True})
    return variants


# ----------------------------------------------------------------------------------------------
# Measurements on trained models
# ----------------------------------------------------------------------------------------------
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
