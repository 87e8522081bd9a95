"""Notebook 10 (CRT, seed 001): the study config, the runs of every table, the tables, and the figures.

The notebook ``notebooks/10_crt.ipynb`` calls only the functions here. Run names follow the protocol:
``<dataset>-<variant>-seed<seed>``; the plain MS baseline is the variant ``ms`` and CRT with its defaults
is ``crt`` (the comparison notebook reuses both). Every other variant is named from what differs from
those defaults (:func:`crt_variant`), so two tables asking for the same configuration share one run
(e.g. K1 = 64 of the K1 sweep and "w/o shared weights" are both ``crt-shared=False``).

Decisions (reported in the notebook):

* The K1 and K2 sweeps use separate prototype banks (``shared=False``; sharing needs K1 = K2), the other
  branch at its default 64. The paper's K1 table must have done the same: its K1 = 64 row (75.96) is its
  "w/o shared weights" result.
* The batch sweep changes P (classes per batch) at the protocol's M (images per class): N = P · M.
* Each sweep includes the paper's reference point (K = 64, λ2 = 0.9, the protocol batch, (d, D) = (128,
  1024)), so a one-value sweep already compares two settings.
* ResNet-type backbones are built with output stride 16 (a 4 × 4 grid at 64 px); ViTs get ``img_size``.
* Complexity: parameters and FLOPs (``torch.utils.flop_counter``, 2 FLOPs per multiply-add) of one image at
  the paper's 227 px; ViTs with 16-px patches cannot take 227 px and are counted at 224 px (said in the
  table).
* Paper numbers are on real data with ImageNet-pretrained backbones (MiT-B1 for the ablations, CUB); they
  orient the reader, they are not targets. SynBirds is put beside CUB and Glyphs beside Cars.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from torch.utils.data import Subset
from torch.utils.flop_counter import FlopCounterMode

from dmlstudy import metrics as metric_functions
from dmlstudy.data import build_dataset, build_transforms, evaluation_protocol
from dmlstudy.experiments.kit import (
    box,
    device_of,
    link,
    lookup,
    paper_column,
    paper_dataset,
    projection_figure,
    summary,
    variant_name,
    with_reference,
    without_numbers,
)
from dmlstudy.experiments.papers import numbers
from dmlstudy.experiments.protocol import ProtocolConfig, StudyConfig, results_frame
from dmlstudy.methods import build_method
from dmlstudy.methods.crt import CRT, BranchEmbedder
from dmlstudy.models import build_backbone
from dmlstudy.paths import data_root
from dmlstudy.report import mean_std_text
from dmlstudy.run_evaluation import embed
from dmlstudy.train import RunResult, TrainConfig
from dmlstudy.verdicts import effect_sentence, judge, paired_differences

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
    """CRT's keyword arguments and their defaults (from the class signature)."""
    skip = {"backbone", "embedding_dim", "num_classes"}
    return {
        name: spec.default
        for name, spec in inspect.signature(CRT.__init__).parameters.items()
        if name not in skip and spec.default is not inspect.Parameter.empty
    }


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
# Tables and their one-line readings
# ----------------------------------------------------------------------------------------------
def _display(
    table: pd.DataFrame,
    labels: Mapping[str, Any],
    paper: Mapping[Any, Any],
    *,
    label: str = "setting",
    paper_label: str = "paper R@1",
) -> pd.DataFrame:
    """``table`` with a readable setting column and the paper's number per setting, in ``labels`` order."""
    order = {variant: i for i, variant in enumerate(labels)}
    shown = table[table["variant"].isin(order)].copy()
    shown["_order"] = shown["variant"].map(order)
    shown = shown.sort_values(["dataset", "_order"], kind="stable")
    shown.insert(1, label, [labels[v] for v in shown["variant"]])
    shown[paper_label] = [paper.get(labels[v], "–") for v in shown["variant"]]
    columns = [c for c in shown.columns if not c.endswith(("_mean", "_std")) and c != "_order"]
    return shown[columns].reset_index(drop=True)


def main_table(results: list[tuple[str, RunResult]]) -> tuple[pd.DataFrame, list[str]]:
    """MS vs +CRT per dataset (mean ± std), the paper's MiT-B1 numbers beside, and one sentence per dataset."""
    table, frame = summary(results), results_frame(results)
    sentences = []
    for dataset in dict.fromkeys(table["dataset"]):
        paper = PAPER_BASELINE_VS_CRT.get(paper_dataset(dataset), {})
        ours = paired_differences(frame, dataset, "crt", "ms")
        sentences.append(
            effect_sentence(f"{dataset}: +CRT − MS", ours=ours, paper=paper["crt"] - paper["ms"] if paper else None)
        )
    shown = paper_column(table, PAPER_BASELINE_VS_CRT, label=lambda name: f"paper R@1 ({name}, MiT-B1)")
    return without_numbers(shown), sentences


def components_table(results: list[tuple[str, RunResult]]) -> tuple[pd.DataFrame, list[str]]:
    """Full / −CRT / −CRT−Consistency (paper's component table)."""
    table, frame = summary(results), results_frame(results)
    names = dict([crt_variant(), crt_variant(use_crt=False), ms_variant()])
    full, minus_crt, plain = list(names)
    labels = {full: "crt", minus_crt: "−CRT", plain: "−CRT−Consistency"}
    sentences = []
    for dataset in dict.fromkeys(table["dataset"]):
        sentences.append(
            effect_sentence(
                f"{dataset}: full − (−CRT) (the coded residual transform)",
                ours=paired_differences(frame, dataset, full, minus_crt),
                paper=PAPER_COMPONENTS["crt"] - PAPER_COMPONENTS["−CRT"],
            )
        )
        sentences.append(
            effect_sentence(
                f"{dataset}: (−CRT) − (−CRT−Consistency) (two branches + L_CON)",
                ours=paired_differences(frame, dataset, minus_crt, plain),
                paper=PAPER_COMPONENTS["−CRT"] - PAPER_COMPONENTS["−CRT−Consistency"],
            )
        )
    return _display(table, labels, PAPER_COMPONENTS), sentences


def pair_table(
    results: list[tuple[str, RunResult]], *, labels: Mapping[str, str], paper: Mapping[str, float], what: str
) -> tuple[pd.DataFrame, list[str]]:
    """A two-setting table (``labels``: variant → label, the paper's preferred setting listed first)."""
    table, frame = summary(results), results_frame(results)
    (first, first_label), (second, second_label) = list(labels.items())
    sentences = []
    for dataset in dict.fromkeys(table["dataset"]):
        ours = paired_differences(frame, dataset, first, second)
        sentences.append(
            effect_sentence(f"{dataset}: {what}", ours=ours, paper=paper[first_label] - paper[second_label])
        )
    return _display(table, labels, paper), sentences


def sweep_table(
    results: list[tuple[str, RunResult]],
    *,
    variants: Mapping[Any, tuple[str, dict]],
    paper: Mapping[Any, float],
    name: str,
) -> tuple[pd.DataFrame, list[str]]:
    """A one-parameter sweep: ours per value beside the paper's; the sentence contrasts the two swept values
    the paper ranks best and worst (among those we ran)."""
    table, frame = summary(results), results_frame(results)
    labels = {variant: value for value, (variant, _) in variants.items()}
    shown = _display(table, labels, paper, label=name)
    sentences = []
    common = [value for value in variants if value in paper]
    for dataset in dict.fromkeys(table["dataset"]):
        if len(common) < 2:
            sentences.append(
                f"{dataset}: fewer than two swept {name} values have a paper number; no direction to check."
            )
            continue
        best, worst = max(common, key=paper.get), min(common, key=paper.get)
        sentences.append(
            effect_sentence(
                f"{dataset}: {name} = {best} − {name} = {worst} (the paper's best − worst of ours)",
                ours=paired_differences(frame, dataset, variants[best][0], variants[worst][0]),
                paper=paper[best] - paper[worst],
            )
        )
    return shown, sentences


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


def dims_table(
    results: list[tuple[str, RunResult]], variants: Mapping[tuple[int, int], tuple[str, dict]]
) -> tuple[pd.DataFrame, list[str]]:
    """(d, D) pairs, each run scored on branch 1 (d) and branch 2 (D), mean ± std over seeds, the paper beside."""
    rows = []
    for variant, result in results:
        for branch in (1, 2):
            scores = branch_scores(result, branch=branch)
            rows.append(
                {
                    "dataset": result.config.dataset,
                    "variant": variant,
                    "branch": branch,
                    "seed": result.config.seed,
                    "R@1": scores["R@1"],
                }
            )
    frame = pd.DataFrame(rows)
    grouped = frame.groupby(["dataset", "variant", "branch"], sort=False)["R@1"]
    stats = grouped.agg(["mean", "std", "count"]).reset_index()
    stats["std"] = stats["std"].fillna(0.0)
    out, sentences = [], []
    for dataset in dict.fromkeys(stats["dataset"]):
        for pair, (variant, _) in variants.items():
            cell = {
                b: stats[(stats["dataset"] == dataset) & (stats["variant"] == variant) & (stats["branch"] == b)].iloc[0]
                for b in (1, 2)
            }
            paper = PAPER_DIMS.get(pair, ("–", "–"))
            out.append(
                {
                    "dataset": dataset,
                    "d": pair[0],
                    "D": pair[1],
                    "runs": int(cell[1]["count"]),
                    "branch 1 R@1 (d)": mean_std_text(
                        100 * cell[1]["mean"], 100 * cell[1]["std"], int(cell[1]["count"])
                    ),
                    "branch 2 R@1 (D)": mean_std_text(
                        100 * cell[2]["mean"], 100 * cell[2]["std"], int(cell[2]["count"])
                    ),
                    "paper branch 1": paper[0],
                    "paper branch 2": paper[1],
                    "_b1": 100 * cell[1]["mean"],
                    "_b2": 100 * cell[2]["mean"],
                }
            )
        rows_here = [row for row in out if row["dataset"] == dataset]
        ours_wins = sum(row["_b2"] > row["_b1"] for row in rows_here)
        paper_rows = [PAPER_DIMS[(row["d"], row["D"])] for row in rows_here if (row["d"], row["D"]) in PAPER_DIMS]
        paper_wins = sum(b2 > b1 for b1, b2 in paper_rows)
        sentences.append(
            f"{dataset}: branch 2 (D) beats branch 1 (d) in {ours_wins}/{len(rows_here)} of our (d, D) pairs; "
            f"the paper's branch 2 wins in {paper_wins}/{len(paper_rows)} of the same pairs → "
            f"{'direction held' if (ours_wins > len(rows_here) / 2) == (paper_wins > len(paper_rows) / 2) else 'direction NOT reproduced'}."
        )
        ds = sorted({row["d"] for row in rows_here})
        if len(ds) >= 2:
            low = next(row for row in rows_here if row["d"] == ds[0])
            high = next(row for row in rows_here if row["d"] == ds[-1])
            paper_low, paper_high = PAPER_DIMS.get((low["d"], low["D"])), PAPER_DIMS.get((high["d"], high["D"]))
            paper_diff = paper_high[0] - paper_low[0] if paper_low and paper_high else None
            branch_1 = frame[frame["branch"] == 1]
            variant_of = {(d, big): name for (d, big), (name, _) in variants.items()}
            ours = paired_differences(
                branch_1, dataset, variant_of[(high["d"], high["D"])], variant_of[(low["d"], low["D"])]
            )
            sentences.append(
                effect_sentence(f"{dataset}: branch 1 at d = {ds[-1]} − d = {ds[0]}", ours=ours, paper=paper_diff)
            )
    table = pd.DataFrame(out)
    return table[[c for c in table.columns if not c.startswith("_")]], sentences


def backbone_table(
    results: list[tuple[str, RunResult]], variants: Mapping[str, Mapping[str, tuple[str, dict]]]
) -> tuple[pd.DataFrame, list[str]]:
    """MS vs +CRT per backbone (ours, with the study's verdict on "+CRT > MS", :func:`verdicts.judge`) and the
    paper's per-backbone gains (CUB, Cars)."""
    table, frame = summary(results), results_frame(results)
    rows, sentences = [], []
    for dataset in dict.fromkeys(table["dataset"]):
        outcomes = []
        for backbone, pair in variants.items():
            ms_stats, crt_stats = lookup(table, dataset, pair["ms"][0]), lookup(table, dataset, pair["crt"][0])
            verdict = judge(paired_differences(frame, dataset, pair["crt"][0], pair["ms"][0]).differences)
            outcomes.append(verdict.outcome)
            rows.append(
                {
                    "dataset": dataset,
                    "backbone": backbone,
                    "runs": ms_stats[2],
                    "MS R@1": mean_std_text(*ms_stats),
                    "+CRT R@1": mean_std_text(*crt_stats),
                    "gain": f"{verdict.mean:+.2f}",
                    "verdict": verdict.text,
                }
            )
        stand_in = paper_dataset(dataset, "CUB")
        paper_wins = sum(values[stand_in][1] > values[stand_in][0] for values in PAPER_BACKBONES.values())
        counts = ", ".join(
            f"{outcomes.count(o)} {o}" for o in ("held", "reversed", "not held", "undecided", "no verdict")
        )
        sentences.append(
            f"{dataset}: +CRT > MS on our {len(variants)} backbones (paired seeds): {counts}; the paper's +CRT beat MS "
            f"on {paper_wins}/{len(PAPER_BACKBONES)} backbones ({stand_in})."
        )
    return pd.DataFrame(rows), sentences


def paper_backbone_table() -> pd.DataFrame:
    """The paper's R@1 of MS and +CRT per (ImageNet-pretrained) backbone on CUB and Cars, and the gains."""
    rows = []
    for name, values in PAPER_BACKBONES.items():
        row = {"backbone": name}
        for dataset in ("CUB", "Cars"):
            ms, crt = values[dataset]
            row.update({f"{dataset} MS": ms, f"{dataset} +CRT": crt, f"{dataset} gain": round(crt - ms, 2)})
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------
# Geometry: embedding-space density and spectral decay
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


def split_geometry_table(
    results: list[tuple[str, RunResult]], *, splits: Sequence[str], drop_first: Sequence[int]
) -> tuple[pd.DataFrame, list[str]]:
    """ESD (π_intra/π_inter) and ρ (spectral decay, per ``drop_first``) of MS vs +CRT, per split, mean ± std."""
    rows = []
    for variant, result in results:
        for split in splits:
            embeddings, labels = split_embeddings(result, split)
            row = {
                "dataset": result.config.dataset,
                "variant": variant,
                "split": split,
                "seed": result.config.seed,
                "ESD": metric_functions.embedding_space_density(embeddings, labels),
            }
            for drop in drop_first:
                row[f"rho (drop_first={drop})"] = metric_functions.spectral_decay(embeddings, drop_first=int(drop))
            rows.append(row)
    frame = pd.DataFrame(rows)
    values = [c for c in frame.columns if c == "ESD" or c.startswith("rho")]
    grouped = frame.groupby(["dataset", "split", "variant"], sort=False)[values]
    means, stds, counts = grouped.mean(), grouped.std().fillna(0.0), grouped.size()
    table = means.round(3).astype(str) + " ± " + stds.round(3).astype(str)
    table.insert(0, "runs", counts)
    table = table.reset_index()
    table["paper ESD ↑"] = [_paper_geometry(PAPER_ESD, d, v) for d, v in zip(table["dataset"], table["variant"])]
    table["paper ρ ↓"] = [_paper_geometry(PAPER_RHO, d, v) for d, v in zip(table["dataset"], table["variant"])]
    sentences = []
    for (dataset, split), group in means.groupby(level=["dataset", "split"], sort=False):
        group = group.droplevel(["dataset", "split"])
        if not {"ms", "crt"} <= set(group.index):
            continue
        paper = PAPER_ESD.get(paper_dataset(dataset))
        paper_rho = PAPER_RHO.get(paper_dataset(dataset))
        esd = group.loc["crt", "ESD"] - group.loc["ms", "ESD"]
        text = [
            f"{dataset} ({split} split): ESD +CRT − MS = {esd:+.3f}"
            + (
                f" (paper {paper[1] - paper[0]:+.2f}: {'held' if np.sign(esd) == np.sign(paper[1] - paper[0]) else 'NOT reproduced'})"
                if paper
                else ""
            )
        ]
        for column in values[1:]:
            rho = group.loc["crt", column] - group.loc["ms", column]
            text.append(
                f"ρ {column[4:]} +CRT − MS = {rho:+.3f}"
                + (
                    f" (paper {paper_rho[1] - paper_rho[0]:+.2f}, drop_first unstated: {'held' if np.sign(rho) == np.sign(paper_rho[1] - paper_rho[0]) else 'NOT reproduced'})"  # noqa: E501
                    if paper_rho
                    else ""
                )
            )
        sentences.append("; ".join(text) + ".")
    return table, sentences


def _paper_geometry(values: Mapping[str, tuple[float, float]], dataset: str, variant: str) -> Any:
    pair = values.get(paper_dataset(dataset))
    if not pair or variant not in ("ms", "crt"):
        return "–"
    return pair[0] if variant == "ms" else pair[1]


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


def complexity_sentences(table: pd.DataFrame) -> list[str]:
    """Per backbone: CRT's extra parameters and FLOPs over MS at test time and in training (the paper names the
    training cost of the two branches as a limitation and reports only backbone sizes)."""
    sentences = []
    for row in table.to_dict("records"):
        sentences.append(
            f"{row['backbone']} at {row['px']} px: +CRT has {row['+CRT params, test (M)'] / row['MS params (M)']:.1f}× the parameters of MS at test time "
            f"and {row['+CRT params, train (M)'] / row['MS params (M)']:.1f}× in training; FLOPs +{100 * (row['+CRT GFLOPs, test'] / row['MS GFLOPs'] - 1):.1f} % "  # noqa: E501
            f"at test time, +{100 * (row['+CRT GFLOPs, train fwd'] / row['MS GFLOPs'] - 1):.1f} % in the training forward pass."
        )
    return sentences


def cost_sentence(results: list[tuple[str, RunResult]], *, cheaper: str, dearer: str) -> str:
    """Measured training cost of two variants from their run records (mean seconds per epoch, parameters)."""
    frame = results_frame(results)
    seconds = frame.groupby("variant")["seconds_per_epoch"].mean()
    parameters = frame.groupby("variant")["parameters"].first()
    return (
        f"cost: {dearer} trains at {seconds[dearer] / seconds[cheaper]:.2f}× the seconds per epoch of {cheaper} "
        f"(timings on a shared machine are noisy) with {parameters[dearer] - parameters[cheaper]:+,d} parameters."
    )


def complexity_table(
    backbones: Sequence[str], *, image_size: int = 227, embedding_dim: int = 128
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Our params/FLOPs per backbone (:func:`complexity_row`) and the paper's table (backbones only)."""
    rows = [
        complexity_row(
            name, image_size=image_size, embedding_dim=embedding_dim, output_stride=COMPLEXITY_OUTPUT_STRIDE.get(name)
        )
        for name in backbones
    ]
    ours = pd.DataFrame(rows).round(3)
    ours["paper backbone (params M, GFLOPs)"] = [
        PAPER_COMPLEXITY.get(PAPER_NAME_OF_BACKBONE.get(name, ""), "–") for name in ours["backbone"]
    ]
    paper = pd.DataFrame(
        [{"backbone": name, "params (M)": p, "FLOPs (G)": f} for name, (p, f) in PAPER_COMPLEXITY.items()]
    )
    return ours, paper


# ----------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------
def transform_figure(method: CRT, *, image_size: int = 64) -> plt.Figure:
    """An annotated diagram of the coded residual transform with the real sizes of ``method``."""
    with torch.no_grad():
        was_training = method.training
        method.eval()
        feature_map = method.backbone(torch.zeros(1, 3, image_size, image_size, device=device_of(method)))
        method.train(was_training)
    channels, height, width = feature_map.shape[1:]
    d, high = method.branch_dims
    figure, axis = plt.subplots(figsize=(13, 4.4))
    axis.set(xlim=(0, 14), ylim=(0, 5.2))
    axis.axis("off")
    image = box(axis, (0.75, 2.5), f"image\n3×{image_size}×{image_size}", width=1.3)
    features = box(
        axis,
        (3.3, 2.5),
        f"backbone map X\n{channels}×{height}×{width}\n= {height * width} tokens x_j",
        width=1.9,
        height=1.1,
    )
    link(axis, image, features, "backbone")
    bank = "one shared bank" if method.shared else "a bank per branch"
    codes = box(
        axis,
        (6.3, 2.5),
        f"codes a_jk =\nsoftplus(x_jᵀc_k)\n{height * width}×{method.K1}\n(K = {method.K1} prototypes c_k,\n{bank})",
        width=2.1,
        height=1.5,
        colour="#fee6ce",
    )
    link(axis, features, codes)
    residual = box(axis, (9.1, 2.5), f"r_k = Σ_j a_jk (x_j − c_k)\n{method.K1}×{channels}", width=2.3, colour="#fee6ce")
    link(axis, codes, residual)
    first = box(axis, (12.3, 4.0), f"f¹ = (1/K) Σ_k Γ¹_k r_k\nd = {d} (test time)", width=2.5, colour="#e5f5e0")
    second = box(axis, (12.3, 1.0), f"f² = (1/K) Σ_k Γ²_k r_k\nD = {high}", width=2.5, colour="#e5f5e0")
    link(axis, residual, first, "Γ¹_k: C → d", shift=(-0.75, 0.0))
    link(axis, residual, second, "Γ²_k: C → D", shift=(-0.75, -0.3))
    axis.text(
        12.3,
        2.5,
        "L_CON = mean |S¹ − S²|\n(batch cosine matrices)",
        ha="center",
        va="center",
        fontsize=8,
        color="#a50f15",
    )
    axis.text(12.3, 4.75, "L_MS(f¹)", ha="center", fontsize=8, color="#a50f15")
    axis.text(12.3, 0.1, "L_MS(f²)", ha="center", fontsize=8, color="#a50f15")
    axis.text(
        6.3, 1.45, "L_DIV = mean over k ≠ j of |cos(c_k, c_j)|", ha="center", va="top", fontsize=8, color="#a50f15"
    )
    axis.set_title("Coded residual transform: L = L_DIV + λ1 (L_MS(f¹) + L_MS(f²)) + λ2 L_CON", fontsize=10)
    return figure


def branch_tsne_figure(result: RunResult, *, classes: int = 10, seed: int = 0) -> plt.Figure:
    """t-SNE (:func:`dmlstudy.experiments.kit.projection_figure`) of branch-2 (D) and branch-1 (d) test
    embeddings of the first ``classes`` test classes of one CRT run."""
    query = evaluation_split(result.config, "test")
    labels = np.asarray(query.labels)
    keep = np.flatnonzero(np.isin(labels, np.unique(labels)[:classes]))
    subset = Subset(query, keep.tolist())
    panels = {}
    for branch in (2, 1):
        embeddings = embed(
            BranchEmbedder(result.method, branch),
            subset,
            batch_size=result.config.eval_batch_size,
            device=device_of(result.method),
        )
        panels[f"branch {branch}: {'D' if branch == 2 else 'd'} = {embeddings.shape[1]}"] = (embeddings, labels[keep])
    return projection_figure(
        panels, kind="tsne", classes=classes, seed=seed, title=f"{result.config.dataset}, CRT's two branches"
    )
