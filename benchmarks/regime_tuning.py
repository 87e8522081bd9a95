"""What reusing the scratch tuning cost the pretrained regime: the rule declared in ``plans/tune_pretrained.yaml``.

    .venv/bin/python benchmarks/regime_tuning.py [--runs runs/default] [--seeds 1 2 3 4]

Until 2026-11-26 the study's pretrained runs trained with the values ``plans/tune.yaml`` chose from scratch
(``plans/tuned/<dataset>.yaml``); since then with those ``plans/tune_pretrained.yaml`` chose in the pretrained
regime (``plans/tuned/pretrained/``). A run's folder name carries the digest of its configuration, so after the
study ran again both kinds of run are in its runs folder: ``pretrained-<dataset>-<row>-seed<s>-<digest>``. For every
row and dataset this script takes the run with the scratch values and the run with the pretrained values of each
seed, pairs their best validation R@1 (``val_R@1`` of ``metrics.json``: validation classes, fold 0, the classes
both tunings scored) and judges the differences (own − reused) by the study's rule
(:func:`dmlstudy.verdicts.judge`). Seed 0 chose the pretrained values, so the judged seeds are 1-4 by
default; seed 0's difference is printed beside them. Reads records only; trains nothing.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from dmlstudy.config import load_yaml
from dmlstudy.run.regimes import run_prefix
from dmlstudy.run.tuned import OBJECTIVE, tuned_overrides
from dmlstudy.search_space import flattened
from dmlstudy.verdicts import judge

FOLDER = re.compile(
    rf"{run_prefix('pretrained')}(?P<dataset>[a-z0-9]+)-(?P<row>[a-z_]+)-seed(?P<seed>\d+)-[0-9a-f]{{8}}"
)


def matches(config: dict, overrides: dict) -> bool:
    """Whether a run's stored configuration holds every tuned value of ``overrides``."""
    stored = flattened(config)
    return bool(overrides) and all(stored.get(key) == value for key, value in flattened(overrides).items())


def paired_values(runs: Path, tuned: Path) -> pd.DataFrame:
    """One row per (dataset, row, seed) with the best validation R@1 of its run with the scratch values
    (``reused``) and with the pretrained regime's own values (``own``), where both exist. Where the pretrained
    tuning chose the scratch values (the two studies share their TPE seed, so their first random trials are
    the same), one run is both."""
    records, choices = [], {}
    for metrics in sorted(runs.glob(f"{run_prefix('pretrained')}*/metrics.json")):
        name = FOLDER.fullmatch(metrics.parent.name)
        if name is None:
            continue  # an ablation variant (its folder label holds "=")
        dataset, row, seed = name["dataset"], name["row"], int(name["seed"])
        config = load_yaml((metrics.parent / "config.yaml").read_text())
        if (dataset, row) not in choices:
            choices[(dataset, row)] = {
                "own": tuned_overrides(tuned / "pretrained", dataset, row),
                "reused": tuned_overrides(tuned, dataset, row),
            }
        kinds = [kind for kind, values in choices[(dataset, row)].items() if matches(config, values)]
        value = 100 * json.loads(metrics.read_text())[OBJECTIVE]
        records += [{"dataset": dataset, "row": row, "seed": seed, "kind": kind, "value": value} for kind in kinds]
    frame = pd.DataFrame(records)
    if frame.empty:
        return frame
    return frame.pivot_table(index=["dataset", "row", "seed"], columns="kind", values="value").reset_index()


def verdicts(pairs: pd.DataFrame, seeds: list[int]) -> pd.DataFrame:
    """The study's verdict on own − reused per (dataset, row), on ``seeds``; seed 0's difference beside it."""
    table = []
    for (dataset, row), group in pairs.groupby(["dataset", "row"]):
        group = group.dropna(subset=["own", "reused"])
        judged = group[group.seed.isin(seeds)]
        verdict = judge(list(judged.own - judged.reused))
        first = group[group.seed == 0]
        table.append(
            {
                "dataset": dataset,
                "row": row,
                "values": "the same runs" if (judged.own == judged.reused).all() else "changed",
                "seeds": " ".join(map(str, sorted(judged.seed))),
                "reused (scratch values)": np.mean(judged.reused),
                "own (pretrained values)": np.mean(judged.own),
                "Δ": verdict.mean,
                "95 % CI": f"{verdict.low:+.2f} … {verdict.high:+.2f}",
                "verdict": verdict.outcome,
                "seeds to decide": verdict.seeds_to_decide,
                "seed 0 Δ (chose the values)": float((first.own - first.reused).iloc[0]) if len(first) else None,
            }
        )
    return pd.DataFrame(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/default"), help="the study's runs folder")
    parser.add_argument(
        "--tuned", type=Path, default=Path("plans/tuned"), help="scratch values; own in <tuned>/pretrained"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4], help="the seeds judged")
    args = parser.parse_args()
    pairs = paired_values(args.runs, args.tuned)
    if pairs.empty or not {"own", "reused"} <= set(pairs.columns):
        raise SystemExit(f"no pretrained run pairs (scratch and pretrained values) under {args.runs}")
    print(verdicts(pairs, args.seeds).to_markdown(index=False, floatfmt=".2f"))


if __name__ == "__main__":
    main()
