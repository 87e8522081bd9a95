"""Cross-attention tables beyond its declaration and their computed readings, beside the paper's numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dmlstudy.experiments.cross_attention.study import (
    PAPER_BLOCKS,
    PAPER_FIGURE3_CAPTION,
    PAPER_FIGURE3_TEXT,
    PAPER_PARAMETERS,
)
from dmlstudy.experiments.kit import lookup, paper_dataset
from dmlstudy.methods.cross_attention import CrossAttention
from dmlstudy.run.train import RunResult
from dmlstudy.study.grids import mean_std_table, results_frame
from dmlstudy.study.report import mean_std_text
from dmlstudy.verdicts import effect_sentence, paired_differences


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


def parameter_table(results: list[tuple[str, RunResult]], *, larger: str) -> tuple[pd.DataFrame, list[str]]:
    """Parameters (training and inference) and R@1 of MS, MS + blocks, and MS on the larger backbone."""
    frame = results_frame(results)
    table = mean_std_table(frame, metrics=["R@1"])
    rows = []
    models = {
        "ms": "MS (protocol backbone)",
        "cross_attention": "MS + 6 cross-attention blocks",
        larger: "MS, larger backbone, no blocks",
    }
    for name, label in models.items():
        result = next((r for v, r in results if v == name), None)
        if result is None:
            continue
        method = result.method
        blocks = sum(p.numel() for p in method.blocks.parameters()) if isinstance(method, CrossAttention) else 0
        total = sum(p.numel() for p in method.parameters())
        row = {
            "model": label,
            "backbone": result.config.backbone,
            "parameters (training)": total,
            "parameters (inference)": total - blocks,
        }
        for dataset in dict.fromkeys(table["dataset"]):
            row[f"R@1 {dataset}"] = mean_std_text(*lookup(table, dataset, name))
        rows.append(row)
    shown = pd.DataFrame(rows)
    sentences = []
    if len(rows) == 3:
        ca_params, big_params = rows[1]["parameters (training)"], rows[2]["parameters (training)"]
        for dataset in dict.fromkeys(table["dataset"]):
            paper = (
                PAPER_PARAMETERS["ResNet-50 + 6 blocks"][1 if paper_dataset(dataset) == "CUB" else 2]
                - PAPER_PARAMETERS["ResNet-101, MS, no blocks"][1 if paper_dataset(dataset) == "CUB" else 2]
            )
            sentences.append(
                effect_sentence(
                    f"{dataset}: MS + blocks ({ca_params / 1e6:.2f}M) − larger backbone ({big_params / 1e6:.2f}M)",
                    ours=paired_differences(frame, dataset, "cross_attention", larger),
                    paper=paper,
                )
            )
    return shown, sentences


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
