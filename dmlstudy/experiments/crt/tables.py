"""CRT tables and their one-line readings: ours beside the paper's numbers, each claim judged by the
study's rule on per-seed paired differences."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from dmlstudy import metrics as metric_functions
from dmlstudy.experiments.crt.study import (
    COMPLEXITY_OUTPUT_STRIDE,
    PAPER_BACKBONES,
    PAPER_BASELINE_VS_CRT,
    PAPER_COMPLEXITY,
    PAPER_COMPONENTS,
    PAPER_DIMS,
    PAPER_ESD,
    PAPER_NAME_OF_BACKBONE,
    PAPER_RHO,
    branch_scores,
    complexity_row,
    crt_variant,
    ms_variant,
    split_embeddings,
)
from dmlstudy.experiments.kit import lookup, paper_column, paper_dataset, summary, without_numbers
from dmlstudy.run.train import RunResult
from dmlstudy.study.grids import results_frame
from dmlstudy.study.report import mean_std_text
from dmlstudy.verdicts import effect_sentence, judge, paired_differences


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
