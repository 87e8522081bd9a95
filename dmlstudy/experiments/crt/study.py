"""CRT study: the notebook's config, the paper's numbers, the variants and their run names, and the
measurements on finished runs (branch scores, evaluation splits, parameters and FLOPs) that the tables use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Subset
from torch.utils.flop_counter import FlopCounterMode

from dmlstudy import metrics as metric_functions
from dmlstudy.data import build_dataset, build_transforms, evaluation_protocol
from dmlstudy.experiments.kit import StudyConfig, device_of, method_defaults, variant_name, with_reference
from dmlstudy.experiments.papers.numbers import numbers
from dmlstudy.methods import build_method
from dmlstudy.methods.crt import CRT, BranchEmbedder
from dmlstudy.models import build_backbone
from dmlstudy.paths import data_root
from dmlstudy.run.evaluation import embed
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.run.train import RunResult, TrainConfig

# ----------------------------------------------------------------------------------------------
# The paper's numbers (Kan et al., NeurIPS 2022), from papers.yaml. Recall@1 in %.
# ----------------------------------------------------------------------------------------------
PAPER_BASELINE_VS_CRT = numbers("crt", "BASELINE_VS_CRT")  # paper dataset → {ms, crt}, MiT-B1
PAPER_COMPONENTS = numbers("crt", "COMPONENTS")  # CUB, MiT-B1
PAPER_K1 = numbers("crt", "K1")
PAPER_K2 = numbers("crt", "K2")
PAPER_MULTI_PERSPECTIVE = numbers("crt", "MULTI_PERSPECTIVE")
PAPER_SHARED = numbers("crt", "SHARED")
PAPER_LAMBDA2 = numbers("crt", "LAMBDA2")
PAPER_BATCH = numbers("crt", "BATCH")
PAPER_DIMS = numbers("crt", "DIMS")  # (d, D) → (branch 1, branch 2)
PAPER_BACKBONES = numbers("crt", "BACKBONES")  # backbone → dataset → (MS, +CRT)
PAPER_COMPLEXITY = numbers("crt", "COMPLEXITY")  # backbone → (params M, FLOPs G) at 227 px
PAPER_NAME_OF_BACKBONE = {"resnet50": "ResNet-50", "deit_small_patch16_224": "DeiT-S"}  # timm name → the paper's
PAPER_ESD = numbers("crt", "ESD")  # paper dataset → (Baseline, +CRT), ↑
PAPER_RHO = numbers("crt", "RHO")  # paper dataset → (Baseline, +CRT), ↓

PROTOTYPE_DEFAULT = 64  # K1 = K2 of the paper and of ``crt``
HIGH_DIM_DEFAULT = 1024  # D of the paper and of ``crt``


@dataclass
class CRTStudy(StudyConfig):
    """Parameters of ``notebooks/10_crt.ipynb``: the protocol plus CRT's sweeps. Empty lists skip a table."""

    ablation_datasets: list = field(default_factory=lambda: ["synbirds"])  # datasets of the ablation tables
    ablation_seeds: list = field(default_factory=lambda: [0])  # seeds of the ablation tables
    components: bool = True  # full / −CRT / −CRT−Consistency table
    multi_perspective: bool = True  # K1 and K2 both 1 against the default 64
    shared_ablation: bool = True  # shared prototype bank against two banks
    k1_values: list = field(default_factory=lambda: [1])  # K1 sweep (separate banks, K2 at 64); 64 is always added
    k2_values: list = field(default_factory=lambda: [1])  # K2 sweep (separate banks, K1 at 64); 64 is always added
    lambda2_values: list = field(default_factory=lambda: [0.0])  # λ2 sweep; 0.9 (the default run) is always added
    batch_sizes: list = field(
        default_factory=lambda: [32]
    )  # total batch N (P·M) at the protocol M; the protocol batch is always added
    dim_pairs: list = field(
        default_factory=lambda: [[32, 64]]
    )  # (d, D) pairs scored on both branches; (128, 1024) is added
    backbones: list = field(
        default_factory=lambda: ["test_vit"]
    )  # MS vs +CRT per backbone; the protocol backbone is added
    complexity_backbones: list = field(
        default_factory=lambda: ["dml_convnet", "test_resnet", "test_vit"]
    )  # params/FLOPs table
    complexity_image_size: int = 227  # pixels of the params/FLOPs count (227 as in the paper)
    geometry_splits: list = field(default_factory=lambda: ["test"])  # ESD/ρ on these splits (test, train)
    geometry_drop_first: list = field(
        default_factory=lambda: [0, 1]
    )  # ρ with these many leading singular values dropped
    heatmap_prototypes: int = 8  # prototypes shown in the code heat maps
    tsne_classes: int = 5  # test classes in the t-SNE plots

    def ablation_protocol(self) -> ProtocolConfig:
        """The protocol with the ablation seeds (the ablation tables run on ``ablation_datasets``)."""
        return self.protocol.with_seeds(self.ablation_seeds)


# ----------------------------------------------------------------------------------------------
# Variants and their runs
# ----------------------------------------------------------------------------------------------
def crt_defaults() -> dict[str, Any]:
    """CRT's keyword arguments and their defaults (:func:`~dmlstudy.experiments.kit.method_defaults`)."""
    return method_defaults(CRT)


def crt_variant(*, overrides: Mapping[str, Any] | None = None, **method_kwargs: Any) -> tuple[str, dict[str, Any]]:
    """``(name, spec)`` of a CRT variant for :meth:`ProtocolConfig.grid`, named from what differs from the defaults.

    Keyword arguments equal to CRT's defaults are dropped, so equal configurations get equal names (and share
    runs); ``overrides`` are TrainConfig fields (``classes_per_batch``, ``embedding_dim``, ``backbone``, …)
    abbreviated in the name. ``crt_variant()`` is ``("crt", {"method": "crt"})``.
    """
    defaults = crt_defaults()
    unknown = sorted(set(method_kwargs) - set(defaults))
    if unknown:
        raise KeyError(f"crt_variant: unknown CRT arguments {unknown}; valid: {sorted(defaults)}")
    kwargs = {key: value for key, value in sorted(method_kwargs.items()) if defaults[key] != value}
    overrides = dict(overrides or {})
    spec: dict[str, Any] = {"method": "crt", **overrides}
    if kwargs:
        spec["method_kwargs"] = kwargs
    return variant_name("crt", {**overrides, **kwargs}, short=OVERRIDE_TAGS, silent=SILENT_OVERRIDES), spec


def ms_variant(*, overrides: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """``(name, spec)`` of the MS baseline (``ms`` when there are no overrides)."""
    overrides = dict(overrides or {})
    return variant_name("ms", overrides, short=OVERRIDE_TAGS, silent=SILENT_OVERRIDES), {"method": "ms", **overrides}


OVERRIDE_TAGS = {"classes_per_batch": "P", "embedding_dim": "d"}  # TrainConfig overrides abbreviated in run names
SILENT_OVERRIDES = {"output_stride"}  # implied by the backbone name


def backbone_overrides(name: str, protocol: ProtocolConfig) -> dict[str, Any]:
    """TrainConfig overrides for a backbone: none for the protocol's own, output stride 16 for ResNets."""
    if name == protocol.backbone:
        return {}
    overrides: dict[str, Any] = {"backbone": name}
    if "resnet" in name:
        overrides["output_stride"] = 16
    return overrides


def component_variants() -> dict[str, dict]:
    """Full CRT, "−CRT" (pooled heads, L_CON kept), "−CRT−Consistency" (= ``ms``)."""
    return dict([crt_variant(), crt_variant(use_crt=False), ms_variant()])


def k_sweep_variants(values: Sequence[int], *, branch: int) -> dict[int, tuple[str, dict]]:
    """K1 (branch 1) or K2 (branch 2) sweep with separate banks, the other K at 64; 64 always included."""
    key = f"K{branch}"
    return {k: crt_variant(shared=False, **{key: int(k)}) for k in with_reference(values, PROTOTYPE_DEFAULT)}


def lambda2_variants(values: Sequence[float]) -> dict[float, tuple[str, dict]]:
    """λ2 sweep; the default 0.9 (the ``crt`` run) always included."""
    return {float(v): crt_variant(lambda_con=float(v)) for v in with_reference([float(v) for v in values], 0.9)}


def batch_variants(batch_sizes: Sequence[int], protocol: ProtocolConfig) -> dict[int, tuple[str, dict]]:
    """Batch-size sweep at the protocol's M: N = P·M; the protocol batch (the ``crt`` run) always included."""
    m = protocol.samples_per_class
    reference = protocol.classes_per_batch * m
    out = {}
    for n in with_reference([int(n) for n in batch_sizes], reference):
        if n % m or n < 2 * m:
            raise ValueError(f"batch_sizes: {n} is not a multiple P·M of samples_per_class M = {m} with P ≥ 2")
        overrides = {} if n == reference else {"classes_per_batch": n // m}
        out[n] = crt_variant(overrides=overrides)
    return out


def dim_variants(pairs: Sequence[Sequence[int]], protocol: ProtocolConfig) -> dict[tuple[int, int], tuple[str, dict]]:
    """(d, D) pairs; (protocol d, 1024) — the ``crt`` run — always included."""
    out = {}
    for d, high in with_reference(
        [tuple(int(v) for v in p) for p in pairs], (protocol.embedding_dim, HIGH_DIM_DEFAULT)
    ):
        overrides = {} if d == protocol.embedding_dim else {"embedding_dim": d}
        out[(d, high)] = crt_variant(overrides=overrides, high_dim=high)
    return out


def backbone_variants(backbones: Sequence[str], protocol: ProtocolConfig) -> dict[str, dict[str, tuple[str, dict]]]:
    """Per backbone: MS and CRT on it (the protocol backbone's pair is ``ms`` / ``crt``)."""
    names = [protocol.backbone, *[b for b in backbones if b != protocol.backbone]]
    return {
        name: {
            "ms": ms_variant(overrides=backbone_overrides(name, protocol)),
            "crt": crt_variant(overrides=backbone_overrides(name, protocol)),
        }
        for name in names
    }


# ----------------------------------------------------------------------------------------------
# Measurements on finished runs: evaluation splits, branch scores
# ----------------------------------------------------------------------------------------------
def evaluation_split(config: TrainConfig, split: str):
    """The ``split`` ("train"/"test") of a run's dataset with the test transforms, restricted as in the run."""
    root = Path(config.data_root or data_root()) / config.dataset
    dataset = build_dataset(config.dataset, root, split, transform=build_transforms(config.image_size, train=False))
    count = config.train_classes if split == "train" else config.test_classes
    if 0 < count < dataset.num_classes:
        indices = np.flatnonzero(dataset.labels < count)
        subset = Subset(dataset, indices.tolist())
        subset.labels, subset.num_classes = dataset.labels[indices], count
        return subset
    return dataset


def split_embeddings(result: RunResult, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Branch-1 embeddings and labels of a run on ``split`` (test: the stored ones; train: computed now)."""
    if split == "test":
        return result.embeddings["embeddings"], result.embeddings["labels"]
    dataset = evaluation_split(result.config, split)
    return embed(
        result.method, dataset, batch_size=result.config.eval_batch_size, device=device_of(result.method)
    ), np.asarray(dataset.labels)


def branch_scores(result: RunResult, *, branch: int) -> dict[str, float]:
    """Retrieval metrics of one branch of a trained CRT run on its evaluation split (branch 1 = the run's own)."""
    if branch == 1:
        return dict(result.metrics)
    query = evaluation_split(result.config, "test")
    embeddings = embed(
        BranchEmbedder(result.method, branch),
        query,
        batch_size=result.config.eval_batch_size,
        device=device_of(result.method),
    )
    ks = tuple(result.config.recall_ks) or evaluation_protocol(result.config.dataset).recall_ks
    return metric_functions.retrieval_metrics(embeddings, np.asarray(query.labels), ks=ks)


# ----------------------------------------------------------------------------------------------
# Complexity: parameters and FLOPs
# ----------------------------------------------------------------------------------------------
def _flops(function, *args) -> int:
    with FlopCounterMode(display=False) as counter:
        function(*args)
    return int(counter.get_total_flops())


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def complexity_row(
    backbone_name: str, *, image_size: int = 227, embedding_dim: int = 128, output_stride: int | None = None
) -> dict[str, Any]:
    """Parameters (M) and GFLOPs of one image: the backbone, MS (backbone + FC) and CRT (branch 1 at test
    time; both branches in training). A ViT whose patch size does not divide ``image_size`` is counted at
    the nearest smaller multiple (column ``px``)."""
    torch.manual_seed(0)
    size = image_size
    kwargs = {"output_stride": output_stride} if output_stride else {}
    backbone = build_backbone(backbone_name, image_size=size, **kwargs).eval()
    patch = getattr(getattr(backbone.model, "patch_embed", None), "patch_size", None)
    if patch is not None:
        size = image_size - image_size % int(patch[0] if isinstance(patch, (tuple, list)) else patch)
        backbone = build_backbone(backbone_name, image_size=size, **kwargs).eval()
    image = torch.randn(1, 3, size, size)
    ms = build_method("ms", backbone=backbone, embedding_dim=embedding_dim, num_classes=2).eval()
    crt = build_method("crt", backbone=backbone, embedding_dim=embedding_dim, num_classes=2).eval()
    with torch.no_grad():
        grid = tuple(backbone(image).shape[2:])
        row = {
            "backbone": backbone_name,
            "px": size,
            "output stride": output_stride or "own",
            "grid": "×".join(map(str, grid)),
            "backbone params (M)": _count(backbone) / 1e6,
            "MS params (M)": _count(ms) / 1e6,
            "+CRT params, test (M)": (_count(crt) - _count(crt.heads[1])) / 1e6,
            "+CRT params, train (M)": _count(crt) / 1e6,
            "backbone GFLOPs": _flops(backbone, image) / 1e9,
            "MS GFLOPs": _flops(ms, image) / 1e9,
            "+CRT GFLOPs, test": _flops(crt, image) / 1e9,
            "+CRT GFLOPs, train fwd": _flops(crt.embed_branches, image) / 1e9,
        }
    return row


COMPLEXITY_OUTPUT_STRIDE = {
    "test_resnet": 16
}  # as trained in the study; full-size ResNets at their own stride 32, as in the paper
