"""Each headline claim's chain of readings, and the error its published verdict carries.

docs/protocol.md ("Amendment to the robustness study", "One error budget for the chain"): a claim has been read by
several tests, one after another — build 1's default look (5 % per claim), the sequential design (≤ 5 % over its
looks, read after the first), a confirmatory study on fresh seeds where one ran (5 %), build 2's default look (5 %).
The verdict a claim publishes is the latest decided reading's; it carries, by Bonferroni over the chain, the sum
of the levels of the readings up to and including the first one that reached that verdict (5 %, ≤ 10 %, ≤ 15 %,
≤ 20 %). A later reading that agrees does not lower it. Beside it stands the bound over every reading that ran
(the sum of all their levels). Every reading recomputes from committed tables: build 1's
default look from the first five paired seeds of the sequential study's per-seed table (the default runs of
build 1), the others from their studies' ``claims.csv``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dmlstudy import verdicts
from dmlstudy.findings.claims import Claim, load_claims
from dmlstudy.paths import study_outputs

LEVEL = verdicts.ALPHA  # each reading of the chain decides at 5 % (the sequential design over all its looks)
FIRST_LOOK_SEEDS = 5  # build 1's default look: seeds 0–4
REGIME, DATASET = "imagenet", "emoji"  # the published study's headline reading


@dataclass(frozen=True)
class Reading:
    """One test of the chain: its name, the studies whose committed ``claims.csv`` holds it (the first that
    evaluated the claim), and whether it is recomputed from the first seeds of a per-seed table instead."""

    name: str
    studies: tuple[str, ...]
    first_seeds: int = 0  # > 0: judged here on the first this many paired seeds of the study's per-seed table


CHAIN: tuple[Reading, ...] = (
    Reading("build 1 default look", ("sequential",), first_seeds=FIRST_LOOK_SEEDS),
    Reading("sequential design (build 1)", ("sequential",)),
    Reading("confirmatory study (build 1)", ("confirm", "confirm_dgcrl")),
    Reading("build 2 default look", ("default",)),
)
DIRECTIONS = ("held", "reversed")


def _first_look(per_seed: pd.DataFrame, claim: Claim, seeds: int) -> dict:
    paired = verdicts.paired_differences(
        per_seed[per_seed["regime"] == REGIME], DATASET, claim.a, claim.b, claim.metric,
        first_scale=claim.a_scale, second_scale=claim.b_scale, column="row", in_points=True,
    )  # fmt: skip
    differences = np.asarray(paired.differences)[:seeds]
    verdict = verdicts.judge(differences, claimed=claim.claimed, margin=claim.margin or verdicts.MARGIN)
    return {"Δ": round(verdict.mean, 2), "seeds": verdict.seeds, "verdict": verdict.text, "outcome": verdict.outcome}


def chain_readings(
    claims: Sequence[Claim] | None = None, *, outputs: Callable[[str], Path] | None = None
) -> pd.DataFrame:
    """One row per (headline claim, reading of :data:`CHAIN`): Δ, seeds, the verdict text and its outcome
    (``not run`` where no study of the reading evaluated the claim)."""
    outputs = outputs or (lambda study: study_outputs(study, "results"))
    claims = tuple(claims or (claim for claim in load_claims() if claim.kind == "headline"))
    rows = []
    for claim in claims:
        for order, reading in enumerate(CHAIN, start=1):
            found = {"Δ": np.nan, "seeds": 0, "verdict": "not run", "outcome": "not run", "study": ""}
            for study in reading.studies:
                if reading.first_seeds:
                    per_seed = pd.read_csv(outputs(study) / "runs_per_seed.csv")
                    found = {**_first_look(per_seed, claim, reading.first_seeds), "study": study}
                    break
                table = pd.read_csv(outputs(study) / "claims.csv").set_index("claim")
                if claim.name in table.index and int(table.loc[claim.name, "seeds"]) > 0:
                    row = table.loc[claim.name]
                    text = str(row["verdict"])
                    found = {
                        "Δ": float(row["Δ"]),
                        "seeds": int(row["seeds"]),
                        "verdict": text,
                        "outcome": verdicts.outcome_of(text),
                        "study": study,
                    }
                    break
            rows.append({"claim": claim.name, "order": order, "reading": reading.name, "level": LEVEL, **found})
    return pd.DataFrame(rows)


def chain_errors(readings: pd.DataFrame) -> pd.DataFrame:
    """Per claim: the published verdict (the latest decided reading's outcome; ``undecided`` when none decided),
    the reading that published it, the first reading that reached it, the error the verdict carries (the sum
    of the levels up to that first reading), the bound over every reading that ran (the sum of all their levels:
    docs/protocol.md, "Second amendment to the robustness study"), with every reading's outcome in chain order."""
    rows = []
    for claim, group in readings.sort_values("order").groupby("claim", sort=False):
        decided = group[group["outcome"].isin(verdicts.RULE[">"].values())]
        if decided.empty:
            rows.append(
                {
                    "claim": claim,
                    "published verdict": "undecided",
                    "by": "",
                    "first reached by": "",
                    "error": np.nan,
                    "error over the readings run": np.nan,
                }
            )
            continue
        latest = decided.iloc[-1]
        first = group[group["outcome"] == latest["outcome"]].iloc[0]
        error = float(group.loc[group["order"] <= first["order"], "level"].sum())
        rows.append(
            {
                "claim": claim,
                "published verdict": latest["outcome"],
                "by": latest["reading"],
                "first reached by": first["reading"],
                "error": round(error, 4),
                "error over the readings run": round(float(group.loc[group["outcome"] != "not run", "level"].sum()), 4),
            }
        )
    errors = pd.DataFrame(rows)
    trail = readings.sort_values("order").groupby("claim", sort=False)["outcome"].agg(" → ".join)
    return errors.assign(chain=errors["claim"].map(trail))


def error_text(error: float) -> str:
    """``"5 %"`` for a verdict the first reading reached; ``"≤ 15 %"`` for one a later reading first reached."""
    if not np.isfinite(error):
        return "–"
    percent = f"{100 * error:.0f} %"
    return percent if error <= LEVEL + 1e-9 else f"≤ {percent}"
