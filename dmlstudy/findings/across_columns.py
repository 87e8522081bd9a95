"""Two readings of a claim over the robustness study's independent columns, and the seeds the first needs.

Declared in docs/protocol.md ("Second amendment to the robustness study"). Each independent column gives the claim's
mean paired difference Δ_j over its n_j paired seeds and their sd s_j (the relatives-out cell re-reads the default
runs and the pooled cell re-reads the partitions, so neither is a column here):

* **held in every column**, an intersection–union test: the claim is held in every column when each column's
  one-sided 95 % bound Δ_j − t_{0.95, n_j−1} · s_j / √n_j lies above 0 (reversed: every upper bound below 0).
  Its size is at most 5 % with no multiplicity correction: to say "held everywhere" falsely, the column where the
  claim fails must itself err (Berger, 1982);
* **across columns**, a random-effects meta-analysis of the Δ_j with variances v_j = s_j² / n_j: τ² (the
  variance between columns) by DerSimonian–Laird, the pooled Δ with a Hartung–Knapp interval (k − 1 degrees of
  freedom) whose variance is never below the DerSimonian–Laird one (the modification of Röver, Knapp & Friede,
  2015), read by the study's rule (:func:`dmlstudy.verdicts.read_interval`); the prediction interval of a further
  column's Δ (Higgins, Thompson & Spiegelhalter, 2009: t_{k−2} · √(τ² + SE²)), τ and I²;
* Cochran's Q, whose rejection of homogeneity at 5 % is the only ground on which the claim is said to vary with
  the compromise. Its p-value is read from Q's distribution under homogeneity simulated at each column's observed
  sd and seeds (:func:`q_null`), not from χ²_{k−1}: χ² assumes known within-column variances, and with 5 paired
  seeds per column it rejects a homogeneous effect in about a quarter of tables.

Why the modification and the simulated null: each v_j is estimated from 5 seeds, so the inverse-variance weights
are noisy; the power simulation (:mod:`dmlstudy.findings.power`) shows the plain Hartung–Knapp interval deciding a
null claim in about 9 % of tables and χ² Q rejecting homogeneity in about 25 %, against 5 % declared.

:func:`random_effects` reads one claim with statsmodels' meta-analysis module; :func:`random_effects_draws` is the
same computation vectorised over many simulated tables (tested equal to it), for :mod:`dmlstudy.findings.power`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from dmlstudy import verdicts

LEVEL = 0.05  # every reading here decides at 5 %: each column's one-sided bound, the pooled interval, Q
TARGET_POWER = 0.8  # the power the seeds per cell are sized for


# ----------------------------------------------------------------------------------------------
# Held in every column
# ----------------------------------------------------------------------------------------------
def one_sided_bounds(
    means: np.ndarray, sds: np.ndarray, seeds: int | np.ndarray, *, level: float = LEVEL
) -> tuple[np.ndarray, np.ndarray]:
    """Each column's one-sided (1 − ``level``) lower and upper bounds of Δ: Δ ∓ t_{1−level, n−1} · s / √n."""
    means, sds = np.asarray(means, dtype=float), np.asarray(sds, dtype=float)
    seeds = np.asarray(seeds, dtype=float)
    half = stats.t.ppf(1 - level, seeds - 1) * sds / np.sqrt(seeds)
    return means - half, means + half


EVERY_COLUMN = ("held in every column", "reversed in every column", "not in every column")


def every_column(means: np.ndarray, sds: np.ndarray, seeds: int | np.ndarray, *, level: float = LEVEL) -> np.ndarray:
    """The every-column reading of each row of a (draws ×) columns table: :data:`EVERY_COLUMN`'s first text when
    every lower bound is above 0, its second when every upper bound is below 0, its third otherwise."""
    low, high = one_sided_bounds(np.atleast_2d(means), np.atleast_2d(sds), seeds, level=level)
    held, reversed_ = (low > 0).all(axis=1), (high < 0).all(axis=1)
    return np.select([held, reversed_], list(EVERY_COLUMN[:2]), default=EVERY_COLUMN[2])


def every_column_power(delta: float, sds: np.ndarray, seeds: int | np.ndarray, *, level: float = LEVEL) -> np.ndarray:
    """The chance that the every-column reading says "held" (or "reversed", for Δ < 0) when every column's true Δ
    is ``delta``: the product over the columns of the one-sided t-test's power, from the noncentral t
    distribution with noncentrality |Δ| · √n / s_j. Vectorised over ``seeds``."""
    seeds = np.atleast_1d(np.asarray(seeds, dtype=float))[:, None]
    sds = np.asarray(sds, dtype=float)[None, :]
    critical = stats.t.ppf(1 - level, seeds - 1)
    each = stats.nct.sf(critical, seeds - 1, abs(delta) * np.sqrt(seeds) / sds)
    return each.prod(axis=1)


def seeds_for_power(
    delta: float,
    sds: np.ndarray,
    *,
    power: float = TARGET_POWER,
    level: float = LEVEL,
    max_seeds: int = verdicts.MAX_SEEDS,
) -> int | None:
    """The fewest paired seeds per column (the same n in each) at which the every-column reading has ``power``
    when every column's true Δ is ``delta`` and its sd as given (:func:`every_column_power`); None beyond
    ``max_seeds``."""
    if not np.isfinite(delta) or delta == 0 or not len(sds):
        return None
    seeds = np.arange(2, max_seeds + 1)
    reached = every_column_power(delta, sds, seeds, level=level) >= power
    return int(seeds[np.argmax(reached)]) if reached.any() else None


# ----------------------------------------------------------------------------------------------
# Across columns: a random-effects meta-analysis
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RandomEffects:
    """One claim's random-effects reading over its k independent columns (docs/protocol.md, "Second amendment
    to the robustness study")."""

    columns: int  # k
    pooled: float  # the random-effects pooled Δ
    low: float  # its Hartung–Knapp 95 % interval (k − 1 degrees of freedom)
    high: float
    prediction_low: float  # the 95 % prediction interval of a further column's Δ (k ≥ 3)
    prediction_high: float
    tau2: float  # τ², DerSimonian–Laird
    i2: float  # I² = max(0, (Q − (k − 1)) / Q)
    q: float  # Cochran's Q
    q_p: float  # its p-value from its simulated null (q_null): the one the reading uses
    q_p_chi2: float = float("nan")  # its p-value against χ² with k − 1 degrees of freedom, for comparison

    @property
    def tau(self) -> float:
        return float(np.sqrt(self.tau2))

    @property
    def varies(self) -> bool:
        """Whether Q rejects homogeneity at 5 %: the only case in which the claim is said to vary."""
        return bool(self.q_p < LEVEL)

    def outcome(self, *, margin: float = verdicts.MARGIN) -> str:
        """The pooled interval read by the study's rule: held, reversed, not held (equivalent) or undecided."""
        text = str(verdicts.read_interval(self.low, self.high, margin=margin))
        return verdicts.RULE[">"].get(text, verdicts.UNDECIDED)

    def columns_dict(self) -> dict[str, float]:
        return {**asdict(self), "tau": self.tau}


def prediction_half_width(tau2: np.ndarray, se: np.ndarray, k: int, *, confidence: float = 0.95) -> np.ndarray:
    """t_{(1+c)/2, k−2} · √(τ² + SE²): the half-width of the prediction interval (NaN below 3 columns)."""
    if k < 3:
        return np.full(np.shape(tau2), np.nan)
    return stats.t.ppf((1 + confidence) / 2, k - 2) * np.sqrt(np.asarray(tau2) + np.asarray(se) ** 2)


def random_effects(
    effects: np.ndarray, variances: np.ndarray, *, q_p: float | None = None, confidence: float = 0.95
) -> RandomEffects:
    """The random-effects reading of one claim (:class:`RandomEffects`) by statsmodels' ``combine_effects``
    (DerSimonian–Laird τ², its fixed-scale and Hartung–Knapp variances of the pooled Δ), the larger variance taken
    and the prediction interval added here. statsmodels leaves a negative DerSimonian–Laird τ² as it is; it is
    truncated at 0 here, as the estimator is defined, and with τ² = 0 the reading is the fixed-effect one
    (statsmodels' ``_fe`` results). ``q_p``: Q's p-value from its simulated null (:func:`q_null`); χ²'s when
    None."""
    from statsmodels.stats.meta_analysis import combine_effects

    effects, variances = np.asarray(effects, dtype=float), np.asarray(variances, dtype=float)
    k = len(effects)
    with np.errstate(invalid="ignore"):  # statsmodels' square roots of a negative τ²'s variances, unused here
        combined = combine_effects(effects, variances, method_re="dl", use_t=True, alpha=1 - confidence)
    between = float(combined.tau2) > 0
    tau2 = float(combined.tau2) if between else 0.0
    pooled = float(combined.mean_effect_re if between else combined.mean_effect_fe)
    fixed_scale = float(combined.sd_eff_w_re if between else combined.sd_eff_w_fe)
    se = max(float(combined.sd_eff_w_re_hksj if between else combined.sd_eff_w_fe_hksj), fixed_scale)
    half = stats.t.ppf((1 + confidence) / 2, k - 1) * se
    predicted = float(prediction_half_width(np.asarray(tau2), np.asarray(se), k, confidence=confidence))
    homogeneity = combined.test_homogeneity()
    return RandomEffects(
        columns=k,
        pooled=pooled,
        low=pooled - half,
        high=pooled + half,
        prediction_low=pooled - predicted,
        prediction_high=pooled + predicted,
        tau2=tau2,
        i2=float(max(0.0, combined.i2)),
        q=float(homogeneity.statistic),
        q_p=float(homogeneity.pvalue) if q_p is None else float(q_p),
        q_p_chi2=float(homogeneity.pvalue),
    )


def random_effects_draws(
    effects: np.ndarray, variances: np.ndarray, *, confidence: float = 0.95, modified: bool = True
) -> dict[str, np.ndarray]:
    """:func:`random_effects` of every row of a draws × k table at once (plain numpy, the same formulas):

        w_j = 1 / v_j;  Δ_FE = Σ w_j Δ_j / Σ w_j;  Q = Σ w_j (Δ_j − Δ_FE)²
        τ² = max(0, (Q − (k − 1)) / (Σ w_j − Σ w_j² / Σ w_j))                       (DerSimonian–Laird)
        w*_j = 1 / (v_j + τ²);  Δ_RE = Σ w*_j Δ_j / Σ w*_j
        SE² = max(Σ w*_j (Δ_j − Δ_RE)² / (k − 1), 1) / Σ w*_j   (Hartung–Knapp, never below 1 / Σ w*_j)
        Δ_RE ± t_{(1+c)/2, k−1} · SE

    ``modified=False``: the plain Hartung–Knapp variance (without the floor), for the simulation's comparison.
    Returns arrays ``pooled, low, high, prediction_low, prediction_high, tau2, i2, q, q_p_chi2``."""
    effects, variances = np.atleast_2d(effects).astype(float), np.atleast_2d(variances).astype(float)
    k = effects.shape[1]
    weights = 1 / variances
    fixed = (weights * effects).sum(axis=1, keepdims=True) / weights.sum(axis=1, keepdims=True)
    q = (weights * (effects - fixed) ** 2).sum(axis=1)
    scale = weights.sum(axis=1) - (weights**2).sum(axis=1) / weights.sum(axis=1)
    tau2 = np.maximum(0.0, (q - (k - 1)) / scale)
    random = 1 / (variances + tau2[:, None])
    pooled = (random * effects).sum(axis=1) / random.sum(axis=1)
    spread = (random * (effects - pooled[:, None]) ** 2).sum(axis=1) / (k - 1)
    se = np.sqrt((np.maximum(spread, 1.0) if modified else spread) / random.sum(axis=1))
    half = stats.t.ppf((1 + confidence) / 2, k - 1) * se
    predicted = prediction_half_width(tau2, se, k, confidence=confidence)
    with np.errstate(divide="ignore", invalid="ignore"):
        i2 = np.where(q > 0, np.maximum(0.0, (q - (k - 1)) / q), 0.0)
    return {
        "pooled": pooled,
        "low": pooled - half,
        "high": pooled + half,
        "prediction_low": pooled - predicted,
        "prediction_high": pooled + predicted,
        "tau2": tau2,
        "i2": i2,
        "q": q,
        "q_p_chi2": stats.chi2.sf(q, k - 1),
    }


def cochran_q(means: np.ndarray, variances: np.ndarray) -> np.ndarray:
    """Cochran's Q = Σ w_j (Δ_j − Δ_FE)², w_j = 1 / v_j, of each row of a (draws ×) columns table."""
    means, weights = np.atleast_2d(means).astype(float), 1 / np.atleast_2d(variances).astype(float)
    fixed = (weights * means).sum(axis=1, keepdims=True) / weights.sum(axis=1, keepdims=True)
    return (weights * (means - fixed) ** 2).sum(axis=1)


Q_NULL_DRAWS = 20_000


def q_null(sds: np.ndarray, seeds: np.ndarray, *, draws: int = Q_NULL_DRAWS, random_seed: int = 0) -> np.ndarray:
    """Q's distribution under homogeneity (one Δ in every column), simulated: ``draws`` tables of each column's
    ``seeds`` paired differences drawn N(0, sd_j²), each column's mean and variance estimated from its draws as the
    reading estimates them. Q is nearly free of the sds (its terms are squared t statistics), so the observed sds
    serve (a parametric bootstrap). Sorted."""
    rng = np.random.default_rng(random_seed)
    sds, seeds = np.asarray(sds, dtype=float), np.asarray(seeds, dtype=int)
    means = np.empty((draws, len(sds)))
    variances = np.empty((draws, len(sds)))
    for column, (sd, n) in enumerate(zip(sds, seeds)):
        values = rng.normal(0.0, sd, (draws, n))
        means[:, column] = values.mean(axis=1)
        variances[:, column] = values.var(axis=1, ddof=1) / n
    return np.sort(cochran_q(means, variances))


def q_p_value(q: float | np.ndarray, null: np.ndarray) -> np.ndarray:
    """The Monte Carlo p-value of ``q`` against the simulated null (:func:`q_null`, sorted): (the draws at or above
    it + 1) / (draws + 1), so never 0."""
    above = len(null) - np.searchsorted(null, np.asarray(q, dtype=float), side="left")
    return (above + 1) / (len(null) + 1)


def read_pooled(low: np.ndarray, high: np.ndarray, *, margin: float = verdicts.MARGIN) -> np.ndarray:
    """The outcome of each pooled interval by the study's rule (vectorised :meth:`RandomEffects.outcome`)."""
    texts = verdicts.read_interval(low, high, margin=margin)
    outcome = np.full(np.shape(texts), verdicts.UNDECIDED, dtype=object)
    for text, decided in verdicts.RULE[">"].items():
        outcome[texts == text] = decided
    return outcome.astype(str)
