"""The study kit: what every study notebook shares, in one place. Per-paper modules (``crt``, ``diml``,
``cross_attention``, ``dgcrl``) keep only their paper's specifics; ``compare`` and ``explore`` use this kit,
the method registry and :mod:`dmlstudy.plots`, never a paper module.

* variant grids: ``{key: (name, spec)}`` sweeps → ``{name: spec}`` grids → runs (:func:`as_grid`,
  :func:`run_variants`, :func:`with_reference`, :func:`variant_name`, :func:`find_run`);
* mean ± std tables and their lookups (:func:`summary`, :func:`lookup`);
* **the verdict rule** (:func:`judge` of per-seed paired differences, :func:`paired_differences`) and its
  phrasings (:attr:`Verdict.text` for a claim "A > B", :func:`effect_sentence` against a paper's
  number) — swap :func:`judge` to change the rule everywhere;
* the papers' numbers as table columns (:func:`paper_column`, :data:`PAPER_DATASET`);
* the embedding geometry table, projections (t-SNE / UMAP) and the diagram boxes and arrows.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
from scipy import stats

from dmlstudy.experiments.papers import PAPER_DATASET
from dmlstudy.experiments.protocol import ProtocolConfig, mean_std_table, results_frame, run_grid
from dmlstudy.methods import MethodInfo
from dmlstudy.study import PERCENT_METRICS, mean_std_text
from dmlstudy.train import RunResult, TrainConfig, autocast_context, autocast_dtype, load_datasets, resolve_device

Variant = tuple[str, dict]  # (run name, ProtocolConfig.grid spec)
BASELINE: Variant = ("ms", {"method": "ms"})  # the MS baseline every paper compares with
SHARED_VARIANTS: dict[str, dict] = {  # named runs one notebook trains and another shows (same name, same spec)
    "softmax": {"method": "dgcrl", "method_kwargs": {"normalize_scale": False, "margin": 0.0, "decorrelation": "none"}},
}
SHARED_ROWS = {  # how the comparison shows them
    "softmax": MethodInfo(
        "softmax",
        "softmax (DGCRL head, no N-S)",
        "paper",
        "DGCRL's own baseline",
        "DGCRL's head as a plain softmax classifier: no normalize-scale, no margin, no decorrelation (the run of notebook 40)",
    ),
}
MAX_PROJECTION_POINTS = 4095
TSNE_ITERATIONS = (
    500  # 250 early-exaggeration + 250 free steps: settled for a few thousand points, half the default cost
)


# ----------------------------------------------------------------------------------------------
# Variant grids and runs
# ----------------------------------------------------------------------------------------------
def with_reference(values: Iterable[Any], reference: Any) -> list[Any]:
    """The swept values with the reference setting added, sorted, without duplicates (lists compare as tuples)."""
    return sorted(
        {*[tuple(v) if isinstance(v, list) else v for v in values], reference},
        key=lambda v: v if not isinstance(v, (list, tuple)) else tuple(v),
    )


def variant_name(
    prefix: str,
    tags: Mapping[str, Any],
    *,
    short: Mapping[str, str] | None = None,
    silent: Iterable[str] = (),
    show: Callable[[Any], str] = str,
) -> str:
    """``prefix-key=value-…``: a run name from what differs from the defaults, keys abbreviated by ``short``,
    values written by ``show``, keys in ``silent`` left out (implied by another tag)."""
    short = short or {}
    return "-".join(
        [prefix, *[f"{short.get(key, key)}={show(value)}" for key, value in tags.items() if key not in silent]]
    )


def with_baseline(variant: Variant) -> dict[str, dict]:
    """A paper's shared pair as a grid: ``ms`` and the method's default variant (both reused by the comparison)."""
    return dict([BASELINE, variant])


def as_grid(variants: Mapping[Any, Variant]) -> dict[str, dict]:
    """``{value: (name, spec)}`` of a sweep → ``{name: spec}`` for :meth:`ProtocolConfig.grid`."""
    return dict(variants.values())


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


def kwargs_json(spec: Mapping[str, Any]) -> str:
    """A variant's method kwargs and overrides as one JSON line (for a notebook's variant listing)."""
    return json.dumps({k: v for k, v in spec.items() if k != "method"}, sort_keys=True)


def cache_key(settings: Mapping[str, Any]) -> str:
    """A short stable key of JSON-able settings, for cache file names in run folders."""
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def device_of(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def embedding_precision(config: TrainConfig) -> dict[str, Any]:
    """How a run's test embeddings are computed where it is evaluated now, as :func:`dmlstudy.train.evaluate`
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
# The verdict rule: paired seeds, a t-interval, four verdicts declared before the runs
# ----------------------------------------------------------------------------------------------
MARGIN = 1.0  # equivalence margin in the claim's unit (R@1 points); the plans set it as `margin`
CONFIDENCE = 0.95  # two-sided t-interval of the mean paired difference
NO_EFFECT = 0.25  # a paper difference below this many points is read as "no effect" (an equivalence claim)
MAX_SEEDS = 10_000  # seeds-to-decide searches no further ("more than 10000")
VERDICTS = ("held", "reversed", "equivalent", "undecided")


def metric_scale(metric: str) -> float:
    """100 for retrieval metrics stored as fractions (shown and judged in points), 1 for the others."""
    return 100.0 if metric in PERCENT_METRICS else 1.0


@dataclass(frozen=True)
class Paired:
    """Per-seed paired differences ``d_s = A_s − B_s`` of one metric, in points (or the metric's own unit)."""

    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    censoring: Mapping[str, str] = field(default_factory=dict)  # censor()'s arguments: paired_censoring()


def paired_differences(
    frame: pd.DataFrame,
    dataset: str,
    first: str,
    second: str,
    metric: str = "R@1",
    *,
    first_scale: float = 1.0,
    second_scale: float = 1.0,
) -> Paired:
    """``first_scale·A_s − second_scale·B_s`` for every seed ``s`` that both variants ran on ``dataset``.

    ``frame`` has one row per run (``variant``, ``dataset``, ``seed``, ``metric``: :func:`results_frame`);
    retrieval metrics are turned into points (:func:`metric_scale`). Seed s gives both runs the same
    backbone initialisation and batch sequence, so only seeds present on both sides pair; runs with a
    missing value of ``metric`` do not count. A variant with no runs at all raises ``KeyError``. The result
    also names the paired runs whose epochs-to-best the cap cut short (:func:`paired_censoring`), for
    :func:`censor` when ``metric`` is one.
    """
    if metric not in frame.columns:
        raise KeyError(f"paired_differences: no column {metric!r} among {sorted(frame.columns)}")
    here = frame[frame["dataset"] == dataset]
    sides = []
    for variant in (first, second):
        rows = here[here["variant"] == variant]
        if rows.empty:
            raise KeyError(f"no runs of variant {variant!r} on {dataset!r}")
        rows = rows.dropna(subset=[metric])
        sides.append(rows.groupby("seed")[metric].mean() * metric_scale(metric))
    common = sides[0].index.intersection(sides[1].index).sort_values()
    differences = first_scale * sides[0].loc[common] - second_scale * sides[1].loc[common]
    seeds = tuple(int(s) for s in common)
    censoring = paired_censoring(
        frame, dataset, first, second, seeds, first_scale=first_scale, second_scale=second_scale
    )
    return Paired(seeds, tuple(float(d) for d in differences), censoring)


def paired_censoring(
    frame: pd.DataFrame,
    dataset: str,
    first: str,
    second: str,
    seeds: Sequence[int],
    *,
    first_scale: float = 1.0,
    second_scale: float = 1.0,
) -> dict[str, str]:
    """:func:`censor`'s ``can_rise`` / ``can_fall`` for the paired differences ``first_scale·A_s −
    second_scale·B_s`` (:func:`paired_differences`) over ``seeds``: the runs whose ``best_epoch_censored``
    (:func:`results_frame`) is true, by the direction their true value could move Δ (a censored value can
    only be higher than recorded), e.g. ``"5 of 5 triplet runs"``. Rows without the column count as uncensored."""
    if "best_epoch_censored" not in frame.columns:
        return {"can_rise": "", "can_fall": ""}
    here = frame[(frame["dataset"] == dataset) & frame["seed"].isin(list(seeds))]
    moves: dict[str, list[str]] = {"can_rise": [], "can_fall": []}
    for variant, signed_scale in ((first, first_scale), (second, -second_scale)):
        rows = here[here["variant"] == variant].drop_duplicates("seed")
        count = int(rows["best_epoch_censored"].eq(True).sum())
        if count and signed_scale:
            moves["can_rise" if signed_scale > 0 else "can_fall"].append(f"{count} of {len(seeds)} {variant} runs")
    return {direction: ", ".join(texts) for direction, texts in moves.items()}


def t_half_width(sd: float, seeds: int | np.ndarray, *, confidence: float = CONFIDENCE) -> float | np.ndarray:
    """``t_{(1+confidence)/2, n−1} · sd / √n``: the half-width of the t-interval of a mean of ``n`` values."""
    seeds = np.asarray(seeds, dtype=float)
    return stats.t.ppf((1 + confidence) / 2, seeds - 1) * sd / np.sqrt(seeds)


def seeds_to_decide(mean: float, sd: float, *, margin: float = MARGIN, confidence: float = CONFIDENCE) -> int | None:
    """The smallest number of paired seeds n ≥ 2 at which, if the mean ``mean`` and the standard deviation
    ``sd`` of the differences stayed as observed, the t-interval would decide:

        n* = min{ n : h(n) < |Δ| }  ∪  { n : |Δ| + h(n) < margin },   h(n) = t_{(1+c)/2, n−1} · sd / √n

    (the first set excludes 0: held or reversed; the second fits inside ±margin: equivalent). None when
    neither happens up to :data:`MAX_SEEDS` seeds (Δ = 0 exactly and no margin, or an effect at the margin).
    """
    n = np.arange(2, MAX_SEEDS + 1)
    width = t_half_width(sd, n, confidence=confidence)
    decided = (width < abs(mean)) | (abs(mean) + width < margin)
    return int(n[np.argmax(decided)]) if decided.any() else None


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge` says about a claim "A > B" from its paired differences."""

    outcome: str  # held / reversed / equivalent / undecided / no verdict
    mean: float  # Δ = mean of d_s
    low: float  # the t-interval of Δ (NaN below 2 seeds)
    high: float
    seeds: int
    margin: float
    seeds_to_decide: int | None = None  # undecided only: see seeds_to_decide()
    censored: str = ""  # undecided by censor(): which runs the epoch cap cut short

    @property
    def text(self) -> str:
        """The verdict as the tables print it."""
        if self.outcome == "no verdict":
            return f"no verdict ({self.seeds} seed{'s' if self.seeds != 1 else ''})"
        if self.censored:
            return f"undecided (censored by the epoch cap: {self.censored}; a longer cap would decide)"
        if self.outcome == "undecided":
            needed = f"≈ {self.seeds_to_decide}" if self.seeds_to_decide else f"more than {MAX_SEEDS}"
            return f"undecided ({needed} seeds would decide)"
        return self.outcome

    def columns(self) -> dict[str, Any]:
        """The verdict's columns in the results tables (Δ and its interval rounded to 0.01 R@1 point)."""
        return {
            "Δ": round(self.mean, 2),
            "CI low": round(self.low, 2),
            "CI high": round(self.high, 2),
            "seeds": self.seeds,
            "verdict": self.text,
            "outcome": self.outcome,
        }

    def interval_text(self, unit: str = "R@1 points") -> str:
        """``+1.20 R@1 points, 95 % CI [+0.31, +2.09], 5 paired seeds`` (no interval below 2 seeds)."""
        text = f"{self.mean:+.2f} {unit}"
        if self.seeds >= 2:
            text += f", {round(100 * CONFIDENCE)} % CI [{self.low:+.2f}, {self.high:+.2f}]"
        return text + f", {self.seeds} paired seed{'s' if self.seeds != 1 else ''}"


def judge(differences: Sequence[float], *, margin: float = MARGIN, confidence: float = CONFIDENCE) -> Verdict:
    """THE verdict rule of the study, used by every reading of every notebook.

    ``differences`` are the per-seed paired differences d_s = A_s − B_s of a claim "A > B" (seed s: the same
    backbone initialisation and batch sequence for A and B). Δ = mean(d), and its two-sided t-interval
    Δ ± t_{(1+c)/2, n−1} · sd(d) / √n (``scipy.stats.t``, c = ``confidence``). Declared before the runs, in
    this order: **held** when the interval lies above 0, **reversed** when it lies below 0, **equivalent**
    when it lies inside (−margin, +margin), **undecided** otherwise, with the seeds that would decide it
    (:func:`seeds_to_decide`). Fewer than 2 paired seeds: no verdict (there is no spread to judge by).
    """
    values = np.asarray(differences, dtype=float)
    n = len(values)
    mean = float(values.mean()) if n else math.nan
    if n < 2:
        return Verdict("no verdict", mean, math.nan, math.nan, n, margin)
    sd = float(values.std(ddof=1))
    width = float(t_half_width(sd, n, confidence=confidence))
    low, high = mean - width, mean + width
    if low > 0:
        outcome = "held"
    elif high < 0:
        outcome = "reversed"
    elif -margin < low and high < margin:
        outcome = "equivalent"
    else:
        return Verdict(
            "undecided", mean, low, high, n, margin, seeds_to_decide(mean, sd, margin=margin, confidence=confidence)
        )
    return Verdict(outcome, mean, low, high, n, margin)


CENSORED_METRICS = ("best_epoch", "seconds_to_best")  # epochs-to-best: an epoch cap can cut them short


def censor(verdict: Verdict, *, can_rise: str = "", can_fall: str = "") -> Verdict:
    """:func:`judge`'s verdict on right-censored values (:data:`CENSORED_METRICS` of runs that reached their
    epoch cap still improving, :func:`dmlstudy.train.best_epoch_censored`: the true value is at least the
    recorded one). ``can_rise`` / ``can_fall`` name the censored runs that could make the true Δ higher (on a
    side Δ adds) / lower (on a side Δ subtracts); empty when there are none.

    A verdict the censoring could overturn — held when Δ can fall, reversed when it can rise, equivalent when
    it can move at all — becomes undecided with no seed count (more seeds of the same cap cannot decide it);
    so does an undecided one whose Δ points the way the censoring could undo (Δ < 0 and can rise, Δ > 0 and
    can fall): the seeds that would decide it would decide a verdict this rule overturns. A verdict the
    censoring can only strengthen stands. Added on 2026-11-24, after the first two-regime study, where
    DGCRL's "≤ 1/5 of triplet's epochs" claim read "reversed" with most runs' best epoch at or next to the
    6-epoch cap: a stricter rule, never one that decides more.
    """
    overturned = {
        "held": can_fall,
        "reversed": can_rise,
        "equivalent": "; ".join(text for text in (can_rise, can_fall) if text),
        "undecided": can_rise if verdict.mean < 0 else can_fall if verdict.mean > 0 else "",
    }.get(verdict.outcome, "")
    if not overturned:
        return verdict
    return replace(verdict, outcome="undecided", seeds_to_decide=None, censored=overturned)


def effect_sentence(
    what: str, *, ours: Paired, paper: float | None, margin: float = MARGIN, unit: str = "R@1 points"
) -> str:
    """One sentence: our paired difference ``what`` (A − B) with its interval and :func:`judge`'s verdict on
    the paper's claim, whose direction is the sign of the paper's own difference ``paper``.

    A paper difference below :data:`NO_EFFECT` points claims no effect: the verdict is then read as
    "consistent" (equivalent), "NOT consistent" (held or reversed) or undecided. A missing paper number
    (None or NaN) claims nothing: the verdict is that of "A > B" and the sentence says the paper has no number.
    """
    missing = paper is None or (isinstance(paper, float) and math.isnan(paper))
    sign = -1.0 if not missing and paper < 0 and abs(paper) >= NO_EFFECT else 1.0
    verdict = judge([sign * d for d in ours.differences], margin=margin)
    measured = judge(ours.differences, margin=margin)  # A − B as measured, for the numbers
    text = f"{what}: ours {measured.interval_text(unit)}"
    if missing:
        return text + f" → {verdict.text} (A > B); the paper reports no number for this."
    if abs(paper) < NO_EFFECT:
        reading = {
            "equivalent": f"consistent (equivalent within ±{margin:g})",
            "held": "NOT consistent",
            "reversed": "NOT consistent",
        }.get(verdict.outcome, verdict.text)
        return text + f"; the paper found no effect ({paper:+.2f}) → {reading}."
    return text + f"; paper {paper:+.2f} → {verdict.text}."


# ----------------------------------------------------------------------------------------------
# The papers' numbers beside ours
# ----------------------------------------------------------------------------------------------
def paper_dataset(dataset: str, default: str = "") -> str:
    """The paper dataset an embedded set stands beside (SynBirds → CUB, Glyphs → Cars)."""
    return PAPER_DATASET.get(dataset, default)


def paper_column(
    table: pd.DataFrame,
    values: Mapping[str, Mapping[str, Any]],
    *,
    label: Callable[[str], str],
    show: Callable[[Any], Any] = lambda value: value,
) -> pd.DataFrame:
    """Per dataset of ``table``: its rows with a column ``label(paper dataset)`` holding ``show(value)`` of the
    paper's number for each variant (``values[paper dataset][variant]``), "–" where the paper has none."""
    rows = []
    for dataset in dict.fromkeys(table["dataset"]):
        name = paper_dataset(dataset)
        paper = values.get(name, {})
        shown = table[table["dataset"] == dataset].copy()
        shown[label(name or "–")] = [show(paper[v]) if v in paper else "–" for v in shown["variant"]]
        rows.append(shown)
    return pd.concat(rows, ignore_index=True)


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
    label: Callable[[str], str] = str,
    decimals: int = 3,
) -> pd.DataFrame:
    """Rows = variants, columns = datasets: mean ± std over seeds of ``metric`` (``ESD`` or ``rho``) of the runs'
    test embeddings, with the CRT paper's MS / +CRT numbers (``paper``: paper dataset → (MS, +CRT)) beside."""
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
            pair = paper.get(paper_dataset(dataset))
            line[f"paper ({paper_dataset(dataset, '–')})"] = (
                (pair[0] if variant == "ms" else pair[1]) if pair and variant in ("ms", "crt") else "–"
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


def geometry_readings(frame: pd.DataFrame) -> list[str]:
    """Per dataset: did CRT raise ESD and lower ρ against MS (the CRT paper's claim), and how do ESD and ρ rank
    with R@1 across all variants (Roth et al.: denser, flatter-spectrum embeddings generalise better)?"""
    means = frame.groupby(["dataset", "variant"], sort=False)[["ESD", "rho", "R@1"]].mean()
    sentences = []
    for dataset in dict.fromkeys(frame["dataset"]):
        group = means.loc[dataset]
        if {"ms", "crt"} <= set(group.index):
            esd = group.loc["crt", "ESD"] - group.loc["ms", "ESD"]
            rho = group.loc["crt", "rho"] - group.loc["ms", "rho"]
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
    """One panel per entry (titled ``label(name)``): the 2-D ``kind`` projection of the same subset of test
    images (:func:`projection_subset`), coloured by class; ``title`` above, after the point count."""
    names = list(embeddings)
    columns = min(4, max(len(names), 1))
    rows = int(math.ceil(max(len(names), 1) / columns))
    figure, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 3.4 * rows), squeeze=False)
    for axis in axes.flat:
        axis.axis("off")
    for axis, name in zip(axes.flat, names):
        vectors, labels = embeddings[name]
        keep = projection_subset(labels, classes=classes, seed=seed)
        points = project(np.asarray(vectors)[keep], kind=kind, seed=seed, iterations=iterations)
        codes = np.searchsorted(np.unique(labels[keep]), labels[keep])
        axis.scatter(points[:, 0], points[:, 1], c=codes, cmap="tab20" if classes > 10 else "tab10", s=5, linewidths=0)
        axis.set_title(label(name), fontsize=9)
    shown = len(projection_subset(next(iter(embeddings.values()))[1], classes=classes, seed=seed)) if names else 0
    figure.suptitle(
        f"{'UMAP' if kind == 'umap' else 't-SNE'}: {shown} test images of the first {classes} classes"
        + (f"; {title}" if title else "")
    )
    figure.tight_layout()
    return figure


# ----------------------------------------------------------------------------------------------
# Diagrams: boxes and arrows
# ----------------------------------------------------------------------------------------------
Box = tuple[float, float, float, float]  # centre x, centre y, width, height


def box(
    axis: plt.Axes,
    centre: tuple[float, float],
    text: str,
    *,
    width: float = 1.7,
    height: float = 0.8,
    colour: str = "#deebf7",
) -> Box:
    """A rounded box with centred text; returns its centre and size for :func:`link`."""
    x, y = centre
    axis.add_patch(
        FancyBboxPatch(
            (x - width / 2, y - height / 2),
            width,
            height,
            boxstyle="round,pad=0.05",
            facecolor=colour,
            edgecolor="#333333",
        )
    )
    axis.text(x, y, text, ha="center", va="center", fontsize=8)
    return x, y, width, height


def arrow(
    axis: plt.Axes,
    start: tuple[float, float],
    end: tuple[float, float],
    *,
    colour: str = "0.25",
    label: str = "",
    rad: float = 0.0,
    **kwargs: Any,
) -> None:
    """An arrow between two points (curved by ``rad``), its label boxed in white at the middle."""
    (x0, y0), (x1, y1) = start, end
    axis.add_patch(
        FancyArrowPatch(
            (x0, y0),
            (x1, y1),
            arrowstyle="-|>",
            mutation_scale=9,
            color=colour,
            connectionstyle=f"arc3,rad={rad}",
            linewidth=1.0,
            **kwargs,
        )
    )
    if label:
        axis.text(
            (x0 + x1) / 2,
            (y0 + y1) / 2,
            label,
            fontsize=7,
            color=colour,
            ha="center",
            va="center",
            bbox=dict(facecolor="white", edgecolor="none", pad=0.5),
        )


def link(axis: plt.Axes, start: Box, end: Box, text: str = "", *, shift: tuple[float, float] = (0.0, 0.18)) -> None:
    """An arrow from the right edge of box ``start`` to the left edge of box ``end``, labelled at its middle + ``shift``."""
    (x0, y0, w0, _), (x1, y1, w1, _) = start, end
    tail, head = (x0 + w0 / 2 + 0.08, y0), (x1 - w1 / 2 - 0.08, y1)
    axis.add_patch(FancyArrowPatch(tail, head, arrowstyle="-|>", mutation_scale=12, color="#333333"))
    if text:
        axis.text(
            (tail[0] + head[0]) / 2 + shift[0],
            (tail[1] + head[1]) / 2 + shift[1],
            text,
            ha="center",
            va="bottom",
            fontsize=7,
            color="#555555",
        )
