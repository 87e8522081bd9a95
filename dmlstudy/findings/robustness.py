"""The robustness study: the 8 headline claims read again under each of the study's own compromises.

Declared in docs/protocol.md ("The robustness study") before its runs. Each column (:data:`PERTURBATIONS`)
is one reading of every headline claim by the study's rule (:func:`dmlstudy.verdicts.judge`: paired seeds,
the 95 % t-interval, margin ±1 R@1 point; Holm across the claims of the column):

* ``default``: the default study (one class partition, one tuning run, a 10-epoch cap, 128 px);
* ``partition 1``, ``partition 2``: the same comparison on two further partitions of the classes, each re-tuned
  on its own validation fold; ``partitions pooled`` reads the three partitions together: Δ is the mean of the
  three partitions' mean paired differences and its interval the t-interval over those three means (2 degrees
  of freedom), so it covers seeds, partitions and tuning;
* ``30-epoch schedule, patience 2``: every row capped at 30 epochs on the 30-epoch cosine schedule, stopped by
  patience as in the default study (it reads a longer schedule, not more training alone);
* ``30 epochs, no early stopping``: the 30-epoch schedule run to its end, the checkpoint the best validation R@1 of
  all 30 evaluations (the reading of "does more training change the verdict");
* ``224 px``, ``unseen designers``: the comparison at 224 px, and with test images drawn only by families no
  training image came from;
* ``relatives out of the gallery``: the default study's runs, each query's relative family (Noto / Noto v1,
  EmojiOne v1 / v2) removed from its gallery (:func:`dmlstudy.metrics.relatives_out_recall`), DIML's re-ranking
  included (:func:`dmlstudy.experiments.rerank.relatives_per_seed`).

Every cell recomputes from ``results/robustness/runs_per_seed.csv`` (its ``perturbation`` column names the
column a per-seed row belongs to). Each claim is labelled by the amended rule (:func:`robustness_label`: robust,
consistent, unstable, fragile, open) and, over the four columns that ran before the amendment, by the rule first
declared (:func:`declared_label`); :func:`simulate_labels` gives both rules' false-label rates under no effect.
The second amendment's readings over the independent columns (:data:`INDEPENDENT`): :func:`every_column_reading`
and :func:`across_reading` (:mod:`dmlstudy.findings.across_columns`); their false rates and power:
:mod:`dmlstudy.findings.power`.
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
from dmlstudy.findings import across_columns
from dmlstudy.findings.claims import Claim, load_claims
from dmlstudy.paths import project_root, study_outputs

REGIME = "imagenet"
PER_SEED = "runs_per_seed.csv"
RELATIVES_PER_SEED = "relatives_per_seed.csv"  # the relatives-out column's per-seed rows, computed from runs
POOLED = "partitions pooled"
RELATIVES_OUT = "relatives out of the gallery"
SCHEDULE = "30-epoch schedule, patience 2"


@dataclass(frozen=True)
class Perturbation:
    """One column of the robustness table: the study whose per-seed table it reads (``""``: computed here),
    the dataset its runs trained on, what its interval covers and the CPU kind its runs ran on (docs/time.md)."""

    name: str
    study: str
    dataset: str
    covers: str
    labelled: bool = True  # counted by the label as first declared (each partition alone was not: the pooled was)
    reading: str = ""  # the reading its runs belong to, where cells share runs (the label counts a reading once)
    independent: bool = True  # runs of its own: a column of the every-column and across-columns readings
    numerics: str = ""  # the CPU kind of its runs ("": not run yet)
    reruns: str = ""  # a folder of results/ whose per-seed rows (the same runs trained again) replace its rows
    row_numerics: str = ""  # the tag of its per-seed rows that do not record theirs ("": :attr:`numerics`)


DEFAULT_RUNS, PARTITION_RUNS = "default runs", "class partitions"
CPU_A, CPU_C = "CPU-A (AVX-512)", "CPU-C (AVX2 only)"  # the machine kinds of docs/time.md
PINNED = "pinned-avx2"  # the study's pinned numerics (dmlstudy.numerics), the same digits on every such CPU
PARTITIONS_NUMERICS = (  # docs/protocol.md, fourth amendment to the robustness study
    f"{PINNED}: cross-attention's runs trained again pinned; the other rows as {CPU_C} computed them natively, "
    "equal to the pinned digits in every row checked"
)
PARTITION_RERUNS = "rerun_partitions_pinned"  # the partitions' runs trained again pinned (benchmarks/rerun_runs.py)
PERTURBATIONS: tuple[Perturbation, ...] = (
    Perturbation("default", "default", "emoji", "seeds", reading=DEFAULT_RUNS, numerics=PINNED),
    Perturbation(
        "partition 1",
        "robust_partitions",
        "emoji_p1",
        "seeds (partition 1, its own tuning)",
        False,
        PARTITION_RUNS,
        numerics=PARTITIONS_NUMERICS,
        reruns=PARTITION_RERUNS,
        row_numerics=CPU_C,
    ),
    Perturbation(
        "partition 2",
        "robust_partitions",
        "emoji_p2",
        "seeds (partition 2, its own tuning)",
        False,
        PARTITION_RUNS,
        numerics=PARTITIONS_NUMERICS,
        reruns=PARTITION_RERUNS,
        row_numerics=CPU_C,
    ),
    Perturbation(
        POOLED,
        "",
        "",
        "seeds + partitions + tuning",
        reading=PARTITION_RUNS,
        independent=False,
        numerics=f"{PINNED}: partition 0 the default runs, partitions 1 and 2 as their cells say",
    ),
    Perturbation(SCHEDULE, "robust_budget", "emoji", "seeds", numerics=PINNED),
    Perturbation("30 epochs, no early stopping", "robust_epochs30", "emoji", "seeds", numerics=PINNED),
    Perturbation("224 px", "robust_224", "emoji224", "seeds", numerics=PINNED),
    Perturbation("unseen designers", "robust_designers", "emoji_designers", "seeds", numerics=PINNED),
    Perturbation(
        RELATIVES_OUT,
        "",
        "emoji",
        "seeds",
        reading=DEFAULT_RUNS,
        independent=False,
        numerics=f"{PINNED} (the default runs)",
        row_numerics=PINNED,
    ),
)
PARTITIONS = ("default", "partition 1", "partition 2")  # the columns the pooled reading pools
DECLARED_COLUMNS = ("default", SCHEDULE, "unseen designers", RELATIVES_OUT)  # run before the label's amendment
INDEPENDENT = tuple(p.name for p in PERTURBATIONS if p.independent)  # the columns of the second amendment's readings


def reading_of(perturbation: str) -> str:
    """The reading a column's cells belong to: cells that share runs (the default and relatives-out cells; the
    partitions and their pooled cell) are one reading, every other column its own."""
    found = next(p for p in PERTURBATIONS if p.name == perturbation)
    return found.reading or found.name


READINGS = tuple(dict.fromkeys(reading_of(p.name) for p in PERTURBATIONS))


def headline_claims() -> tuple[Claim, ...]:
    return tuple(claim for claim in load_claims() if claim.kind == "headline")


# ----------------------------------------------------------------------------------------------
# The per-seed table
# ----------------------------------------------------------------------------------------------
RUN_KEYS = ["regime", "dataset", "row", "seed"]


def with_reruns(frame: pd.DataFrame, reruns: pd.DataFrame) -> pd.DataFrame:
    """A column's per-seed rows with those of its runs trained again (the same ``regime, dataset, row, seed``)
    replaced by the reruns' rows; reruns of other datasets are ignored."""
    reruns = reruns[reruns["dataset"].isin(frame["dataset"].unique())]
    if reruns.empty:
        return frame
    again = pd.MultiIndex.from_frame(frame[RUN_KEYS]).isin(pd.MultiIndex.from_frame(reruns[RUN_KEYS]))
    return pd.concat([frame[~again], reruns[[c for c in reruns.columns if c in frame.columns or c == "numerics"]]])


def collect_per_seed(
    relatives: pd.DataFrame | None = None,
    *,
    outputs: Callable[[str], Path] | None = None,
    reruns: bool = True,
) -> pd.DataFrame:
    """Every column's per-seed rows (``regime, dataset, row, seed, R@1, …``) with a ``perturbation`` column:
    each study's ``runs_per_seed.csv`` (those not run yet are missing), with the rows of a column's runs trained
    again (:attr:`Perturbation.reruns`, docs/protocol.md, fourth amendment) in place of the first ones unless
    ``reruns`` is False, and the relatives-out rows."""
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
        if reruns and perturbation.reruns:
            frame = with_reruns(frame, pd.read_csv(project_root() / "results" / perturbation.reruns / PER_SEED))
        frames.append(frame.assign(perturbation=perturbation.name))
    if relatives is not None and len(relatives):
        frames.append(relatives.assign(perturbation=RELATIVES_OUT))
    per_seed = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if frames:  # rows of tables made before runs recorded their numerics: the machine their column ran on
        declared = per_seed["perturbation"].map({p.name: p.row_numerics or p.numerics for p in PERTURBATIONS})
        per_seed["numerics"] = per_seed.get("numerics", pd.Series(index=per_seed.index, dtype=object)).fillna(declared)
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


def independent_differences(per_seed: pd.DataFrame, claim: Claim) -> dict[str, np.ndarray]:
    """The claim's paired differences in each independent column (:data:`INDEPENDENT`) that ran with ≥ 2 seeds."""
    found = {name: claim_differences(per_seed, claim, name) if len(per_seed) else np.zeros(0) for name in INDEPENDENT}
    return {name: values for name, values in found.items() if len(values) >= 2}


def across_reading(per_seed: pd.DataFrame, claim: Claim) -> across_columns.RandomEffects | None:
    """The claim's random-effects reading over its independent columns that ran (docs/protocol.md, "Second
    amendment to the robustness study"; :func:`dmlstudy.findings.across_columns.random_effects`): each column's
    mean paired difference with variance sd² / n, Q's p-value from its null simulated at the columns' sds and seeds
    (:func:`dmlstudy.findings.across_columns.q_null`, seeded). None below 2 columns."""
    columns = list(independent_differences(per_seed, claim).values())
    if len(columns) < 2:
        return None
    means = np.asarray([values.mean() for values in columns])
    variances = np.asarray([values.var(ddof=1) / len(values) for values in columns])
    null = across_columns.q_null(
        np.asarray([values.std(ddof=1) for values in columns]), np.asarray([len(values) for values in columns])
    )
    q = float(across_columns.cochran_q(means, variances)[0])
    return across_columns.random_effects(means, variances, q_p=float(across_columns.q_p_value(q, null)))


def simulated_spreads(per_seed: pd.DataFrame, claim: Claim) -> dict[str, float]:
    """The sd of every independent column (:data:`INDEPENDENT`) as the power simulation and the seeds per cell take
    it: the observed paired sd (:func:`observed_spreads`), the default's for a column not run; under
    :data:`RELATIVES_OUT` the observed per-seed shift's sd (0 when not computed)."""
    observed = observed_spreads(per_seed, claim)
    base = observed.get("default", 1.0)
    spreads = {name: observed.get(name, base) for name in INDEPENDENT}
    spreads[RELATIVES_OUT] = observed.get(RELATIVES_OUT, 0.0)
    return spreads


def seeds_for_every_column(
    per_seed: pd.DataFrame, claim: Claim, reading: across_columns.RandomEffects | None
) -> int | None:
    """The paired seeds per cell at which the every-column reading has 80 % power over all 7 independent columns
    if every column's true Δ were the claim's pooled Δ (``reading``), each column at its sd
    (:func:`simulated_spreads`; :func:`dmlstudy.findings.across_columns.seeds_for_power`)."""
    if reading is None:
        return None
    spreads = simulated_spreads(per_seed, claim)
    return across_columns.seeds_for_power(reading.pooled, np.asarray([spreads[name] for name in INDEPENDENT]))


def across_columns_row(per_seed: pd.DataFrame, claim: Claim, *, margin: float) -> dict[str, Any]:
    """The claim's :data:`ACROSS_COLUMNS`: the every-column reading, the random-effects reading (pooled Δ, its
    interval and prediction interval, τ, I², Q and its p-value), whether it varies with the compromise (said only
    when Q rejects homogeneity at 5 %; empty otherwise) and the seeds per cell for 80 % power."""
    reading = across_reading(per_seed, claim)
    row: dict[str, Any] = {"every column": every_column_reading(per_seed, claim)}
    if reading is None:
        return {**row, "across columns": "not run", "columns pooled": 0}
    pending = reading.columns < len(INDEPENDENT)
    return {
        **row,
        "across columns": reading.outcome(margin=margin) + (" so far" if pending else ""),
        "columns pooled": reading.columns,
        "pooled Δ": round(reading.pooled, 2),
        "pooled low": round(reading.low, 2),
        "pooled high": round(reading.high, 2),
        "prediction low": round(reading.prediction_low, 2),
        "prediction high": round(reading.prediction_high, 2),
        "τ": round(reading.tau, 2),
        "I²": round(reading.i2, 3),
        "Q": round(reading.q, 2),
        "Q p": reading.q_p,
        "varies with the compromise": "varies" if reading.varies else "",
        "seeds per cell for 80 % power": seeds_for_every_column(per_seed, claim, reading),
    }


def every_column_reading(per_seed: pd.DataFrame, claim: Claim) -> str:
    """The intersection–union reading over the independent columns that ran
    (:func:`dmlstudy.findings.across_columns.every_column`), with "so far (k of 7)" while one has not run (the
    reading's conclusion is about every declared column; a column that already fails it is final)."""
    columns = independent_differences(per_seed, claim)
    if not columns:
        return "not run"
    means = np.asarray([[values.mean() for values in columns.values()]])
    sds = np.asarray([[values.std(ddof=1) for values in columns.values()]])
    seeds = np.asarray([[len(values) for values in columns.values()]])
    reading = str(across_columns.every_column(means, sds, seeds)[0])
    if len(columns) < len(INDEPENDENT) and reading != across_columns.EVERY_COLUMN[2]:
        reading += f" so far ({len(columns)} of {len(INDEPENDENT)})"
    return reading


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
        "seeds to decide": verdict.seeds_to_decide if ran else None,
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
    columns = {}
    for claim in claims:
        cells = table[table["claim"] == claim.name]
        ran = cells[cells["outcome"] != "not run"]
        label = robustness_label(ran) if len(ran) else "not run"
        pending = len(ran) < len(cells)
        columns[claim.name] = {
            "robustness": f"{label} so far" if pending and label not in ("fragile", "not run") else label,
            "readings decided": readings_decided(ran),
            "label as first declared": declared_label(cells[cells["perturbation"].isin(DECLARED_COLUMNS)]),
            **across_columns_row(per_seed, claim, margin=claim.margin or margin),
        }
    numerics = {p.name: p.numerics or "not run yet" for p in PERTURBATIONS}
    table = table.assign(numerics=table["perturbation"].map(numerics))
    per_claim = LABEL_COLUMNS + ACROSS_COLUMNS
    return table.assign(**{key: table["claim"].map({c: v.get(key) for c, v in columns.items()}) for key in per_claim})


LABEL_COLUMNS = ("robustness", "readings decided", "label as first declared")
ACROSS_COLUMNS = (  # the second amendment's per-claim columns (docs/protocol.md)
    "every column",
    "across columns",
    "columns pooled",
    "pooled Δ",
    "pooled low",
    "pooled high",
    "prediction low",
    "prediction high",
    "τ",
    "I²",
    "Q",
    "Q p",
    "varies with the compromise",
    "seeds per cell for 80 % power",
)
DECIDED = ("held", "reversed", "not held")  # the decided outcomes of a claim "A > B" (not held: an equivalence)
LABELS = ("fragile", "robust", "consistent", "unstable", "open")  # the amended rule's labels, in its order


def label_outcomes(outcomes: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """The amended label (docs/protocol.md, "Amendment to the robustness study") of each row of a draws × cells
    table of outcomes and Δ, every cell one that ran; the first that applies:

    * **fragile**: one cell held and another reversed;
    * **robust**: every cell decided, all with one outcome (held, reversed or equivalent everywhere);
    * **consistent**: no opposite decision, Δ of one sign in every cell, at least one cell decided;
    * **unstable**: no opposite decision, Δ of both signs among the cells;
    * **open**: nothing decided, Δ of one sign everywhere.

    An undecided cell never counts as agreement: it can only keep a claim from *robust*. Δ = 0 counts as either
    sign."""
    outcomes, deltas = np.atleast_2d(np.asarray(outcomes)), np.atleast_2d(np.asarray(deltas, dtype=float))
    decided = np.isin(outcomes, DECIDED)
    fragile = (outcomes == "held").any(axis=1) & (outcomes == "reversed").any(axis=1)
    robust = decided.all(axis=1) & (outcomes == outcomes[:, :1]).all(axis=1)
    one_sign = (deltas >= 0).all(axis=1) | (deltas <= 0).all(axis=1)
    conditions = [fragile, robust, one_sign & decided.any(axis=1), ~one_sign]
    return np.select(conditions, list(LABELS[:4]), default=LABELS[4])


def robustness_label(cells: pd.DataFrame) -> str:
    """The amended label (:func:`label_outcomes`) of one claim over its cells that ran (``outcome``, ``Δ``)."""
    return str(label_outcomes(cells["outcome"].to_numpy()[None, :], cells["Δ"].to_numpy()[None, :])[0])


def readings_decided(cells: pd.DataFrame) -> str:
    """``"held in 3 of 5 readings"``: the readings (:func:`reading_of`: cells sharing runs count once) that
    decided the claim, each only when all its cells that ran gave that outcome, over the readings that ran."""
    by_reading = cells.assign(reading=[reading_of(p) for p in cells["perturbation"]]).groupby("reading", sort=False)
    outcomes = [set(group["outcome"]) for _, group in by_reading]
    decided = [next(iter(o)) for o in outcomes if len(o) == 1 and next(iter(o)) in DECIDED]
    if not outcomes:
        return ""
    counts = pd.Series(decided, dtype=object).value_counts()
    words = {"not held": "equivalent"}
    parts = [f"{words.get(outcome, outcome)} in {count}" for outcome, count in counts.items()]
    return f"{' and '.join(parts) or 'decided in 0'} of {len(outcomes)} readings"


def declared_label_outcomes(outcomes: np.ndarray) -> np.ndarray:
    """The label as first declared (docs/protocol.md, "The robustness study") of each row of a draws × cells
    table of outcomes, over its labelled cells: **robust** when a cell decided the claim and every decided cell
    gave the same outcome; **fragile** when one held it and another reversed it; **open** otherwise. An
    undecided cell counted as agreement under this rule, which is why it was amended."""
    outcomes = np.atleast_2d(np.asarray(outcomes))
    decided = {outcome: (outcomes == outcome).any(axis=1) for outcome in DECIDED}
    distinct = sum(decided.values())
    fragile = decided["held"] & decided["reversed"]
    return np.select([fragile, distinct == 1], ["fragile", "robust"], default="open")


def declared_label(cells: pd.DataFrame) -> str:
    """The label as first declared (:func:`declared_label_outcomes`) of one claim, kept beside the amended one
    over the columns that ran before the amendment (:data:`DECLARED_COLUMNS`); each partition alone did not
    count under it (the pooled reading did)."""
    labelled = cells[cells["perturbation"].isin([p.name for p in PERTURBATIONS if p.labelled])]
    return str(declared_label_outcomes(labelled["outcome"].to_numpy()[None, :])[0])


# ----------------------------------------------------------------------------------------------
# The labels' false rates under no effect
# ----------------------------------------------------------------------------------------------
def _read_draws(values: np.ndarray, *, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """(outcome, Δ) of each row of ``values`` (draws × n) by the study's rule (the t-interval of the row's mean,
    :func:`dmlstudy.verdicts.read_interval`), vectorised over the draws."""
    n = values.shape[1]
    mean, sd = values.mean(axis=1), values.std(axis=1, ddof=1)
    width = verdicts.t_half_width(sd, n)
    texts = verdicts.read_interval(mean - width, mean + width, margin=margin)
    outcome = np.full(texts.shape, verdicts.UNDECIDED, dtype=object)
    for text, decided in verdicts.RULE[">"].items():
        outcome[texts == text] = decided
    return outcome.astype(str), mean


def observed_spreads(per_seed: pd.DataFrame, claim: Claim) -> dict[str, float]:
    """The paired sd of ``claim``'s differences in each column that ran (≥ 2 seeds), and under the key
    :data:`RELATIVES_OUT` the sd of the relatives-out cell's per-seed shift from the default's differences."""
    spreads = {}
    for perturbation in PERTURBATIONS:
        if perturbation.name in (POOLED, RELATIVES_OUT):
            continue
        values = claim_differences(per_seed, claim, perturbation.name) if len(per_seed) else np.zeros(0)
        if len(values) >= 2:
            spreads[perturbation.name] = float(values.std(ddof=1))
    default = claim_differences(per_seed, claim, "default") if len(per_seed) else np.zeros(0)
    relatives = claim_differences(per_seed, claim, RELATIVES_OUT) if len(per_seed) else np.zeros(0)
    if len(relatives) >= 2 and len(relatives) == len(default):
        spreads[RELATIVES_OUT] = float((relatives - default).std(ddof=1))
    return spreads


def simulate_labels(
    per_seed: pd.DataFrame,
    claims: Sequence[Claim] | None = None,
    *,
    draws: int = 20_000,
    seeds: int = 5,
    random_seed: int = 0,
) -> pd.DataFrame:
    """Each label's rate under no effect, for both rules, by simulation (docs/protocol.md, "Amendment to the
    robustness study"): per claim, ``draws`` tables with Δ = 0 in every column, ``seeds`` paired differences per
    cell drawn N(0, sd²) with each column's observed paired sd (:func:`observed_spreads`; the default's where a
    column has not run), the relatives-out cell the default's differences plus N(0, shift sd²), the pooled cell
    the t-interval of the three partitions' means. Each draw is labelled over the columns that ran
    (``columns = "run so far"``), over every declared column (``"all declared"``) and, for scale, over the default
    column alone (``"default alone"``: one look, about 5 %), by the amended rule
    (:func:`label_outcomes`) and by the rule first declared (:func:`declared_label_outcomes`, its labelled
    columns). ``robust with a direction``: robust with every cell held, or every cell reversed — the false label
    the declared bound keeps at ≤ 5 %."""
    claims = tuple(claims or headline_claims())
    ran = {name for name in (per_seed["perturbation"].unique() if len(per_seed) else ())}
    if set(PARTITIONS) <= ran:
        ran.add(POOLED)
    names = [p.name for p in PERTURBATIONS]
    labelled = [p.name for p in PERTURBATIONS if p.labelled]
    rows = []
    for index, claim in enumerate(claims):
        rng = np.random.default_rng([random_seed, index])
        margin = claim.margin or verdicts.MARGIN
        spreads = observed_spreads(per_seed, claim)
        base = spreads.get("default", 1.0)
        values = {
            name: rng.normal(0.0, spreads.get(name, base), (draws, seeds))
            for name in names
            if name not in (POOLED, RELATIVES_OUT)
        }
        values[RELATIVES_OUT] = values["default"] + rng.normal(0.0, spreads.get(RELATIVES_OUT, 0.0), (draws, seeds))
        values[POOLED] = np.stack([values[name].mean(axis=1) for name in PARTITIONS], axis=1)
        read = {name: _read_draws(values[name], margin=margin) for name in names}
        sets = (("default alone", ["default"]), ("run so far", [n for n in names if n in ran]), ("all declared", names))
        for columns, chosen in sets:
            if not chosen:
                continue
            outcomes = np.stack([read[name][0] for name in chosen], axis=1)
            deltas = np.stack([read[name][1] for name in chosen], axis=1)
            first = [i for i, name in enumerate(chosen) if name in labelled]
            for rule, labels, seen in (
                ("amended", label_outcomes(outcomes, deltas), outcomes),
                ("as first declared", declared_label_outcomes(outcomes[:, first]), outcomes[:, first]),
            ):
                robust = labels == "robust"
                directed = robust & np.isin(seen, ("held", "reversed")).any(axis=1)
                rows.append(
                    {
                        "claim": claim.name,
                        "columns": columns,
                        "cells": len(chosen),
                        "rule": rule,
                        "draws": draws,
                        "robust with a direction": directed.mean(),
                        "robust (equivalent)": (robust & ~directed).mean(),
                        **{label: (labels == label).mean() for label in LABELS if label != "robust"},
                    }
                )
    return pd.DataFrame(rows)


FALSE_ROBUST_BOUND = 0.05  # the declared bound on "robust with a direction" under no effect


# ----------------------------------------------------------------------------------------------
# Markdown and the forest figure
# ----------------------------------------------------------------------------------------------
VERDICT_WORDS = {"held": "**held**", "reversed": "**reversed**", "not held": "equivalent"}


def cell_text(row: Mapping[str, Any], *, interval: bool = True) -> str:
    """``+1.94 [+0.38, +3.49] **held** ✓`` (✓: survives Holm in its column); an undecided cell adds the paired
    seeds (partitions, for the pooled cell) that would decide it at the observed spread, ``(≈ 12 seeds)``.
    ``interval=False`` leaves the interval out (the front page's compact table)."""
    if row["outcome"] == "not run":
        return "not run"
    if row["seeds"] < 2:
        return "no verdict"
    verdict = VERDICT_WORDS.get(row["outcome"], "undecided")
    if row["outcome"] == verdicts.UNDECIDED:
        unit = "partitions" if row.get("model") == "partition means" else "seeds"
        needed = row.get("seeds to decide")
        found = needed is not None and np.isfinite(float(needed))
        verdict += f" (≈ {int(needed)} {unit})" if found else f" (> {verdicts.MAX_SEEDS} {unit})"
    holm = " ✓" if row.get("survives Holm at 5 %") else ""
    bounds = f" [{row['CI low']:+.2f}, {row['CI high']:+.2f}]" if interval else ""
    return f"{row['Δ']:+.2f}{bounds} {verdict}{holm}"


def wide_table(table: pd.DataFrame, *, interval: bool = True) -> pd.DataFrame:
    """Claims × columns of :func:`cell_text`, then the amended label, the readings that decided the claim and the
    label as first declared."""
    order = [p.name for p in PERTURBATIONS]
    wide = table.assign(cell=[cell_text(r, interval=interval) for r in table.to_dict("records")]).pivot(
        index="claim", columns="perturbation", values="cell"
    )
    wide = wide[[name for name in order if name in wide.columns]]
    claims = list(dict.fromkeys(table["claim"]))
    wide = wide.loc[claims]
    labels = table.drop_duplicates("claim").set_index("claim").loc[claims]
    for column in LABEL_COLUMNS:
        wide[column] = labels[column]
    return wide.reset_index()


def _p_text(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def across_text(row: Mapping[str, Any]) -> str:
    """``+2.67 [+1.97, +3.37] **held**``: the pooled Δ, its Hartung–Knapp interval and its reading."""
    if not row.get("columns pooled"):
        return "not run"
    outcome = str(row["across columns"]).removesuffix(" so far")
    verdict = VERDICT_WORDS.get(outcome, outcome) + (" so far" if str(row["across columns"]).endswith("so far") else "")
    return f"{row['pooled Δ']:+.2f} [{row['pooled low']:+.2f}, {row['pooled high']:+.2f}] {verdict}"


def readings_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per claim, the second amendment's readings over the independent columns, then both labels: held in every
    column; across columns (pooled Δ [Hartung–Knapp 95 %] and its reading; the 95 % prediction interval; τ; I²;
    Q and its p-value); varies with the compromise (only when Q rejects at 5 %); the seeds per cell for 80 % power."""
    claims = list(dict.fromkeys(table["claim"]))
    rows = table.drop_duplicates("claim").set_index("claim").loc[claims].reset_index().to_dict("records")
    shown = []
    for row in rows:
        ran = bool(row.get("columns pooled"))
        seeds = row.get("seeds per cell for 80 % power")
        shown.append(
            {
                "claim": row["claim"],
                "held in every column": row["every column"],
                "across columns: pooled Δ [95 %]": across_text(row),
                "columns pooled": f"{int(row['columns pooled'])} of {len(INDEPENDENT)}" if ran else "–",
                "prediction interval": f"[{row['prediction low']:+.2f}, {row['prediction high']:+.2f}]"
                if ran and np.isfinite(row["prediction low"])
                else "–",
                "τ": f"{row['τ']:.2f}" if ran else "–",
                "I²": f"{100 * row['I²']:.0f} %" if ran else "–",
                "Q (p)": f"{row['Q']:.1f} ({_p_text(row['Q p'])})" if ran else "–",
                "varies with the compromise": row["varies with the compromise"]
                if isinstance(row["varies with the compromise"], str)
                else "",
                "seeds per cell for 80 %": f"{int(seeds):,}" if seeds is not None and np.isfinite(seeds) else "–",
                "robustness (amended label)": row["robustness"],
                "label as first declared": row["label as first declared"],
            }
        )
    return pd.DataFrame(shown)


READINGS_RULE = (
    "**held in every column**: each independent column's one-sided 95 % bound above 0 (an intersection–union test: "
    "at most 5 % false, no correction needed); **across columns**: the random-effects pooled Δ (DerSimonian–Laird "
    "τ²) with its Hartung–Knapp 95 % interval on k − 1 degrees of freedom (its variance never below "
    "DerSimonian–Laird's), read by the study's rule; the **prediction interval** is where a further column's Δ "
    "would fall (95 %); **τ** the sd of the true Δ between columns, **I²** the share of Q beyond its degrees of "
    "freedom; **Q (p)** Cochran's Q with its p-value against its null simulated at the columns' sds; **varies with "
    "the compromise** only when that p is below 5 % (otherwise nothing is said); **seeds per cell for 80 %**: the "
    "paired seeds per cell at which *held in every column* would have 80 % power over all 7 independent columns if "
    "every column's true Δ were the pooled Δ. The independent columns: default, partition 1, partition 2, both "
    "30-epoch columns, 224 px, unseen designers (the relatives-out cell re-reads the default runs, the pooled cell "
    'the partitions). "… so far" while one of them has not run. False rates and power of every reading: '
    "`power.md`"
)


LABEL_RULE = (
    "**robust**: every cell decided, all alike; **consistent**: Δ of one sign everywhere, no opposite decision, "
    "some cells undecided; **unstable**: Δ of both signs, nothing opposite decided; **fragile**: held in one cell, "
    'reversed in another; **open**: nothing decided (docs/protocol.md, "Amendment to the robustness study"). '
    '"… so far" while a declared column has not run. An undecided cell never counts as agreement. "readings '
    'decided": the default and relatives-out cells (the same runs) count as one reading, the partitions and their '
    "pooled cell as one; a reading counts as decided when all its cells decided alike. **label as first declared**: "
    "the rule declared before the runs (robust when every *decided* cell agrees), over the four columns that ran "
    "before the amendment (default, 30-epoch schedule, unseen designers, relatives out), kept as it was read"
)


def chain_markdown(chain: pd.DataFrame) -> str:
    """Each claim's chain of readings (``chain.csv``: :func:`dmlstudy.findings.chain.chain_readings` with
    :func:`~dmlstudy.findings.chain.chain_errors`): every reading's Δ, seeds and verdict, then the published
    verdict, the reading that first reached it and the error it carries."""
    from dmlstudy.findings.chain import error_text

    readings = chain.pivot(index="claim", columns="reading", values="outcome")
    seeds = chain.pivot(index="claim", columns="reading", values="seeds")
    deltas = chain.pivot(index="claim", columns="reading", values="Δ")
    order = list(dict.fromkeys(chain.sort_values("order")["reading"]))
    claims = list(dict.fromkeys(chain["claim"]))
    shown = pd.DataFrame(index=claims)
    for name in order:
        shown[name] = [
            readings.loc[c, name]
            if readings.loc[c, name] == "not run"
            else f"{deltas.loc[c, name]:+.2f} ({int(seeds.loc[c, name])}) {readings.loc[c, name].replace('not held', 'equivalent')}"
            for c in claims
        ]
    errors = chain.drop_duplicates("claim").set_index("claim").loc[claims]
    shown["published verdict"] = errors["published verdict"]
    shown["first reached by"] = errors["first reached by"]
    shown["error (as first reached)"] = [error_text(e) for e in errors["error"]]
    shown["error over the readings run"] = [error_text(e) for e in errors["error over the readings run"]]
    return (
        "## Each claim's chain of readings, and the error of its verdict\n\n"
        "The tests each headline claim went through, in the order they were made (Δ, paired seeds in brackets, the "
        "outcome; the full verdict texts in `chain.csv`): build 1's default look, the sequential design, a confirmatory study where one ran, build 2's "
        "default look. The published verdict is the latest decided reading's; it carries the sum of the levels of "
        'the readings up to the first that reached it (docs/protocol.md, "Amendment to the robustness study"); '
        "beside it, the bound over every reading that ran (the sum of all their levels: docs/protocol.md, "
        '"Second amendment to the robustness study"), both recomputed in `chain.csv` from the committed tables.\n\n'
        + shown.rename_axis("claim").reset_index().to_markdown(index=False)
        + "\n"
    )


def robustness_markdown(
    table: pd.DataFrame, simulation: pd.DataFrame | None = None, chain: pd.DataFrame | None = None
) -> str:
    covers = "; ".join(f"**{p.name}**: {p.covers}" for p in PERTURBATIONS)
    numerics = "; ".join(f"**{p.name}**: {p.numerics or 'not run yet'}" for p in PERTURBATIONS)
    text = (
        "# The headline claims under the study's own compromises\n\n"
        "Each cell: Δ R@1 points (A − B) [95 % interval] and the verdict by the rule declared before the runs "
        '(docs/protocol.md, "The robustness study"): paired seeds 0–4, margin ±1; ✓: survives Holm across the '
        "column's 8 claims; an undecided cell gives the paired seeds (for the pooled cell: partitions) that would "
        f'decide it if Δ and the spread stayed as observed. {LABEL_RULE}. "not run": the column\'s study has not '
        "been run yet (`make robustness`). The relatives-out column re-reads the default study's runs, so it shares "
        "their seed noise: it tests the gallery, not the training. The 30-epoch schedule column stretches the cosine "
        "schedule with the cap and stops runs by patience (a longer schedule, not more training alone); the column "
        "with 30 epochs and no early stopping runs the schedule to its end and reads whether more training changes "
        f"a verdict. What each interval covers: {covers}. Numerics (the CPU kind each column ran on, docs/time.md): "
        f"{numerics}. Every cell recomputes from `runs_per_seed.csv` beside this "
        "table (column `perturbation`; the pooled cells from the three partitions' mean paired differences).\n\n"
        + wide_table(table).to_markdown(index=False)
        + "\n\n## Read across the independent columns\n\n"
        + f"{READINGS_RULE}. These readings pool the independent columns' cells, each with the numerics named above.\n\n"
        + readings_table(table).to_markdown(index=False, disable_numparse=True)
        + "\n"
    )
    if chain is not None and len(chain):
        text += "\n" + chain_markdown(chain)
    if simulation is not None and len(simulation):
        text += "\n" + simulation_markdown(simulation)
    return text


def simulation_summary(simulation: pd.DataFrame) -> pd.DataFrame:
    """Per column set and rule: the largest rate over the claims of each label under no effect."""
    rates = ["robust with a direction", "robust (equivalent)", *[label for label in LABELS if label != "robust"]]
    return simulation.groupby(["columns", "rule"], sort=False).agg({"cells": "max", **dict.fromkeys(rates, "max")})


def simulation_markdown(simulation: pd.DataFrame) -> str:
    """The labels' false rates under no effect (:func:`simulate_labels`), the largest over the 8 claims."""
    summary = simulation_summary(simulation).reset_index()
    shown = summary.assign(**{c: [f"{100 * v:.2f} %" for v in summary[c]] for c in summary.columns[3:]})
    labelled = simulation[(simulation["rule"] == "amended") & (simulation["columns"] != "default alone")]
    bound = (labelled["robust with a direction"] <= FALSE_ROBUST_BOUND).all()
    draws = int(simulation["draws"].iloc[0])
    return (
        "## The labels under no effect\n\n"
        f"Each label's rate when no claim has any effect (Δ = 0 in every column), from {draws:,} simulated tables per "
        "claim with this study's seed counts and each cell's observed paired spread (`label_simulation.csv`, "
        "`robustness.simulate_labels`); the largest rate over the 8 claims; *default alone*, one look, is the scale. "
        "**robust with a direction** is the false "
        f"label the amendment bounds at {100 * FALSE_ROBUST_BOUND:.0f} %: "
        + ("the amended rule keeps it there." if bound else "**the amended rule exceeds it.**")
        + " Under no effect *robust (equivalent)* is a true label, and *unstable* the expected one: with Δ = 0 the "
        "cells' signs differ by chance." + "\n\n" + shown.to_markdown(index=False) + "\n"
    )


FOREST_COLOURS = {"independent": "#0072b2", "re-read": "#8c8c8c", "pooled": "#000000"}  # Okabe–Ito blue, greys


def _forest_rows() -> list[str]:
    """The forest's rows, top to bottom: the independent columns, then the cells that re-read their runs."""
    return [*INDEPENDENT, *[p.name for p in PERTURBATIONS if not p.independent]]


def _forest_title(cells: pd.DataFrame) -> str:
    """``across columns: held so far; varies with the compromise`` (nothing about variation unless Q rejects)."""
    first = cells.iloc[0]
    if not first.get("columns pooled"):
        return "across columns: not run"
    outcome = str(first["across columns"]).replace("not held", "equivalent")
    varies = "; varies with the compromise" if first.get("varies with the compromise") == "varies" else ""
    return f"across columns: {outcome}{varies}"


def forest_figure(table: pd.DataFrame) -> plt.Figure:
    """One panel per claim: every declared column's interval (filled: decided; open: undecided; blue: an
    independent column, grey: a cell that re-reads another column's runs; "not run yet" where its study has not
    run), then the random-effects pooled Δ of the independent columns as a diamond spanning its Hartung–Knapp 95 %
    interval, with the 95 % prediction interval as a line through it (cut at the panel's edge with an arrow where it
    reaches beyond; its bounds in the row's label). The ±margin band shaded; the across-columns reading in the
    title."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Polygon

    claims = list(dict.fromkeys(table["claim"]))
    order = _forest_rows()
    columns = 2
    rows = math.ceil(len(claims) / columns)
    height = 0.3 * (len(order) + 2) * rows + 1.2
    figure, axes = plt.subplots(rows, columns, figsize=(12, height), squeeze=False)
    independent = set(INDEPENDENT)
    for axis, claim in zip(axes.flat, claims):
        cells = table[table["claim"] == claim].set_index("perturbation").reindex(order)
        first = table[table["claim"] == claim].iloc[0]
        diamond_y = 0.0
        positions = np.arange(len(order))[::-1] + 1.6  # the columns above the diamond's row
        ran = cells[cells["outcome"].ne("not run") & cells["CI low"].notna()]
        bounds = [*ran["CI low"], *ran["CI high"]]
        pooled = bool(first.get("columns pooled"))
        if pooled:
            bounds += [first["pooled low"], first["pooled high"]]
        low, high = (min(bounds), max(bounds)) if bounds else (-2.0, 2.0)
        margin = float(first["margin"]) if np.isfinite(first["margin"]) else verdicts.MARGIN
        low, high = min(low, -margin), max(high, margin)
        pad = 0.06 * (high - low)
        low, high = low - pad, high + pad
        for y, (name, cell) in zip(positions, cells.iterrows()):
            if cell["outcome"] == "not run" or not np.isfinite(cell["CI low"]):
                axis.axhline(y, color="0.85", lw=0.8, ls=":", zorder=0)
                axis.text(0.015, y, "not run yet", transform=axis.get_yaxis_transform(), va="center", ha="left",
                          fontsize=7, color="0.45", style="italic")  # fmt: skip
                continue
            colour = FOREST_COLOURS["independent" if name in independent else "re-read"]
            decided = cell["outcome"] in DECIDED
            axis.errorbar(
                cell["Δ"], y, xerr=[[cell["Δ"] - cell["CI low"]], [cell["CI high"] - cell["Δ"]]],
                fmt="o", color=colour, mfc=colour if decided else "white", capsize=2, ms=5,
            )  # fmt: skip
        labels = [name if name in independent else f"{name} (re-read)" for name in order]
        label = "across columns"
        if pooled:
            centre = float(first["pooled Δ"])
            axis.add_patch(
                Polygon(
                    [
                        (first["pooled low"], diamond_y),
                        (centre, diamond_y + 0.35),
                        (first["pooled high"], diamond_y),
                        (centre, diamond_y - 0.35),
                    ],
                    closed=True,
                    color=FOREST_COLOURS["pooled"],
                    zorder=3,
                )  # fmt: skip
            )
            left, right = float(first["prediction low"]), float(first["prediction high"])
            if np.isfinite(left) and np.isfinite(right):
                axis.plot([max(left, low), min(right, high)], [diamond_y, diamond_y], color="0.3", lw=1, zorder=2)
                for edge, beyond, marker in ((low, left < low, "<"), (high, right > high, ">")):
                    if beyond:
                        axis.plot(edge, diamond_y, marker=marker, color="0.3", ms=5, clip_on=False, zorder=2)
                label += (
                    f" ({int(first['columns pooled'])} of {len(INDEPENDENT)})\nprediction [{left:+.1f}, {right:+.1f}]"
                )
        else:
            axis.text(0.015, diamond_y, "not run yet", transform=axis.get_yaxis_transform(), va="center",
                      ha="left", fontsize=7, color="0.45", style="italic")  # fmt: skip
        axis.axhline(0.8, color="0.6", lw=0.6)
        axis.axvspan(-margin, margin, color="0.92", zorder=0)
        axis.axvline(0, color="0.4", lw=0.8)
        axis.set_xlim(low, high)
        axis.set_ylim(-0.7, positions[0] + 0.6)
        axis.set_yticks([*positions, diamond_y], [*labels, label], fontsize=7)
        axis.set_title(f"{claim}\n{_forest_title(table[table['claim'] == claim])}", fontsize=8.5)
        axis.tick_params(axis="x", labelsize=7)
    for axis in axes.flat[len(claims) :]:
        axis.set_visible(False)
    for axis in axes[-1]:
        axis.set_xlabel("Δ R@1 points (A − B)", fontsize=8)
    handles = [
        Line2D([], [], marker="o", color=FOREST_COLOURS["independent"], ls="", label="decided (95 % interval)"),
        Line2D([], [], marker="o", color=FOREST_COLOURS["independent"], mfc="white", ls="", label="undecided"),
        Line2D([], [], marker="o", color=FOREST_COLOURS["re-read"], ls="", label="re-reads another column's runs"),
        Patch(color=FOREST_COLOURS["pooled"], label="random-effects pooled Δ, Hartung–Knapp 95 %"),
        Line2D([], [], color="0.3", lw=1, label="95 % prediction interval"),
        Patch(color="0.92", label="±margin (1 R@1 point)"),
    ]
    figure.tight_layout(rect=(0, 0.035, 1, 1))
    figure.legend(handles=handles, loc="lower center", ncol=3, fontsize=7.5, frameon=False)
    return figure


# ----------------------------------------------------------------------------------------------
# The files the study commits
# ----------------------------------------------------------------------------------------------
STUDY = "robustness"  # its tables go to results/robustness/, its figure to figures/robustness/


SIMULATION = "label_simulation.csv"
CHAIN = "chain.csv"


def write_robustness(relatives: pd.DataFrame | None) -> pd.DataFrame:
    """``claims.csv``, ``claims.md``, ``runs_per_seed.csv``, the labels' simulation under no effect
    (``label_simulation.csv``) and each claim's chain of readings (``chain.csv``) in ``results/robustness/``, the
    forest figure ``figures/robustness/robustness_forest.png`` and its README; returns the table."""
    from dmlstudy import plots
    from dmlstudy.findings.chain import chain_errors, chain_readings
    from dmlstudy.study.figure_index import write_figures_readme

    folder = study_outputs(STUDY, "results")
    folder.mkdir(parents=True, exist_ok=True)
    per_seed = collect_per_seed(relatives)
    table = robustness_table(per_seed)
    simulation = simulate_labels(per_seed)
    readings = chain_readings()
    errors = chain_errors(readings)
    per_seed.to_csv(folder / PER_SEED, index=False)
    table.to_csv(folder / "claims.csv", index=False)
    simulation.to_csv(folder / SIMULATION, index=False)
    chain = readings.merge(errors, on="claim")
    chain.to_csv(folder / CHAIN, index=False)
    (folder / "claims.md").write_text(robustness_markdown(table, simulation, chain), encoding="utf-8")
    plots.save_figure(forest_figure(table), "robustness_forest", study=STUDY)
    write_figures_readme(study_outputs(STUDY, "figures"), study=STUDY)
    return table


def readme_markdown(table: pd.DataFrame, errors: pd.DataFrame | None = None) -> str:
    """The front page's robustness table, the readings with power first: per claim the across-columns reading, held
    in every column, whether it varies with the compromise, the seeds per cell the every-column reading needs, then
    both labels and, given the chain (:func:`dmlstudy.findings.chain.chain_errors`), the published verdict with
    its error as first reached and the bound over the readings run. An amended label "unstable" (Δ of both signs
    among the cells) where Q detects no variation says so beside it."""
    from dmlstudy.findings.chain import error_text

    shown = readings_table(table)[
        [
            "claim",
            "across columns: pooled Δ [95 %]",
            "held in every column",
            "varies with the compromise",
            "seeds per cell for 80 %",
            "robustness (amended label)",
            "label as first declared",
        ]
    ]
    quiet = (shown["varies with the compromise"] != "varies") & shown["robustness (amended label)"].str.startswith(
        "unstable"
    )
    shown.loc[quiet, "robustness (amended label)"] += " (no variation detected)"
    if errors is not None:
        by_claim = errors.set_index("claim")
        shown = shown.assign(
            **{
                "published verdict (error as first reached; over the readings run)": [
                    f"{by_claim.loc[c, 'published verdict']} ({error_text(by_claim.loc[c, 'error'])}; "
                    f"{error_text(by_claim.loc[c, 'error over the readings run'])})"
                    for c in shown["claim"]
                ]
            }
        )
    return shown.rename(columns={"claim": "claim (A > B)"}).to_markdown(index=False, disable_numparse=True)


def columns_not_run(table: pd.DataFrame) -> list[str]:
    return [
        name
        for name in dict.fromkeys(table["perturbation"])
        if (table[table["perturbation"] == name]["outcome"] == "not run").all()
    ]
