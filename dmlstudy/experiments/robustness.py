"""The robustness study: the 8 headline claims read again under each of the study's own compromises.

Declared in docs/protocol.md ("The robustness study") before its runs. Each column (:data:`PERTURBATIONS`)
is one reading of every headline claim by the study's rule (:func:`dmlstudy.verdicts.judge`: paired seeds,
the 95 % t-interval, margin ±1 R@1 point; Holm across the claims of the column):

* ``default``: the default study (one class partition, one tuning run, a 10-epoch cap, 128 px);
* ``partition 1``, ``partition 2``: the same comparison on two further partitions of the classes, each re-tuned
  on its own validation fold; ``partitions pooled`` reads the three partitions together: Δ is the mean of the
  three partitions' mean paired differences and its interval the t-interval over those three means (2 degrees
  of freedom), so it covers seeds, partitions and tuning;
* ``30-epoch cap``, ``224 px``, ``unseen designers``: the comparison with a longer cap, at 224 px, and with test
  images drawn only by families no training image came from;
* ``relatives out of the gallery``: the default study's runs, each query's relative family (Noto / Noto v1,
  EmojiOne v1 / v2) removed from its gallery (:func:`relatives_out_recall`), DIML's re-ranking included.

Every cell recomputes from ``results/robustness/runs_per_seed.csv`` (its ``perturbation`` column names the
column a per-seed row belongs to). The last column labels each claim (:func:`robustness_label`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dmlstudy import verdicts
from dmlstudy.experiments.claims import Claim, load_claims
from dmlstudy.metrics import l2_normalize
from dmlstudy.paths import study_outputs

REGIME = "imagenet"
PER_SEED = "runs_per_seed.csv"
RELATIVES_PER_SEED = "relatives_per_seed.csv"  # the relatives-out column's per-seed rows, computed from runs
RELATIVES = {"noto": "noto-v1", "noto-v1": "noto", "emojione": "emojione-v1", "emojione-v1": "emojione"}
POOLED = "partitions pooled"
RELATIVES_OUT = "relatives out of the gallery"


@dataclass(frozen=True)
class Perturbation:
    """One column of the robustness table: the study whose per-seed table it reads (``""``: computed here),
    the dataset its runs trained on, and what its interval covers."""

    name: str
    study: str
    dataset: str
    covers: str
    labelled: bool = True  # counts towards the robustness label (each partition alone does not: the pooled does)


PERTURBATIONS: tuple[Perturbation, ...] = (
    Perturbation("default", "default", "emoji", "seeds"),
    Perturbation("partition 1", "robust_partitions", "emoji_p1", "seeds (partition 1, its own tuning)", False),
    Perturbation("partition 2", "robust_partitions", "emoji_p2", "seeds (partition 2, its own tuning)", False),
    Perturbation(POOLED, "", "", "seeds + partitions + tuning"),
    Perturbation("30-epoch cap", "robust_budget", "emoji", "seeds"),
    Perturbation("224 px", "robust_224", "emoji224", "seeds"),
    Perturbation("unseen designers", "robust_designers", "emoji_designers", "seeds"),
    Perturbation(RELATIVES_OUT, "", "emoji", "seeds"),
)
PARTITIONS = ("default", "partition 1", "partition 2")  # the columns the pooled reading pools


def headline_claims() -> tuple[Claim, ...]:
    return tuple(claim for claim in load_claims() if claim.kind == "headline")


# ----------------------------------------------------------------------------------------------
# The per-seed table
# ----------------------------------------------------------------------------------------------
def collect_per_seed(
    relatives: pd.DataFrame | None = None, *, outputs: Callable[[str], Path] | None = None
) -> pd.DataFrame:
    """Every column's per-seed rows (``regime, dataset, row, seed, R@1, …``) with a ``perturbation`` column:
    each study's ``runs_per_seed.csv`` (those not run yet are missing) and the relatives-out rows."""
    outputs = outputs or (lambda study: study_outputs(study, "results"))
    frames = []
    for perturbation in PERTURBATIONS:
        if not perturbation.study:
            continue
        path = outputs(perturbation.study) / PER_SEED
        if not path.is_file():
            continue
        frame = pd.read_csv(path)
        frame = frame[(frame["dataset"] == perturbation.dataset) & (frame["regime"] == REGIME)]
        frames.append(frame.assign(perturbation=perturbation.name))
    if relatives is not None and len(relatives):
        frames.append(relatives.assign(perturbation=RELATIVES_OUT))
    per_seed = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return per_seed[["perturbation", *[c for c in per_seed.columns if c != "perturbation"]]] if frames else per_seed


# ----------------------------------------------------------------------------------------------
# Readings
# ----------------------------------------------------------------------------------------------
def claim_differences(per_seed: pd.DataFrame, claim: Claim, perturbation: str) -> np.ndarray:
    """The claim's per-seed paired differences in one column (empty when a side has no runs there)."""
    here = per_seed[per_seed["perturbation"] == perturbation]
    if here.empty:
        return np.zeros(0)
    dataset = str(here["dataset"].iloc[0])
    try:
        paired = verdicts.paired_differences(
            here, dataset, claim.a, claim.b, claim.metric, first_scale=claim.a_scale,
            second_scale=claim.b_scale, column="row", in_points=True,
        )  # fmt: skip
    except KeyError:
        return np.zeros(0)
    return np.asarray(paired.differences, dtype=float)


def _cell(claim: Claim, perturbation: Perturbation, values: np.ndarray, *, margin: float, model: str) -> dict:
    verdict = verdicts.judge(values, claimed=claim.claimed, margin=claim.margin or margin)
    ran = len(values) > 0
    return {
        "claim": claim.name,
        "claimed": claim.claimed,
        "perturbation": perturbation.name,
        "dataset": perturbation.dataset,
        "regime": REGIME,
        "model": model,
        "covers": perturbation.covers,
        **verdict.columns(),
        "verdict": verdict.text if ran else "not run",
        "outcome": verdict.outcome if ran else "not run",
        "A": claim.a,
        "B": claim.b,
        "metric": claim.metric,
        "A scale": claim.a_scale,
        "B scale": claim.b_scale,
        "confidence": verdict.confidence,
        "margin": claim.margin or margin,
    }


def robustness_table(
    per_seed: pd.DataFrame, claims: Sequence[Claim] | None = None, *, margin: float = verdicts.MARGIN
) -> pd.DataFrame:
    """One row per (claim, column): Δ, its interval, the verdict, what the interval covers, the paired model
    (``paired seeds`` or ``partition means``) and Holm's p across the claims of the column."""
    claims = tuple(claims or headline_claims())
    rows = []
    for perturbation in PERTURBATIONS:
        for claim in claims:
            if perturbation.name == POOLED:
                means = [claim_differences(per_seed, claim, name) for name in PARTITIONS]
                values = np.asarray([m.mean() for m in means]) if all(len(m) for m in means) else np.zeros(0)
                rows.append(_cell(claim, perturbation, values, margin=margin, model="partition means"))
            else:
                values = claim_differences(per_seed, claim, perturbation.name) if len(per_seed) else np.zeros(0)
                rows.append(_cell(claim, perturbation, values, margin=margin, model="paired seeds"))
    table = pd.DataFrame(rows)
    table = verdicts.holm_columns(table, family=("perturbation",))
    labels = {claim.name: robustness_label(table[table["claim"] == claim.name]) for claim in claims}
    labelled = [p.name for p in PERTURBATIONS if p.labelled]
    pending = table["perturbation"].isin(labelled) & (table["outcome"] == "not run")
    unfinished = set(table.loc[pending, "claim"])
    labels = {
        name: f"{label} so far" if label == "robust" and name in unfinished else label for name, label in labels.items()
    }
    return table.assign(robustness=table["claim"].map(labels))


DECIDED = ("held", "reversed", "not held")  # the decided outcomes of a claim "A > B" (not held: an equivalence)


def robustness_label(cells: pd.DataFrame) -> str:
    """**robust** when a labelled column decided the claim and every decided labelled column gave the same
    outcome; **fragile** when one held it and another reversed it; **open** otherwise (nothing decided, or a
    direction beside an equivalence). Each partition alone does not count: the pooled reading does."""
    labelled = {p.name for p in PERTURBATIONS if p.labelled}
    outcomes = {o for name, o in zip(cells["perturbation"], cells["outcome"]) if name in labelled and o in DECIDED}
    if {"held", "reversed"} <= outcomes:
        return "fragile"
    return "robust" if len(outcomes) == 1 else "open"


# ----------------------------------------------------------------------------------------------
# Relatives out of the gallery
# ----------------------------------------------------------------------------------------------
def relative_mask(families: Sequence[str], relatives: Mapping[str, str] = RELATIVES) -> np.ndarray:
    """``Q × Q`` boolean: item j is removed from query i's gallery (itself, or drawn by i's relative family)."""
    families = np.asarray(families, dtype=object)
    partner = np.asarray([relatives.get(f, "") for f in families], dtype=object)
    mask = partner[:, None] == families[None, :]
    np.fill_diagonal(mask, True)
    return mask


def masked_cosine(embeddings: np.ndarray, families: Sequence[str]) -> np.ndarray:
    """``Q × Q`` cosine similarities of the L2-normalised embeddings, ``-inf`` where :func:`relative_mask` removes
    the item from the query's gallery."""
    normed = l2_normalize(embeddings)
    cosine = normed @ normed.T
    cosine[relative_mask(families)] = -np.inf
    return cosine


def relatives_out_recall(embeddings: np.ndarray, labels: Sequence[int], families: Sequence[str]) -> float:
    """R@1 in points, all against all (the query excluded), each query's relative family out of its gallery:
    the label of the most cosine-similar remaining item equals the query's."""
    labels = np.asarray(labels)
    return float(100.0 * np.mean(labels[masked_cosine(embeddings, families).argmax(axis=1)] == labels))


def relatives_out_reranked_recall(
    global_embeddings: np.ndarray,
    local_embeddings: Any,
    labels: Sequence[int],
    families: Sequence[str],
    *,
    top_k: int,
    device: Any = None,
) -> float:
    """R@1 in points after DIML's re-ranking (:func:`dmlstudy.reranking.rerank_top_k`: cos + s_struct) of each
    query's cosine top-``top_k`` among the items left once its relative family is out."""
    from dmlstudy.reranking import rerank_top_k
    from dmlstudy.transport import candidate_structural_similarity

    global_embeddings = np.asarray(global_embeddings, dtype=np.float32)
    cosine = masked_cosine(global_embeddings, families)
    k = min(top_k, len(labels) - 1)
    nearest = np.argpartition(-cosine, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(cosine, nearest, axis=1), axis=1, kind="stable")
    candidates = np.take_along_axis(nearest, order, axis=1)  # the cosine top-k, best first
    structural = candidate_structural_similarity(
        global_embeddings, local_embeddings, global_embeddings, local_embeddings, candidates, device=device
    )
    reranked = rerank_top_k(candidates, np.take_along_axis(cosine, candidates, axis=1), structural, top_k=k)
    labels = np.asarray(labels)
    return float(100.0 * np.mean(labels[reranked[:, 0]] == labels))


# ----------------------------------------------------------------------------------------------
# Markdown and the forest figure
# ----------------------------------------------------------------------------------------------
def cell_text(row: Mapping[str, Any]) -> str:
    if row["outcome"] == "not run":
        return "not run"
    if row["seeds"] < 2:
        return "no verdict"
    verdict = {"held": "**held**", "reversed": "**reversed**", "not held": "equivalent"}.get(
        row["outcome"], "undecided"
    )
    holm = " ✓" if row.get("survives Holm at 5 %") else ""
    return f"{row['Δ']:+.2f} [{row['CI low']:+.2f}, {row['CI high']:+.2f}] {verdict}{holm}"


def wide_table(table: pd.DataFrame) -> pd.DataFrame:
    """Claims × columns of :func:`cell_text`, and the robustness label last."""
    order = [p.name for p in PERTURBATIONS]
    wide = table.assign(cell=[cell_text(r) for r in table.to_dict("records")]).pivot(
        index="claim", columns="perturbation", values="cell"
    )
    wide = wide[[name for name in order if name in wide.columns]]
    claims = list(dict.fromkeys(table["claim"]))
    wide = wide.loc[claims]
    wide["robustness"] = table.drop_duplicates("claim").set_index("claim").loc[claims, "robustness"]
    return wide.reset_index()


def robustness_markdown(table: pd.DataFrame) -> str:
    covers = "; ".join(f"**{p.name}**: {p.covers}" for p in PERTURBATIONS)
    return (
        "# The headline claims under the study's own compromises\n\n"
        "Each cell: Δ R@1 points (A − B) [95 % interval] and the verdict by the rule declared before the runs "
        '(docs/protocol.md, "The robustness study"): paired seeds 0–4, margin ±1; ✓: survives Holm across the '
        "column's 8 claims. **robust**: every decided column (each partition alone aside: the pooled reading "
        "counts) gives the same verdict (**robust so far** while one of them has not run); **fragile**: held in "
        'one column, reversed in another; **open**: otherwise. "not run": the column\'s study has not been run yet '
        "(`make robustness`). The relatives-out column re-reads the default study's runs, so it shares their seed "
        "noise: it tests the gallery, not the training. What each interval "
        f"covers: {covers}. Every cell recomputes from `runs_per_seed.csv` beside this table (column "
        "`perturbation`; the pooled cells from the three partitions' mean paired differences).\n\n"
        + wide_table(table).to_markdown(index=False)
        + "\n"
    )


def forest_figure(table: pd.DataFrame) -> plt.Figure:
    """One panel per claim, one interval per column (filled: decided), the ±margin band shaded."""
    claims = list(dict.fromkeys(table["claim"]))
    order = [p.name for p in PERTURBATIONS]
    columns = 2
    rows = math.ceil(len(claims) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(11, 2.3 * rows), squeeze=False, sharey=True)
    for axis, claim in zip(axes.flat, claims):
        cells = table[table["claim"] == claim].set_index("perturbation").reindex(order)
        positions = np.arange(len(order))[::-1]
        for y, (name, cell) in zip(positions, cells.iterrows()):
            if cell["outcome"] == "not run" or not np.isfinite(cell["CI low"]):
                axis.text(0, y, "not run", va="center", ha="center", fontsize=7, color="0.5")
                continue
            decided = cell["outcome"] in DECIDED
            axis.errorbar(
                cell["Δ"], y, xerr=[[cell["Δ"] - cell["CI low"]], [cell["CI high"] - cell["Δ"]]],
                fmt="o", color="C3" if name == POOLED else "C0", mfc=None if decided else "white", capsize=2,
            )  # fmt: skip
        margin = float(cells["margin"].dropna().iloc[0]) if cells["margin"].notna().any() else verdicts.MARGIN
        axis.axvspan(-margin, margin, color="0.92", zorder=0)
        axis.axvline(0, color="0.4", lw=0.8)
        label = cells["robustness"].dropna().iloc[0] if cells["robustness"].notna().any() else ""
        axis.set_title(f"{claim}: {label}", fontsize=9)
        axis.set_yticks(positions, order, fontsize=7)
        axis.tick_params(axis="x", labelsize=7)
    for axis in axes.flat[len(claims) :]:
        axis.set_visible(False)
    for axis in axes[-1]:
        axis.set_xlabel("Δ R@1 points (A − B), 95 % interval; filled: decided", fontsize=8)
    figure.tight_layout()
    return figure


# ----------------------------------------------------------------------------------------------
# From the default study's runs, and the files the study commits
# ----------------------------------------------------------------------------------------------
def test_families(dataset: str = "emoji", data_root: str | Path = "") -> list[str]:
    """The design family of every image of ``dataset``'s test split, in the split's order (``designs.json``)."""
    import json

    from dmlstudy.data import build_dataset
    from dmlstudy.paths import data_root as default_data_root

    root = Path(data_root or default_data_root()) / dataset
    split = build_dataset(dataset, root, "test")
    family = {record["image"]: record["family"] for record in json.loads((root / "designs.json").read_text())}
    return [family[str(Path(path).relative_to(root / "images"))] for path in split.paths]


def relatives_per_seed(
    default_per_seed: pd.DataFrame, runs_folder: str | Path, *, rerank_top_k: int = 100, rerank_grid: int = 4
) -> pd.DataFrame:
    """The relatives-out column's per-seed rows (``regime, dataset, row, seed, R@1``): each headline row's run
    of the default study (found by the digest its per-seed row records) evaluated with each query's relative
    family out of its gallery; DIML's re-ranking row re-ranks its MS run's embeddings the same way."""
    from dmlstudy.experiments.kit import evaluation_sets
    from dmlstudy.run.train import TrainConfig, run

    rows = {name for claim in headline_claims() for name in (claim.a, claim.b)}
    here = default_per_seed[(default_per_seed["regime"] == REGIME) & default_per_seed["row"].isin(rows)]
    families = test_families("emoji")
    records = []
    for entry in here.to_dict("records"):
        found = sorted(Path(runs_folder).glob(f"*-{entry['digest']}"))  # one configuration may carry two labels
        named = "ms" if entry["row"] == "diml_rerank" else entry["row"]
        run_dir = next((d for d in found if f"-{named}-seed{entry['seed']}-" in d.name), found[0] if found else None)
        if run_dir is None:
            raise FileNotFoundError(
                f"no run folder *-{entry['digest']} in {runs_folder} ({entry['row']}, seed {entry['seed']})"
            )
        with np.load(run_dir / "embeddings.npz") as stored:
            embeddings, labels = stored["embeddings"], stored["labels"]
        if len(labels) != len(families):
            raise ValueError(f"{run_dir}: {len(labels)} test embeddings, but the test split has {len(families)} images")
        if entry["row"] == "diml_rerank":
            sets = evaluation_sets(run(TrainConfig.of_run_folder(run_dir)), grid_sizes=[rerank_grid])
            query = sets["query"]
            recall = relatives_out_reranked_recall(
                query.global_, query.local[rerank_grid], labels, families, top_k=rerank_top_k, device=sets["device"]
            )
        else:
            recall = relatives_out_recall(embeddings, labels, families)
        records.append(
            {"regime": REGIME, "dataset": "emoji", "row": entry["row"], "seed": entry["seed"], "R@1": recall}
        )
    return pd.DataFrame(records)


STUDY = "robustness"  # its tables go to results/robustness/, its figure to figures/robustness/


def write_robustness(relatives: pd.DataFrame | None) -> pd.DataFrame:
    """``claims.csv``, ``claims.md`` and ``runs_per_seed.csv`` in ``results/robustness/``, the forest figure
    ``figures/robustness/robustness_forest.png`` and its README; returns the table."""
    from dmlstudy import plots
    from dmlstudy.experiments.figure_index import write_figures_readme

    folder = study_outputs(STUDY, "results")
    folder.mkdir(parents=True, exist_ok=True)
    per_seed = collect_per_seed(relatives)
    table = robustness_table(per_seed)
    per_seed.to_csv(folder / PER_SEED, index=False)
    table.to_csv(folder / "claims.csv", index=False)
    (folder / "claims.md").write_text(robustness_markdown(table), encoding="utf-8")
    plots.save_figure(forest_figure(table), "robustness_forest", study=STUDY)
    write_figures_readme(study_outputs(STUDY, "figures"), study=STUDY)
    return table


def readme_markdown(table: pd.DataFrame) -> str:
    """The front page's robustness table: the columns run so far (a column not run anywhere left out), each
    claim's cells and label; the README names the columns not run yet below it."""
    ran = [
        name
        for name in dict.fromkeys(table["perturbation"])
        if (table[table["perturbation"] == name]["outcome"] != "not run").any()
    ]
    wide = wide_table(table[table["perturbation"].isin(ran)])
    return wide.rename(columns={"claim": "claim (A > B)"}).to_markdown(index=False)


def columns_not_run(table: pd.DataFrame) -> list[str]:
    return [
        name
        for name in dict.fromkeys(table["perturbation"])
        if (table[table["perturbation"] == name]["outcome"] == "not run").all()
    ]
