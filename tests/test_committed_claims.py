"""Every committed claims table recomputes from the per-seed table committed beside it, and says what it decided.

The recomputation is independent of the study's own code (``dmlstudy.verdicts``): the per-seed rows of the two
sides are paired by seed with pandas, the first ``seeds`` pairs in seed order are read, and the two-sided
t-interval at the row's ``confidence`` comes from ``scipy.stats.t``. Values are compared at the tables' rounding
(0.01). The verdict text and the ``outcome`` column must name the same outcome under the declared rule.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dmlstudy.verdicts import verdict_agrees

REPO = Path(__file__).resolve().parents[1]
CLAIMS_TABLES = sorted((REPO / "results").rglob("claims.csv"))
PER_SEED = "runs_per_seed.csv"


POOLED_PARTITIONS = ("default", "partition 1", "partition 2")  # the robustness table's pooled partitions


def t_interval(differences: np.ndarray, confidence: float) -> tuple[float, float, float, int]:
    n = len(differences)
    mean = float(differences.mean())
    half = stats.t.ppf((1 + confidence) / 2, n - 1) * differences.std(ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half, n


def recomputed(per_seed: pd.DataFrame, row: pd.Series) -> tuple[float, float, float, int]:
    """Δ, its interval and the paired seeds of one claims row, from the per-seed table alone.

    A robustness table (a ``perturbation`` column) reads the rows of the cell's perturbation; its pooled
    partitions cells (``model`` "partition means") the t-interval over the three partitions' mean paired
    differences (docs/protocol.md, "The robustness study")."""
    if "perturbation" in row.index and "perturbation" in per_seed.columns:
        if row.get("model") == "partition means":
            means = []
            for name in POOLED_PARTITIONS:
                part = per_seed[per_seed["perturbation"] == name]
                cell = row.copy()
                cell["perturbation"], cell["dataset"], cell["model"] = name, part["dataset"].iloc[0], "paired seeds"
                cell["seeds"] = len(part)
                means.append(recomputed(part, cell)[0])
            return t_interval(np.asarray(means), float(row["confidence"]))
        per_seed = per_seed[per_seed["perturbation"] == row["perturbation"]]
    here = per_seed[(per_seed["regime"] == row["regime"]) & (per_seed["dataset"] == row["dataset"])]
    sides = [
        here[here["row"] == name].set_index("seed")[row["metric"]].dropna().rename(side)
        for name, side in ((row["A"], "a"), (row["B"], "b"))
    ]
    pairs = pd.concat(sides, axis=1, join="inner").sort_index().head(int(row["seeds"]))
    differences = (float(row["A scale"]) * pairs["a"] - float(row["B scale"]) * pairs["b"]).to_numpy()
    n = len(differences)
    mean = float(differences.mean())
    half = stats.t.ppf((1 + float(row["confidence"])) / 2, n - 1) * differences.std(ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half, n


def test_there_are_committed_claims_tables():
    assert CLAIMS_TABLES, "no results/**/claims.csv"


@pytest.mark.parametrize("table", CLAIMS_TABLES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_claim_recomputes_from_the_committed_per_seed_table(table: Path):
    per_seed_path = table.with_name(PER_SEED)
    assert per_seed_path.is_file(), f"{table.relative_to(REPO)} has no {PER_SEED} beside it"
    claims = pd.read_csv(table)
    per_seed = pd.read_csv(per_seed_path)
    judged = claims[claims["seeds"] >= 2]
    assert len(judged), "no judged claim"
    for _, row in judged.iterrows():
        mean, low, high, n = recomputed(per_seed, row)
        where = f"{table.relative_to(REPO)}: {row['claim']} / {row['dataset']} / {row['regime']}"
        assert n == row["seeds"], f"{where}: {n} paired seeds in the per-seed table, the claim read {row['seeds']}"
        assert np.allclose([mean, low, high], [row["Δ"], row["CI low"], row["CI high"]], atol=0.0051, rtol=0), (
            f"{where}: recomputed {mean:+.4f} [{low:+.4f}, {high:+.4f}], table {row['Δ']} [{row['CI low']}, {row['CI high']}]"
        )


@pytest.mark.parametrize("table", CLAIMS_TABLES, ids=lambda p: str(p.relative_to(REPO)))
def test_verdict_text_and_outcome_agree(table: Path):
    claims = pd.read_csv(table)
    disagree = [
        f"{row['claim']} / {row['dataset']} / {row['regime']}: {row['verdict']!r} vs {row['outcome']!r}"
        for _, row in claims.iterrows()
        if row["outcome"] != "not run" and not verdict_agrees(str(row["verdict"]), str(row["outcome"]))
    ]
    assert not disagree, "\n".join(disagree)


def test_the_recomputation_can_fail(tmp_path):
    """A per-seed table with one value changed no longer gives the committed interval."""
    table = next(t for t in CLAIMS_TABLES if t.with_name(PER_SEED).is_file())
    claims = pd.read_csv(table)
    per_seed = pd.read_csv(table.with_name(PER_SEED))
    row = claims[claims["seeds"] >= 2].iloc[0]
    target = (per_seed["regime"] == row["regime"]) & (per_seed["dataset"] == row["dataset"])
    target &= per_seed["row"] == row["A"]
    per_seed.loc[per_seed.index[target][0], row["metric"]] += 10.0
    mean, *_ = recomputed(per_seed, row)
    assert abs(mean - row["Δ"]) > 0.5
