"""The same plan executed twice under different numerics: what changed in the runs, the verdicts and the time.

    .venv/bin/python benchmarks/compare_studies.py runs/default runs/default_bf16 [--labels float32 bf16]

Made for a plan run once as committed and once with one protocol key changed (``autocast: bf16`` on a CPU with
bf16 units, or ``workers: 12`` on a GPU: bf16 and CUDA kernels do not reproduce CPU float32). Two run folders
are the same run when their configurations agree on every key but those the change may touch
(:data:`IGNORED`); the folder names differ, because a run's folder carries the digest of its configuration.

For every row (regime, dataset, variant) the test R@1 of the runs both studies trained is paired by seed and the
differences (B − A) judged by the study's own rule as a claim "B ≈ A" (:func:`dmlstudy.verdicts.judge`, ±1.0 R@1 point):
*equivalent* says the change moved that row by less than a point. Then each study's ``results/claims.csv`` is
read (``<study folder>/results/`` or, for the published study, ``results/``) and the verdicts set side by side,
and the runs' summed training and evaluation seconds compared. Reads records only; trains nothing.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from dmlstudy.paths import study_outputs
from dmlstudy.study.report import gather_runs
from dmlstudy.verdicts import judge

IGNORED = {"study", "runs_root", "data_root", "autocast", "device", "channels_last", "compile", "progress"}
SEED = re.compile(r"-seed(?P<seed>\d+)$")
DECIDED = ("held", "reversed", "not held", "equivalent")  # "equivalent": tables written before the amended rule


def _plain(value):
    """A configuration value as JSON compares it: numbers as floats (a column that is NaN for some runs holds its
    integers as floats in one study and maybe not in the other)."""
    value = value.item() if hasattr(value, "item") else value
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def run_records(folder: Path) -> pd.DataFrame:
    """One row per finished run of the study in ``folder`` (``runs/<study>``), as ``dmlstudy study table``
    gathers them (:func:`dmlstudy.study.report.gather_runs`): its identity without :data:`IGNORED`, row label, seed,
    test R@1 and the seconds of its ``history.csv``."""
    frame = gather_runs(folder.name, root=folder.parent)
    fields = [c for c in frame.attrs.get("config_columns", []) if c.split(".")[0] not in IGNORED]
    rows = []
    for _, run in frame.iterrows():
        kept = {field: _plain(run[field]) for field in fields if pd.notna(run[field])}
        history_file = Path(run["run_dir"]) / "history.csv"
        history = pd.read_csv(history_file) if history_file.is_file() else pd.DataFrame()
        name = str(kept.get("run_name") or Path(run["run_dir"]).name)
        rows.append(
            {
                "identity": json.dumps(kept, sort_keys=True),
                "family": json.dumps({k: v for k, v in kept.items() if k not in ("seed", "run_name")}, sort_keys=True),
                "row": SEED.sub("", name),
                "seed": int(kept.get("seed", -1)),
                "R@1": 100.0 * float(run["R@1"]),
                "train_seconds": float(history.get("train_seconds", pd.Series(dtype=float)).sum()),
                "eval_seconds": float(history.get("eval_seconds", pd.Series(dtype=float)).sum()),
                "epochs": int(run.get("epochs_trained") if pd.notna(run.get("epochs_trained")) else 0),
            }
        )
    return pd.DataFrame(rows)


def paired_rows(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per row (runs that differ only in their seed): mean test R@1 in each study and the judged per-seed
    difference B − A. A row label that two configurations share (the tutorial's own MS run beside the
    comparison's) is numbered."""
    both = a.merge(b, on=["identity", "family", "row", "seed"], suffixes=("_a", "_b"))
    out = []
    for (row, family), group in both.groupby(["row", "family"], sort=True):
        twins = both.loc[both["row"] == row, "family"].unique().tolist()
        row = row if len(twins) == 1 else f"{row} #{twins.index(family) + 1}"
        differences = (group["R@1_b"] - group["R@1_a"]).to_numpy()
        verdict = judge(differences, claimed="≈")  # the question: do the two numerics give the same R@1?
        out.append(
            {
                "row": row,
                "seeds": len(group),
                "R@1 A": group["R@1_a"].mean(),
                "R@1 B": group["R@1_b"].mean(),
                "Δ (B − A)": verdict.mean,
                "CI": f"[{verdict.low:+.2f}, {verdict.high:+.2f}]" if len(group) > 1 else "–",
                "verdict": verdict.text if len(group) > 1 else "one seed",
            }
        )
    return pd.DataFrame(out)


def claims_file(folder: Path) -> Path:
    """``results/claims.csv`` of the study whose runs are in ``folder`` (``runs/<study>``)."""
    return study_outputs(folder.name, "results", runs_root_override=folder.parent) / "claims.csv"


def verdicts_side_by_side(a: Path, b: Path) -> pd.DataFrame:
    """Every claim of both tables with its Δ and outcome in each."""
    keys = ["claim", "dataset", "regime"]
    left, right = pd.read_csv(a), pd.read_csv(b)
    table = left[[*keys, "kind", "Δ", "outcome"]].merge(right[[*keys, "Δ", "outcome"]], on=keys, suffixes=(" A", " B"))
    table["same"] = table["outcome A"] == table["outcome B"]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a", type=Path, help="run folder of the first study, e.g. runs/default")
    parser.add_argument("b", type=Path, help="run folder of the second study, e.g. runs/default_bf16")
    parser.add_argument("--labels", nargs=2, default=["A", "B"])
    args = parser.parse_args()
    label_a, label_b = args.labels
    a, b = run_records(args.a), run_records(args.b)
    rows = paired_rows(a, b)
    shared = a.merge(b, on=["identity", "family", "row", "seed"], suffixes=("_a", "_b"))
    print(f"runs: {len(a)} in {args.a}, {len(b)} in {args.b}, {len(shared)} the same run in both\n")
    print(f"## Test R@1 per row, {label_b} − {label_a} by seed (±1.0 point margin)\n")
    print(
        rows.rename(columns={"R@1 A": f"R@1 {label_a}", "R@1 B": f"R@1 {label_b}"}).to_markdown(
            index=False, floatfmt=".2f"
        )
    )
    counts = rows["verdict"].value_counts()
    print("\n" + ", ".join(f"{outcome}: {count}" for outcome, count in counts.items()))
    seconds = {
        label: (frame["train_seconds"].sum(), frame["eval_seconds"].sum(), frame["epochs"].sum())
        for label, frame in ((label_a, shared.filter(like="_a")), (label_b, shared.filter(like="_b")))
        for frame in [frame.rename(columns=lambda c: c[:-2])]
    }
    print(f"\n## The {len(shared)} shared runs' summed seconds\n")
    print("| study | training s | evaluation s | epochs | training s per epoch |\n|---|---|---|---|---|")
    for label, (train, evaluate, epochs) in seconds.items():
        print(f"| {label} | {train:,.0f} | {evaluate:,.0f} | {epochs} | {train / max(epochs, 1):.2f} |")
    (train_a, _, _), (train_b, _, _) = seconds[label_a], seconds[label_b]
    print(f"\ntraining seconds {label_a} / {label_b}: {train_a / max(train_b, 1e-9):.2f}")
    claims_a, claims_b = claims_file(args.a), claims_file(args.b)
    if claims_a.is_file() and claims_b.is_file():
        table = verdicts_side_by_side(claims_a, claims_b)
        print(f"\n## Verdicts ({claims_a} against {claims_b})\n")
        for kind, group in table.groupby("kind"):
            for regime, part in group.groupby("regime"):
                decided = [int(part[f"outcome {side}"].isin(DECIDED).sum()) for side in ("A", "B")]
                print(
                    f"- {kind}, {regime}: {len(part)} claims, decided {decided[0]} ({label_a}) and {decided[1]} "
                    f"({label_b}), same outcome in {int(part['same'].sum())}"
                )
        changed = table[~table["same"]]
        if len(changed):
            print("\n" + changed.to_markdown(index=False, floatfmt=".2f"))
    else:
        print(f"\n(no verdicts compared: {claims_a if not claims_a.is_file() else claims_b} is missing)")
    if np.isnan(rows["Δ (B − A)"]).all():
        raise SystemExit("no run was trained by both studies")


if __name__ == "__main__":
    main()
