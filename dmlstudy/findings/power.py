"""How often each reading of the robustness study says what it says: false rates and power, by simulation.

Declared in docs/protocol.md ("Second amendment to the robustness study") before the last two columns' results.
For each headline claim, tables of the 9 declared columns are drawn with a chosen true Δ per column: 5 paired seeds
per cell, each drawn N(Δ_j, s_j²) with the column's observed paired sd s_j (the default's where a column has not
run); the relatives-out cell the default's differences plus N(0, the observed per-seed shift's sd²); the pooled
cell the t-interval of the three partitions' means. Each table is read by all five readings:

* the **label as first declared** and the **amended label** (:mod:`dmlstudy.findings.robustness`): "robust",
  held (or reversed) in every cell;
* **held in every column** and **across columns** (:mod:`dmlstudy.findings.across_columns`), over the 7
  independent columns;
* **varies with the compromise**: Cochran's Q rejects homogeneity at 5 %.

The scenarios: Δ = 0, +1, +2, +3, +5 in every column, and +3 in every independent column but one, which is 0 (each
of the 7 in turn; a partition's null enters the pooled cell, the default's the relatives-out cell). Every reading is
symmetric in the sign of Δ, so the power to say "reversed" at −δ is the power to say "held" at +δ.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from dmlstudy import verdicts
from dmlstudy.findings import across_columns
from dmlstudy.findings import robustness as rb
from dmlstudy.findings.claims import Claim
from dmlstudy.paths import study_outputs

DELTAS = (0.0, 1.0, 2.0, 3.0, 5.0)  # Δ in every column
ONE_NULL = 3.0  # Δ in every independent column but one
SEEDS = 5  # paired seeds per cell, as the study ran
DRAWS = 20_000
VARIES = "varies with the compromise (Q)"
READINGS = ("label as first declared", "amended label", "held in every column", "across columns", VARIES)
NOT_USED = (  # the textbook forms the amendment does not use, simulated beside them to show why
    "across columns, plain Hartung–Knapp (not used)",
    "Q against χ² (not used)",
)
STATEMENTS = {  # what each reading says when it "says yes" in the + direction
    "label as first declared": "robust, held",
    "amended label": "robust, held",
    "held in every column": "held in every column",
    "across columns": "held across columns",
    VARIES: "varies",
    NOT_USED[0]: "held across columns",
    NOT_USED[1]: "varies",
}
POWER_CSV, POWER_MD = "power.csv", "power.md"


DECLARED_FROM = (  # the cells that had run when the simulation was declared: their sds, and only theirs, are read
    "default",
    "partition 1",
    "partition 2",
    rb.SCHEDULE,
    "unseen designers",
    rb.RELATIVES_OUT,
)


DECLARED_ON = "cpu_a"  # the folder, inside a column's results, of the rows the simulation was declared from


def declared_rows() -> pd.DataFrame:
    """The per-seed rows of the columns whose runs were trained again under the pinned numerics after the
    simulation was declared, as it read them then: the CPU-A columns' rows kept in ``results/<study>/cpu_a/``
    (docs/protocol.md, third amendment) and the partitions' rows as they ran (fourth amendment)."""
    earlier = rb.collect_per_seed(outputs=lambda study: study_outputs(study, "results") / DECLARED_ON, reruns=False)
    again = [p.name for p in rb.PERTURBATIONS if p.reruns]
    as_run = rb.collect_per_seed(reruns=False) if again else pd.DataFrame()
    as_run = as_run[as_run["perturbation"].isin(again)] if len(as_run) else as_run
    frames = [frame for frame in (earlier, as_run) if len(frame)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def as_declared(per_seed: pd.DataFrame) -> pd.DataFrame:
    """The per-seed rows of :data:`DECLARED_FROM` alone, as they were when the simulation was declared, so that the
    committed simulation recomputes the same once the later columns' rows join the per-seed table (they take the
    default's sd, as when it was declared) and once a column is run again (its earlier rows, :func:`declared_rows`,
    stand in for the new ones)."""
    if not len(per_seed):
        return per_seed
    kept = per_seed[per_seed["perturbation"].isin(DECLARED_FROM)]
    earlier = declared_rows()
    if not len(earlier):
        return kept
    kept = kept[~kept["perturbation"].isin(earlier["perturbation"].unique())]
    return pd.concat([kept, earlier[[c for c in kept.columns if c in earlier.columns]]], ignore_index=True)


def _scenarios() -> list[tuple[str, float, str, dict[str, float]]]:
    """(scenario, δ, null column, true Δ per independent column)."""
    scenarios = [
        (
            f"Δ = {delta:+g} in every column" if delta else "Δ = 0 in every column",
            delta,
            "",
            dict.fromkeys(rb.INDEPENDENT, delta),
        )
        for delta in DELTAS
    ]
    for null in rb.INDEPENDENT:
        truth = {name: 0.0 if name == null else ONE_NULL for name in rb.INDEPENDENT}
        scenarios.append((f"Δ = {ONE_NULL:+g}, one column null", ONE_NULL, null, truth))
    return scenarios


def read_tables(
    values: dict[str, np.ndarray], *, margin: float, q_critical: float
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every reading's (says held, says reversed) per draw, from the independent columns' draws × seeds paired
    differences (``values``; plus :data:`robustness.RELATIVES_OUT` and :data:`robustness.POOLED`, built by the
    caller). The varies readings give (Q rejects, all False): Q above ``q_critical`` (the 95 % point of its
    simulated null), or against χ²."""
    names = [p.name for p in rb.PERTURBATIONS]
    labelled = [p.name for p in rb.PERTURBATIONS if p.labelled]
    read = {name: rb._read_draws(values[name], margin=margin) for name in names}
    outcomes = np.stack([read[name][0] for name in names], axis=1)
    deltas = np.stack([read[name][1] for name in names], axis=1)
    amended = rb.label_outcomes(outcomes, deltas)
    first = outcomes[:, [names.index(name) for name in labelled]]
    declared = rb.declared_label_outcomes(first)
    independent = np.stack([values[name] for name in rb.INDEPENDENT], axis=1)  # draws × columns × seeds
    seeds = independent.shape[2]
    means, sds = independent.mean(axis=2), independent.std(axis=2, ddof=1)
    every = across_columns.every_column(means, sds, seeds)
    pooled = across_columns.random_effects_draws(means, sds**2 / seeds)
    across = across_columns.read_pooled(pooled["low"], pooled["high"], margin=margin)
    plain = across_columns.random_effects_draws(means, sds**2 / seeds, modified=False)
    plain_across = across_columns.read_pooled(plain["low"], plain["high"], margin=margin)
    never = np.zeros(len(means), dtype=bool)
    return {
        "label as first declared": (
            (declared == "robust") & (first == "held").any(axis=1),
            (declared == "robust") & (first == "reversed").any(axis=1),
        ),
        "amended label": (
            (amended == "robust") & (outcomes[:, 0] == "held"),
            (amended == "robust") & (outcomes[:, 0] == "reversed"),
        ),
        "held in every column": (every == across_columns.EVERY_COLUMN[0], every == across_columns.EVERY_COLUMN[1]),
        "across columns": (across == "held", across == "reversed"),
        VARIES: (pooled["q"] > q_critical, never),
        NOT_USED[0]: (plain_across == "held", plain_across == "reversed"),
        NOT_USED[1]: (pooled["q_p_chi2"] < across_columns.LEVEL, never),
    }


def simulate_readings(
    per_seed: pd.DataFrame,
    claims: Sequence[Claim] | None = None,
    *,
    draws: int = DRAWS,
    seeds: int = SEEDS,
    random_seed: int = 0,
) -> pd.DataFrame:
    """One row per (claim, scenario, null column, reading): the rate at which the reading says held (its
    ``statement``) and says reversed, and ``rate``, what the scenario makes of it: under Δ = 0 the false rate in
    either direction; under Δ in every column the power (for Q, its false rate: the truth is homogeneous); with one
    null column the false rate of the labels and of the every-column reading (the claim is not held there) and the
    power of the across-columns reading (the mean Δ is positive) and of Q. Seeded: the same arguments give the same
    table. Only the cells of :data:`DECLARED_FROM` are read (:func:`as_declared`)."""
    claims = tuple(claims or rb.headline_claims())
    per_seed = as_declared(per_seed)
    rows = []
    for index, claim in enumerate(claims):
        margin = claim.margin or verdicts.MARGIN
        spreads = rb.simulated_spreads(per_seed, claim)
        independent_sds = np.asarray([spreads[name] for name in rb.INDEPENDENT])
        null_q = across_columns.q_null(independent_sds, np.full(len(independent_sds), seeds), random_seed=index)
        q_critical = float(np.quantile(null_q, 1 - across_columns.LEVEL))
        for number, (scenario, delta, null, truth) in enumerate(_scenarios()):
            rng = np.random.default_rng([random_seed, index, number])
            values = {name: rng.normal(truth[name], spreads[name], (draws, seeds)) for name in rb.INDEPENDENT}
            values[rb.RELATIVES_OUT] = values["default"] + rng.normal(0.0, spreads[rb.RELATIVES_OUT], (draws, seeds))
            values[rb.POOLED] = np.stack([values[name].mean(axis=1) for name in rb.PARTITIONS], axis=1)
            for reading, (held, reversed_) in read_tables(values, margin=margin, q_critical=q_critical).items():
                varies = STATEMENTS[reading] == "varies"
                if varies:
                    kind, rate = ("power" if null else "false rate"), held.mean()
                elif delta == 0:
                    kind, rate = "false rate", held.mean() + reversed_.mean()
                elif null and STATEMENTS[reading] != "held across columns":
                    kind, rate = "false rate", held.mean()
                else:
                    kind, rate = "power", held.mean()
                rows.append(
                    {
                        "claim": claim.name,
                        "scenario": scenario,
                        "Δ": delta,
                        "null column": null,
                        "reading": reading,
                        "statement": STATEMENTS[reading],
                        "says held": held.mean(),
                        "says reversed": reversed_.mean(),
                        "rate": rate,
                        "what": kind,
                        "draws": draws,
                        "seeds": seeds,
                    }
                )
    return pd.DataFrame(rows)


def seeds_needed(per_seed: pd.DataFrame, claims: Sequence[Claim] | None = None) -> pd.DataFrame:
    """Per claim, from the cells of :data:`DECLARED_FROM`: the random-effects pooled Δ over the independent columns
    among them, every independent column's sd
    (the default's where it has not run), the every-column reading's power at 5 seeds per cell and the paired seeds
    per cell at which it reaches 80 % if every column's true Δ were the pooled Δ
    (:func:`robustness.seeds_for_every_column`)."""
    claims = tuple(claims or rb.headline_claims())
    per_seed = as_declared(per_seed)
    rows = []
    for claim in claims:
        spreads = rb.simulated_spreads(per_seed, claim)
        reading = rb.across_reading(per_seed, claim)
        sds = np.asarray([spreads[name] for name in rb.INDEPENDENT])
        now = across_columns.every_column_power(reading.pooled, sds, SEEDS)[0] if reading else np.nan
        rows.append(
            {
                "claim": claim.name,
                "pooled Δ": round(reading.pooled, 2) if reading else np.nan,
                "columns pooled": reading.columns if reading else 0,
                **{f"sd {name}": round(spreads[name], 3) for name in rb.INDEPENDENT},
                f"power at {SEEDS} seeds": now,
                "seeds per cell for 80 % power": rb.seeds_for_every_column(per_seed, claim, reading),
            }
        )
    return pd.DataFrame(rows)


def summary(simulation: pd.DataFrame) -> pd.DataFrame:
    """Per scenario and reading: the rate's median over the claims with its range, the one-null scenario first
    averaged over which column is null and, beside it, its largest over the null column."""
    per_claim = simulation.groupby(["scenario", "reading", "what", "claim"], sort=False).agg(
        rate=("rate", "mean"), largest=("rate", "max")
    )
    grouped = per_claim.groupby(["scenario", "reading", "what"], sort=False)
    table = grouped.agg(
        median=("rate", "median"), low=("rate", "min"), high=("rate", "max"), largest=("largest", "max")
    )
    return table.reset_index()


def _percent(value: float) -> str:
    return f"{100 * value:.1f} %" if value >= 0.001 or value == 0 else f"{100 * value:.2f} %"


def power_markdown(simulation: pd.DataFrame, needed: pd.DataFrame) -> str:
    """The summary (:func:`summary`) as scenarios × readings, each cell the median over the 8 claims [min–max],
    and the seeds per cell the every-column reading needs."""
    table = summary(simulation)
    table["cell"] = [
        f"{_percent(r.median)} [{_percent(r.low)}–{_percent(r.high)}]"
        + (f"; worst null column {_percent(r.largest)}" if "null" in r.scenario and r.what == "false rate" else "")
        + (" (false)" if r.what == "false rate" else "")
        for r in table.itertuples()
    ]
    wide = table.pivot(index="scenario", columns="reading", values="cell").rename_axis(None, axis=1)
    scenarios = list(dict.fromkeys(table["scenario"]))
    used = wide.loc[scenarios, list(READINGS)].reset_index().rename(columns={"scenario": "true Δ"})
    compared = wide.loc[scenarios, [VARIES, NOT_USED[1], "across columns", NOT_USED[0]]]
    compared = compared.reset_index().rename(columns={"scenario": "true Δ"})
    draws, seeds = int(simulation["draws"].iloc[0]), int(simulation["seeds"].iloc[0])
    shown = needed.assign(
        **{
            f"power at {SEEDS} seeds": [
                _percent(v) if np.isfinite(v) else "–" for v in needed[f"power at {SEEDS} seeds"]
            ],
            "seeds per cell for 80 % power": [
                "–" if pd.isna(v) else f"{int(v):,}" for v in needed["seeds per cell for 80 % power"]
            ],
        }
    )
    return (
        "# How often each reading of the robustness study says what it says\n\n"
        "Simulated before the 224-px and 30-epoch (no early stopping) columns' results, as declared in "
        'docs/protocol.md ("Second amendment to the robustness study"); written by `dmlstudy study robustness-power` '
        "(`make robustness-power`, `dmlstudy.findings.power`) from the committed `runs_per_seed.csv`. Per claim, "
        f"{draws:,} tables of the 9 declared columns, {seeds} paired seeds per cell drawn with each cell's observed "
        "paired sd (the default's for a column not run), the pooled cell from the 3 partitions' means, the "
        "relatives-out cell the default's draws plus the observed per-seed shift; each table read by every reading. "
        "Each cell: the median over the 8 headline claims [smallest–largest]; *(false)* marks a rate of saying "
        "something untrue: under Δ = 0 a direction (held or reversed), with one null column *held in every column* "
        "or *robust*, under a Δ common to all columns *varies*. Otherwise the rate is power: the chance of saying "
        "held (for the labels: robust, held in every cell). With one null column the rate is averaged over which "
        "of the 7 independent columns is null; a false rate adds its largest over that choice. Every reading is "
        "symmetric in the sign of Δ: the power to say reversed at −δ is the power to say held at +δ.\n\n"
        + used.to_markdown(index=False)
        + "\n\n## Why Q is read against a simulated null, and the pooled interval never narrower than DerSimonian–"
        "Laird's\n\n"
        "Each column's variance is estimated from its 5 paired seeds. Against χ²_{k−1} (which assumes known "
        "variances) Cochran's Q calls a common effect varying in about a quarter of tables, and the plain "
        "Hartung–Knapp interval decides a null claim in about 9 %; the declared readings (Q against its null "
        "simulated at the columns' sds, the Hartung–Knapp variance floored at the DerSimonian–Laird one) stay near "
        "5 %. In this simulation Q's 95 % point is computed once per claim at the sds the tables are drawn with; the "
        "table's reading computes it at the observed sds, and the point moves little with them (Q's terms are "
        "squared t statistics).\n\n"
        + compared.to_markdown(index=False)
        + "\n\n## Seeds per cell for the every-column reading\n\n"
        "The paired seeds per cell (the same in each of the 7 independent columns) at which *held in every column* "
        "has 80 % power if every column's true Δ were the claim's random-effects pooled Δ (over the independent "
        "columns run so far), from the noncentral t distribution at each column's observed sd; and its power at "
        f"{SEEDS} seeds. –: no finite number up to {verdicts.MAX_SEEDS:,}.\n\n" + shown.to_markdown(index=False) + "\n"
    )


def front_page_table(simulation: pd.DataFrame) -> str:
    """The front page's summary of :func:`summary`: per reading (those with power first), its false rate (median
    over the claims [range]; with one null column, averaged over which) and its power at +1, +2, +3 and +5 in every
    column (medians; for Q, its power with one null column)."""

    def rate(scenario: str, reading: str, *, spread: bool = False) -> str:
        row = table.loc[(scenario, reading)]
        text = f"{100 * row['median']:.1f} %"
        return text + (f" [{100 * row['low']:.1f}–{100 * row['high']:.1f}]" if spread else "")

    table = summary(simulation).set_index(["scenario", "reading"])
    null, one_null = "Δ = 0 in every column", f"Δ = {ONE_NULL:+g}, one column null"
    rows = []
    for reading in ("across columns", "held in every column", VARIES, "amended label", "label as first declared"):
        if reading == VARIES:
            false = f"{rate(null, reading, spread=True)} (a Δ common to every column)"
            powers = f"{rate(one_null, reading, spread=True)} with one column of seven null, the others +3"
        else:
            false = f"{rate(null, reading, spread=True)} (no effect)"
            if reading != "across columns":
                false += f"; {rate(one_null, reading, spread=True)} (one column null, the others +3)"
            powers = " / ".join(rate(f"Δ = {delta:+g} in every column", reading) for delta in DELTAS[1:])
        rows.append({"reading": reading, "false rate": false, "power at +1 / +2 / +3 / +5 in every column": powers})
    return pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True)


def write_power(per_seed: pd.DataFrame | None = None, *, draws: int = DRAWS) -> pd.DataFrame:
    """``results/robustness/power.csv`` (:func:`simulate_readings`) and ``power.md`` (with :func:`seeds_needed`),
    from the committed per-seed table; returns the simulation."""
    folder = study_outputs(rb.STUDY, "results")
    if per_seed is None:
        per_seed = pd.read_csv(folder / rb.PER_SEED)
    simulation = simulate_readings(per_seed, draws=draws)
    needed = seeds_needed(per_seed)
    rounded = simulation.assign(**{c: simulation[c].round(5) for c in ("says held", "says reversed", "rate")})
    rounded.to_csv(folder / POWER_CSV, index=False)
    (folder / POWER_MD).write_text(power_markdown(rounded, needed), encoding="utf-8")
    return simulation
