"""The study kit: what every study notebook shares, in one place. Per-paper modules (``crt``, ``diml``,
``cross_attention``, ``dgcrl``) keep only their paper's specifics; ``compare`` and ``explore`` use this kit,
the method registry and :mod:`dmlstudy.plots`, never a paper module.

* runs of a grid of variants and the lookup of one (:func:`run_variants`, :func:`find_run`; variants themselves are
  named in one place, :func:`dmlstudy.experiments.ablations.variant`);
* mean ± std tables and their lookups (:func:`summary`, :func:`lookup`);
* the papers' numbers beside ours (the verdict rule itself is :mod:`dmlstudy.verdicts`);
* the paper dataset each stand-in stands beside (:func:`paper_dataset`) and a paper's table as it prints it;
* the embedding geometry table, projections (t-SNE / UMAP) and the diagram boxes and arrows;
* the training step of several variants timed side by side (:func:`step_seconds`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from torch.utils.data import Subset

from dmlstudy import metrics as metric_functions
from dmlstudy import plots
from dmlstudy.config import TypedConfig
from dmlstudy.data import build_dataset, build_transforms
from dmlstudy.explanations import explanation_figure
from dmlstudy.findings.numbers import PAPER_DATASET, numbers
from dmlstudy.metrics import nearest_neighbors
from dmlstudy.paths import data_root
from dmlstudy.run.compute import autocast_context, autocast_dtype, resolve_device
from dmlstudy.run.data import load_datasets, training_class_count
from dmlstudy.run.evaluation import embed
from dmlstudy.run.protocol import ProtocolConfig
from dmlstudy.run.train import RunResult, TrainConfig, build_optimizer
from dmlstudy.study.grids import mean_std_table, results_frame, run_grid
from dmlstudy.study.report import mean_std_text


@dataclass
class StudyConfig(TypedConfig):
    """The base of every study notebook's config: the shared protocol as one parameter, a mapping of
    :class:`ProtocolConfig` fields, next to the notebook's own parameters."""

    protocol: ProtocolConfig = field(
        default_factory=ProtocolConfig
    )  # the shared protocol: ProtocolConfig fields (dmlstudy/run/protocol.py); left out: CI-sized


NO_EXPLANATION = "no explanation for this method"
MAX_PROJECTION_POINTS = 4095
TSNE_ITERATIONS = (
    500  # 250 early-exaggeration + 250 free steps: settled for a few thousand points, half the default cost
)


# ----------------------------------------------------------------------------------------------
# Variant grids and runs
# ----------------------------------------------------------------------------------------------
def run_variants(
    protocol: ProtocolConfig, variants: Mapping[str, Mapping[str, Any]], *, datasets: Iterable[str] | None = None
) -> list[tuple[str, RunResult]]:
    """Train (or load) every variant × dataset × seed of ``protocol``."""
    return run_grid(protocol.grid(variants, datasets=datasets), workers=protocol.workers)


def find_run(results: Sequence[tuple[str, RunResult]], variant: str, *, dataset: str | None = None) -> RunResult:
    """The first run of ``variant`` (on ``dataset`` when given)."""
    for name, result in results:
        if name == variant and (dataset is None or result.config.dataset == dataset):
            return result
    raise KeyError(
        f"no run of variant {variant!r}{f' on {dataset!r}' if dataset else ''} among {sorted({n for n, _ in results})}"
    )


def method_defaults(method_class: type) -> dict[str, Any]:
    """A method's keyword arguments and their defaults, read from its class signature (the backbone, the
    embedding size and the class count, which every run sets, left out): what a study's variants differ from."""
    skip = {"backbone", "embedding_dim", "num_classes"}
    return {
        name: spec.default
        for name, spec in inspect.signature(method_class.__init__).parameters.items()
        if name not in skip and spec.default is not inspect.Parameter.empty
    }


def kwargs_json(spec: Mapping[str, Any]) -> str:
    """A variant's method kwargs and overrides as one JSON line (for a notebook's variant listing)."""
    return json.dumps({k: v for k, v in spec.items() if k != "method"}, sort_keys=True)


def cache_key(settings: Mapping[str, Any]) -> str:
    """A short stable key of JSON-able settings, for cache file names in run folders."""
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def device_of(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def embedding_precision(config: TrainConfig) -> dict[str, Any]:
    """How a run's test embeddings are computed where it is evaluated now, as :func:`dmlstudy.run.evaluation.evaluate`
    computes them: under the autocast of its resolved device (bf16 on CUDA by default) and in its memory format.
    Empty for float32 in the default format (every CPU study by default), so the re-ranking caches written before
    this entered their keys stay valid; otherwise it enters them, so a run re-ranked at another precision is
    re-ranked again."""
    dtype = autocast_dtype(config, resolve_device(config.device))
    return {
        **({"autocast": str(dtype).removeprefix("torch.")} if dtype is not None else {}),
        **({"channels_last": True} if config.channels_last else {}),
    }


def evaluation_sets(result: RunResult, *, grid_sizes: Sequence[int]) -> dict[str, Any]:
    """Grid embeddings (:class:`dmlstudy.methods.diml.GridEmbeddings`) of a run's query set, and gallery set if
    the dataset has one, at every grid size G: what DIML re-ranking and the transport-plan figures read. The
    embeddings are computed on the run's device and kept on the CPU; ``device`` names the run's device, where a
    re-ranking of them should compute (on a GPU worker, the GPU: re-ranking on the CPU left it idle). They are
    computed at the precision of the run's own test embeddings (:func:`embedding_precision`), so their global
    ranking (K = 0) is the run's test ranking, and a re-ranking is compared with the R@1 the run reports."""
    from dmlstudy.methods.diml import embed_grid_dataset

    datasets = load_datasets(result.config)
    device = resolve_device(result.config.device)

    def embed(dataset):
        with autocast_context(device, autocast_dtype(result.config, device)):
            return embed_grid_dataset(
                result.method,
                dataset,
                grid_sizes=tuple(grid_sizes),
                batch_size=result.config.eval_batch_size,
                device=device,
                channels_last=result.config.channels_last,
            )

    return {
        "query": embed(datasets["query"]),
        "gallery": embed(datasets["gallery"]) if datasets.get("gallery") is not None else None,
        "device": device,
    }


def top_k_retrievals(embeddings: np.ndarray, query: int, *, top_k: int) -> np.ndarray:
    """Indices of the ``top_k`` nearest test images of ``query`` by cosine similarity (itself excluded)."""
    if not 0 <= query < len(embeddings):
        raise ValueError(f"query: expected an index in [0, {len(embeddings) - 1}], got {query}")
    k = min(top_k, len(embeddings) - 1)
    neighbours, _ = nearest_neighbors(np.asarray(embeddings)[[query]], np.asarray(embeddings), k=k + 1)
    return neighbours[0][neighbours[0] != query][:k]


def explained_retrievals(
    result: RunResult, dataset, queries: Sequence[int], *, retrievals: int, explain: Callable | None = None
) -> plt.Figure | str:
    """Each query of ``dataset`` (the run's test set) with its first ``retrievals`` retrievals by the run's stored
    test embeddings, explained by ``explain(method, images)`` (default the method's own
    :meth:`~dmlstudy.methods.Method.explain`) and drawn by :func:`dmlstudy.explanations.explanation_figure`."""
    explain = explain or (lambda method, images: method.explain(images))
    device = next(result.method.parameters()).device
    explained = []
    for query in queries:
        indices = [query, *top_k_retrievals(result.embeddings["embeddings"], query, top_k=retrievals).tolist()]
        explanation = explain(result.method, torch.stack([dataset[i][0] for i in indices]).to(device))
        explained.append((explanation or f"{result.config.method}: {NO_EXPLANATION}", indices))
    return explanation_figure(explained, dataset)


def evaluation_split(config: TrainConfig, split: str):
    """The ``split`` ("train"/"test") of a run's dataset as images with the test transforms, restricted to the
    run's first ``train_classes`` / ``test_classes`` classes as the run was."""
    root = Path(config.data_root or data_root()) / config.dataset
    dataset = build_dataset(config.dataset, root, split, transform=build_transforms(config.image_size, train=False))
    count = config.train_classes if split == "train" else config.test_classes
    if 0 < count < dataset.num_classes:
        indices = np.flatnonzero(dataset.labels < count)
        subset = Subset(dataset, indices.tolist())
        subset.labels, subset.num_classes = dataset.labels[indices], count
        return subset
    return dataset


def backbone_overrides(name: str, protocol: ProtocolConfig) -> dict[str, Any]:
    """TrainConfig overrides of a run on backbone ``name`` beside the protocol's own: none for the protocol's, and
    output stride 16 for a ResNet (a 4 × 4 grid at 64 px, as the study's network has)."""
    if name == protocol.backbone:
        return {}
    return {"backbone": name, **({"output_stride": 16} if "resnet" in name else {})}


def split_geometry(
    results: Sequence[tuple[str, RunResult]], *, splits: Sequence[str], drop_first: Sequence[int]
) -> pd.DataFrame:
    """One row per run and split: ESD (π_intra/π_inter) and ρ (spectral decay, per ``drop_first``) of its
    embeddings (the test split's stored ones; another split's computed now with the test transforms)."""
    rows = []
    for variant, result in results:
        for split in splits:
            if split == "test":
                embeddings, labels = result.embeddings["embeddings"], result.embeddings["labels"]
            else:
                dataset = evaluation_split(result.config, split)
                embeddings = embed(
                    result.method, dataset, batch_size=result.config.eval_batch_size, device=device_of(result.method)
                )
                labels = np.asarray(dataset.labels)
            row = {"dataset": result.config.dataset, "variant": variant, "split": split, "seed": result.config.seed}
            row["ESD"] = metric_functions.embedding_space_density(embeddings, labels)
            for drop in drop_first:
                row[f"rho (drop_first={drop})"] = metric_functions.spectral_decay(embeddings, drop_first=int(drop))
            rows.append(row)
    return pd.DataFrame(rows)


def initial_gradients(
    protocol: ProtocolConfig, *, dataset: str, variants: Mapping[str, tuple[str, dict]], seed: int = 0
) -> pd.DataFrame:
    """The gradient norm reaching the test-time embedding layer φ and the first trained convolution at
    initialisation, per variant (label → ``(name, spec)``), on one class-balanced training batch of ``protocol``:
    the same seed, so the same backbone and φ weights for every variant."""
    from dmlstudy.data import ClassBalancedBatchSampler
    from dmlstudy.run.model import build_model

    first = next(iter(variants.values()))
    train = load_datasets(protocol.train_config(dataset=dataset, seed=seed, name=first[0], **first[1]))["train"]
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
        method = build_model(protocol.train_config(dataset=dataset, seed=seed, name=name, **spec), train.num_classes)
        loss, _ = method.train().loss(images, labels)
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


# ----------------------------------------------------------------------------------------------
# Mean ± std tables
# ----------------------------------------------------------------------------------------------
def recall_columns(frame: pd.DataFrame, *, count: int = 4) -> list[str]:
    """The first ``count`` Recall@K columns present, by K."""
    ks = sorted(int(c[2:]) for c in frame.columns if c.startswith("R@") and c[2:].isdigit() and frame[c].notna().any())
    return [f"R@{k}" for k in ks[:count]]


def summary(results: Sequence[tuple[str, RunResult]], *, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean ± std over seeds per (dataset, variant), metrics in % (default: four Recall@K and MAP@R)."""
    frame = results_frame(list(results))
    return mean_std_table(frame, metrics=list(metrics or [*recall_columns(frame), "MAP@R"]))


def lookup(table: pd.DataFrame, dataset: str, variant: str, metric: str = "R@1") -> tuple[float, float, int]:
    """(mean, std, runs) of ``metric`` for one row of a mean ± std table."""
    row = table[(table["dataset"] == dataset) & (table["variant"] == variant)]
    if row.empty:
        raise KeyError(f"no runs of variant {variant!r} on {dataset!r}")
    row = row.iloc[0]
    return float(row[f"{metric}_mean"]), float(row[f"{metric}_std"]), int(row["runs"])


def without_numbers(table: pd.DataFrame) -> pd.DataFrame:
    """The display columns of a mean ± std table (``_mean`` / ``_std`` number columns dropped)."""
    return table[[c for c in table.columns if not c.endswith(("_mean", "_std"))]]


def report(protocol: ProtocolConfig, table: pd.DataFrame, sentences: Sequence[str], *, title: str) -> list[str]:
    """Print the protocol line, the table under its title, then its computed readings; return the readings."""
    datasets = list(dict.fromkeys(table["dataset"])) if "dataset" in table else []
    print(f"{title}\nprotocol: {protocol.protocol_text()}" + (f", datasets {datasets}" if datasets else ""))
    print(table.to_string(index=False))
    for sentence in sentences:
        print("→", sentence)
    return [f"{title} — {sentence}" for sentence in sentences]


# ----------------------------------------------------------------------------------------------
# The papers' numbers beside ours
# ----------------------------------------------------------------------------------------------
def paper_dataset(dataset: str, default: str = "") -> str:
    """The paper dataset an embedded set stands beside (SynBirds → CUB, Glyphs → Cars)."""
    return PAPER_DATASET.get(dataset, default)


def paper_frame(paper: str, name: str) -> pd.DataFrame:
    """A table of a paper's numbers (``papers.yaml``) as it prints it: one row per outer key, a column per inner
    key (or one ``value`` column), tuples written ``a / b``."""

    def shown(value: Any) -> Any:
        return " / ".join(f"{v:g}" for v in value) if isinstance(value, tuple) else value

    values = numbers(paper, name)
    return pd.DataFrame(
        {"": key} | ({k: shown(v) for k, v in value.items()} if isinstance(value, dict) else {"value": shown(value)})
        for key, value in values.items()
    )


# ----------------------------------------------------------------------------------------------
# Geometry: embedding-space density and spectral decay across methods
# ----------------------------------------------------------------------------------------------
GEOMETRY = {
    "ESD": "ESD = π_intra / π_inter (↑ in the CRT paper's reading)",
    "rho": "ρ, spectral decay, drop_first = 0 (↓)",
}
WEAK_CORRELATION = 0.3  # |rank correlation| below this: no clear relation (few methods, noisy means)


def geometry_summary(
    frame: pd.DataFrame,
    *,
    metric: str,
    paper: Mapping[str, tuple[float, float]],
    pair: tuple[str, str],
    label: Callable[[str], str] = str,
    decimals: int = 3,
) -> pd.DataFrame:
    """Rows = variants, columns = datasets: mean ± std over seeds of ``metric`` (``ESD`` or ``rho``) of the runs'
    test embeddings, with the paper's numbers of the ``pair`` (baseline, method) beside (``paper``: paper
    dataset → (baseline, method))."""
    if metric not in GEOMETRY:
        raise ValueError(f"geometry_summary: metric must be one of {sorted(GEOMETRY)}, got {metric!r}")
    stats = frame.groupby(["variant", "dataset"], sort=False)[metric].agg(["mean", "std", "count"]).reset_index()
    stats["std"] = stats["std"].fillna(0.0)
    datasets = list(dict.fromkeys(frame["dataset"]))
    out = []
    for variant in dict.fromkeys(frame["variant"]):
        line: dict[str, Any] = {"method": label(variant), "variant": variant}
        for dataset in datasets:
            cell = stats[(stats["variant"] == variant) & (stats["dataset"] == dataset)]
            line[dataset] = (
                "–"
                if cell.empty
                else mean_std_text(
                    cell["mean"].iloc[0], cell["std"].iloc[0], int(cell["count"].iloc[0]), decimals=decimals
                )
            )
            line[f"{dataset}_mean"] = math.nan if cell.empty else float(cell["mean"].iloc[0])
        for dataset in datasets:
            values = paper.get(paper_dataset(dataset))
            line[f"paper ({paper_dataset(dataset, '–')})"] = (
                values[pair.index(variant)] if values and variant in pair else "–"
            )
        out.append(line)
    return pd.DataFrame(out)


def rank_correlation(x: pd.Series, y: pd.Series) -> float:
    """Spearman's ρ as the Pearson correlation of ranks (ties averaged); NaN with fewer than 3 points."""
    keep = x.notna() & y.notna()
    if keep.sum() < 3:
        return math.nan
    return float(x[keep].rank().corr(y[keep].rank()))


def agreement(correlation: float, *, expected: int) -> str:
    """ "agrees" / "disagrees" with the expected sign, or "shows no clear relation" when |r| < :data:`WEAK_CORRELATION`."""
    if math.isnan(correlation) or abs(correlation) < WEAK_CORRELATION:
        return "shows no clear relation"
    return "agrees" if np.sign(correlation) == expected else "disagrees"


def geometry_readings(frame: pd.DataFrame, *, pair: tuple[str, str]) -> list[str]:
    """Per dataset: did CRT raise ESD and lower ρ against MS (the CRT paper's claim; ``pair``: the runs of its
    baseline and its method), and how do ESD and ρ rank with R@1 across all variants (Roth et al.: denser,
    flatter-spectrum embeddings generalise better)?"""
    means = frame.groupby(["dataset", "variant"], sort=False)[["ESD", "rho", "R@1"]].mean()
    sentences = []
    for dataset in dict.fromkeys(frame["dataset"]):
        group = means.loc[dataset]
        baseline, method = pair
        if set(pair) <= set(group.index):
            esd = group.loc[method, "ESD"] - group.loc[baseline, "ESD"]
            rho = group.loc[method, "rho"] - group.loc[baseline, "rho"]
            held = [name for name, ok in (("ESD up", esd > 0), ("ρ down", rho < 0)) if ok]
            sentences.append(
                f"{dataset}: CRT − MS: ESD {esd:+.3f}, ρ {rho:+.3f}; the CRT paper has ESD up and ρ down on all four of its datasets → "
                + ("both held." if len(held) == 2 else f"only {held[0]} held." if held else "neither held.")
            )
        if len(group) >= 3:
            esd_r1, rho_r1 = rank_correlation(group["ESD"], group["R@1"]), rank_correlation(group["rho"], group["R@1"])
            sentences.append(
                f"{dataset}, across {len(group)} methods: rank correlation with R@1 is {esd_r1:+.2f} for ESD and {rho_r1:+.2f} for ρ "
                f"(generalisation by density and spectral decay predicts > 0 for ESD and < 0 for ρ → "
                f"ESD {agreement(esd_r1, expected=1)}, ρ {agreement(rho_r1, expected=-1)})."
            )
    return sentences


# ----------------------------------------------------------------------------------------------
# Projections: t-SNE and UMAP
# ----------------------------------------------------------------------------------------------
def first_seed_embeddings(
    results: Sequence[tuple[str, RunResult]], *, dataset: str | None = None, variants: Sequence[str] | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Variant → (test embeddings, labels) of its first run (the lowest seed) on ``dataset`` (the first run's
    dataset when None), for ``variants`` only when given, in the order the variants were run."""
    chosen: dict[str, RunResult] = {}
    for variant, result in results:
        dataset = dataset or result.config.dataset
        if variants is not None and variant not in variants:
            continue
        if result.config.dataset == dataset and (
            variant not in chosen or result.config.seed < chosen[variant].config.seed
        ):
            chosen[variant] = result
    return {
        variant: (result.embeddings["embeddings"], result.embeddings["labels"]) for variant, result in chosen.items()
    }


def projection_subset(
    labels: np.ndarray, *, classes: int, max_points: int = MAX_PROJECTION_POINTS, seed: int = 0
) -> np.ndarray:
    """Sorted indices of every image of the first ``classes`` classes (by label value), seeded-subsampled to at
    most ``max_points``: the same points in every panel."""
    labels = np.asarray(labels)
    keep = np.flatnonzero(np.isin(labels, np.unique(labels)[:classes]))
    if len(keep) > max_points:
        keep = np.sort(np.random.default_rng(seed).choice(keep, size=max_points, replace=False))
    return keep


def project(embeddings: np.ndarray, *, kind: str, seed: int = 0, iterations: int = TSNE_ITERATIONS) -> np.ndarray:
    """2-D UMAP (cosine metric, 15 neighbours) or t-SNE (PCA init, cosine metric, ``iterations`` steps) of
    ``N × d`` embeddings, ``random_state=seed``."""
    n = len(embeddings)
    if kind == "umap":
        import umap

        return umap.UMAP(
            n_components=2, n_neighbors=min(15, n - 1), metric="cosine", random_state=seed, n_jobs=1
        ).fit_transform(embeddings)
    if kind == "tsne":
        from sklearn.manifold import TSNE

        return TSNE(
            n_components=2,
            init="pca",
            metric="cosine",
            perplexity=min(30.0, (n - 1) / 3),
            max_iter=iterations,
            random_state=seed,
        ).fit_transform(embeddings)
    raise ValueError(f"project: kind must be 'umap' or 'tsne', got {kind!r}")


def projection_figure(
    embeddings: Mapping[str, tuple[np.ndarray, np.ndarray]],
    *,
    kind: str,
    classes: int,
    seed: int = 0,
    title: str = "",
    label: Callable[[str], str] = str,
    iterations: int = TSNE_ITERATIONS,
) -> plt.Figure:
    """One framed panel per entry (titled ``label(name)``): the 2-D ``kind`` projection of the same subset of test
    images (:func:`projection_subset`), one colour per class (the study's colour-blind-safe
    :data:`~dmlstudy.plots.PALETTE` for up to 10 classes), the axes' units left off (a projection's coordinates
    mean nothing); ``title`` above, after the point count and what the colours are."""
    from matplotlib.colors import ListedColormap

    names = list(embeddings)
    columns = min(4, max(len(names), 1))
    rows = int(math.ceil(max(len(names), 1) / columns))
    figure, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 3.4 * rows), squeeze=False)
    for axis in axes.flat[len(names) :]:
        axis.axis("off")  # an empty place in the last row
    colours = ListedColormap(plots.PALETTE[:classes]) if classes <= len(plots.PALETTE) else "tab20"
    for axis, name in zip(axes.flat, names):
        vectors, labels = embeddings[name]
        keep = projection_subset(labels, classes=classes, seed=seed)
        points = project(np.asarray(vectors)[keep], kind=kind, seed=seed, iterations=iterations)
        codes = np.searchsorted(np.unique(labels[keep]), labels[keep])
        axis.scatter(
            points[:, 0], points[:, 1], c=codes, cmap=colours, vmin=0, vmax=max(classes - 1, 1), s=5, linewidths=0
        )
        axis.set(xticks=[], yticks=[])
        for spine in axis.spines.values():
            spine.set(visible=True, color="0.4", linewidth=0.8)
        axis.set_title(label(name), fontsize=9)
    shown = len(projection_subset(next(iter(embeddings.values()))[1], classes=classes, seed=seed)) if names else 0
    figure.suptitle(
        f"{'UMAP' if kind == 'umap' else 't-SNE'}: {shown} test images of the first {classes} classes, "
        "coloured by class (one colour per class, the same in every panel)" + (f"\n{title}" if title else "")
    )
    figure.tight_layout()
    return figure


# ----------------------------------------------------------------------------------------------
# The training step of several variants, timed side by side
# ----------------------------------------------------------------------------------------------
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def step_seconds(
    protocol: ProtocolConfig,
    variants: Mapping[str, Mapping[str, Any]],
    *,
    dataset: str = "",
    num_classes: int = 0,
    rounds: int = 3,
    seed: int = 0,
    clock: str = "wall",
) -> dict[str, float]:
    """Median seconds of one training step (forward, loss, backward, optimizer step) per variant, measured interleaved
    in this process (one warm-up step each, the order reversed every other round) on one random batch of the run's
    shape. Each model and optimizer is built as its run on ``dataset`` (the protocol's first) builds them
    (:meth:`ProtocolConfig.grid`, :func:`~dmlstudy.run.model.build_model`,
    :func:`~dmlstudy.run.train.build_optimizer`), with ``num_classes`` training classes (default: the run's).

    ``clock="cpu"`` measures this process's CPU time with torch on one thread (restored afterwards): much steadier
    than wall time on a machine shared with other jobs; the ratios between variants are what it is for."""
    from dmlstudy.run.model import build_model

    if clock not in CLOCKS:
        raise ValueError(f"step_seconds: clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    configs = dict(protocol.with_seeds([seed]).grid(variants, datasets=[dataset or protocol.datasets[0]]))
    first = next(iter(configs.values()))
    if first.stem_views:
        raise ValueError("step_seconds times a step on images; runs on cached stem activations are not supported")
    classes = num_classes or training_class_count(first)
    shape = (first.classes_per_batch * first.samples_per_class, 3, first.image_size, first.image_size)
    images = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    labels = torch.arange(first.classes_per_batch).repeat_interleave(first.samples_per_class) % classes
    models = {name: build_model(config, classes) for name, config in configs.items()}
    optimizers = {name: build_optimizer(configs[name], model)[0] for name, model in models.items()}
    timings: dict[str, list[float]] = {name: [] for name in configs}
    threads, now = torch.get_num_threads(), CLOCKS[clock]
    if clock == "cpu":
        torch.set_num_threads(1)
    try:
        for round_index in range(rounds + 1):
            for name in list(configs) if round_index % 2 == 0 else list(reversed(configs)):
                started = now()
                loss, _ = models[name].loss(images, labels)
                optimizers[name].zero_grad(set_to_none=True)
                loss.backward()
                optimizers[name].step()
                if round_index:
                    timings[name].append(now() - started)
    finally:
        torch.set_num_threads(threads)
    return {name: float(np.median(values)) for name, values in timings.items()}
