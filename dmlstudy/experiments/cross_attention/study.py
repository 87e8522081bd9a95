"""Cross-attention study: the notebook's config, the paper's numbers, the variants and their run names,
and the measurements on trained models (sⁿ re-scoring, gradients at initialisation, attention statistics)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from dmlstudy import metrics as metric_functions
from dmlstudy.experiments.kit import StudyConfig, as_grid, device_of, method_defaults, run_variants
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


def variant(*, explicit: Sequence[str] = (), **method_kwargs: Any) -> tuple[str, dict[str, Any]]:
    """``(name, spec)`` of a cross-attention variant for :meth:`ProtocolConfig.grid`, named from what differs
    from the defaults; ``num_blocks=0`` is the ``ms`` baseline (the same model, see the module docstring).
    Arguments named in ``explicit`` stay in the spec and the name even at their default: a sweep's points
    must say their value, since the plain ``cross_attention`` row takes the study's tuned values."""
    defaults = method_defaults(CrossAttention)
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
    from dmlstudy.run.model import build_model

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
