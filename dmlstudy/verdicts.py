"""The statistics of claims: paired seeds, one verdict rule, multiplicity across a family.

Pure functions on numbers (numpy, ``scipy.stats``, pandas); the rule is declared in ``docs/protocol.md``.

* **Paired differences** d_s = A_s − B_s of one metric over the seeds both rows ran (:func:`paired_differences`
  from a per-run frame, :func:`paired_interval` from a per-seed table), in points for retrieval metrics
  (:func:`metric_scale`).
* **The rule** (:func:`judge`, :func:`read_interval`): the two-sided t-interval of Δ = mean(d) against 0 and the
  equivalence margin ±m, read by the claim's kind — "A > B" or "A ≈ B" — in a stated order of precedence
  (:data:`RULE`), so that a verdict's text and its ``outcome`` never disagree (:func:`verdict_agrees`).
* **Multiplicity** (:func:`decision_p_values`, :func:`holm`, :func:`holm_columns`): each verdict's p-value (the
  smallest error rate at which the interval reaches it) adjusted by Holm's step-down method over a family of
  claims.
* A sequential design over several looks at growing seed counts reads its looks by this rule:
  :mod:`dmlstudy.study.sequential`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

MARGIN = 1.0  # equivalence margin in the claim's unit (R@1 points); the plans set it as `margin`
CONFIDENCE = 0.95  # two-sided t-interval of the mean paired difference
ALPHA = 0.05  # the error rate of one decision over all its looks, and the family-wise rate of Holm's adjustment
NO_EFFECT = 0.25  # a paper difference below this many points is read as "no effect" (an equivalence claim)
MAX_SEEDS = 10_000  # seeds-to-decide searches no further ("more than 10000")
PERCENT_METRICS = frozenset(  # metrics stored as fractions in [0, 1]: shown and judged in points (× 100)
    {"R@1", "R@2", "R@4", "R@8", "R@10", "R@16", "R@20", "R@30", "R@32", "R@100", "R@1000", "P@1", "RP", "MAP@R", "NMI"}
)
CENSORED_METRICS = ("best_epoch", "seconds_to_best")  # epochs-to-best: an epoch cap can cut them short

# The rule, per claimed relation: the decided verdict texts in their order of precedence → the claim's outcome.
# "held": the claim holds; "reversed": B beats A (claims "A > B" only); "not held": the claim fails without a
# reversal (no effect for "A > B"; a difference beyond the margin for "A ≈ B").
RULE: dict[str, dict[str, str]] = {
    ">": {
        "held, smaller than the margin": "held",  # interval inside (0, +m): a real but negligible improvement
        "held": "held",  # interval above 0 and reaching +m or beyond
        "reversed, smaller than the margin": "reversed",  # interval inside (−m, 0)
        "reversed": "reversed",  # interval below 0 and reaching −m or beyond
        "equivalent (no effect)": "not held",  # interval across 0 and inside (−m, +m): the improvement is absent
    },
    "≈": {
        "equivalent": "held",  # interval inside (−m, +m), whether or not it holds 0
        "not equivalent (A > B)": "not held",  # interval above +m
        "not equivalent (A < B)": "not held",  # interval below −m
    },
}
OUTCOMES = ("held", "reversed", "not held", "undecided", "no verdict")
UNDECIDED = "undecided"
CENSORED_READING = "censored by the epoch cap"  # in the text of a verdict censor() overturned
NO_VERDICT = "no verdict"
# The hypothesis each decided text rejects (its p-value: decision_p_values): Δ = 0; |Δ| ≥ m; Δ ≤ +m; Δ ≥ −m.
DECISION_TEST = {
    "held, smaller than the margin": "zero",
    "held": "zero",
    "reversed, smaller than the margin": "zero",
    "reversed": "zero",
    "equivalent (no effect)": "inside",
    "equivalent": "inside",
    "not equivalent (A > B)": "above",
    "not equivalent (A < B)": "below",
}


def metric_scale(metric: str) -> float:
    """100 for retrieval metrics stored as fractions (shown and judged in points), 1 for the others."""
    return 100.0 if metric in PERCENT_METRICS else 1.0


def claimed_relation(claimed: str) -> str:
    """``">"`` or ``"≈"`` from a claim's relation, also as the tables write it (``"A > B"``, ``"A ≈ B"``)."""
    relation = claimed.removeprefix("A ").removesuffix(" B").strip()
    if relation not in RULE:
        raise ValueError(f"unknown claimed relation {claimed!r}; valid: {sorted(RULE)} (or 'A > B', 'A ≈ B')")
    return relation


# ----------------------------------------------------------------------------------------------
# Paired differences
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Paired:
    """Per-seed paired differences ``d_s = A_s − B_s`` of one metric, in points (or the metric's own unit)."""

    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    censoring: Mapping[str, str] = field(default_factory=dict)  # censor()'s arguments: paired_censoring()


def paired_differences(
    frame: pd.DataFrame,
    dataset: str,
    first: str,
    second: str,
    metric: str = "R@1",
    *,
    first_scale: float = 1.0,
    second_scale: float = 1.0,
    column: str = "variant",
    in_points: bool = False,
) -> Paired:
    """``first_scale·A_s − second_scale·B_s`` for every seed ``s`` that both rows ran on ``dataset``.

    ``frame`` has one row per run (``column`` naming the row, ``dataset``, ``seed``, ``metric``); retrieval
    metrics are turned into points (:func:`metric_scale`) unless ``in_points`` (a per-seed table already holds
    them in points). Seed s gives both runs the same backbone
    initialisation and batch sequence, so only seeds present on both sides pair; runs with a missing value of
    ``metric`` do not count. A row with no runs at all raises ``KeyError``. The result also names the paired
    runs whose epochs-to-best the cap cut short (:func:`paired_censoring`), for :func:`censor` when ``metric``
    is one.
    """
    if metric not in frame.columns:
        raise KeyError(f"paired_differences: no column {metric!r} among {sorted(frame.columns)}")
    here = frame[frame["dataset"] == dataset]
    sides = []
    for name in (first, second):
        rows = here[here[column] == name]
        if rows.empty:
            raise KeyError(f"no runs of {column} {name!r} on {dataset!r}")
        rows = rows.dropna(subset=[metric])
        sides.append(rows.groupby("seed")[metric].mean() * (1.0 if in_points else metric_scale(metric)))
    common = sides[0].index.intersection(sides[1].index).sort_values()
    differences = first_scale * sides[0].loc[common] - second_scale * sides[1].loc[common]
    seeds = tuple(int(s) for s in common)
    censoring = paired_censoring(
        frame, dataset, first, second, seeds, first_scale=first_scale, second_scale=second_scale, column=column
    )
    return Paired(seeds, tuple(float(d) for d in differences), censoring)


def paired_censoring(
    frame: pd.DataFrame,
    dataset: str,
    first: str,
    second: str,
    seeds: Sequence[int],
    *,
    first_scale: float = 1.0,
    second_scale: float = 1.0,
    column: str = "variant",
) -> dict[str, str]:
    """:func:`censor`'s ``can_rise`` / ``can_fall`` for the paired differences ``first_scale·A_s −
    second_scale·B_s`` (:func:`paired_differences`) over ``seeds``: the runs whose ``best_epoch_censored``
    is true, by the direction their true value could move Δ (a censored value can only be higher than
    recorded), e.g. ``"5 of 5 triplet runs"``. Rows without the column count as uncensored."""
    if "best_epoch_censored" not in frame.columns:
        return {"can_rise": "", "can_fall": ""}
    here = frame[(frame["dataset"] == dataset) & frame["seed"].isin(list(seeds))]
    moves: dict[str, list[str]] = {"can_rise": [], "can_fall": []}
    for name, signed_scale in ((first, first_scale), (second, -second_scale)):
        rows = here[here[column] == name].drop_duplicates("seed")
        count = int(rows["best_epoch_censored"].eq(True).sum())
        if count and signed_scale:
            moves["can_rise" if signed_scale > 0 else "can_fall"].append(f"{count} of {len(seeds)} {name} runs")
    return {direction: ", ".join(texts) for direction, texts in moves.items()}


def t_half_width(sd: float, seeds: int | np.ndarray, *, confidence: float = CONFIDENCE) -> float | np.ndarray:
    """``t_{(1+confidence)/2, n−1} · sd / √n``: the half-width of the t-interval of a mean of ``n`` values."""
    seeds = np.asarray(seeds, dtype=float)
    return stats.t.ppf((1 + confidence) / 2, seeds - 1) * sd / np.sqrt(seeds)


def paired_interval(
    per_seed: pd.DataFrame,
    *,
    A: str,
    B: str,
    metric: str,
    dataset: str,
    regime: str,
    confidence: float = CONFIDENCE,
    a_scale: float = 1.0,
    b_scale: float = 1.0,
    seeds: int | None = None,
) -> tuple[float, float, float, int]:
    """(Δ, low, high, n) of a claim recomputed from a per-seed table (columns ``regime, dataset, row, seed,
    <metrics>``, retrieval metrics in points as the claims read them): rows ``row == A`` and ``row == B`` of
    ``regime`` and ``dataset`` paired by ``seed`` (:func:`paired_differences`), the first ``seeds`` pairs in seed
    order (all when None: the look a claims table's ``seeds`` column names), Δ = mean of a_scale·A_s −
    b_scale·B_s, and its two-sided t-interval at ``confidence`` (NaN below 2 paired seeds)."""
    paired = paired_differences(
        per_seed[per_seed["regime"] == regime],
        dataset,
        A,
        B,
        metric,
        first_scale=a_scale,
        second_scale=b_scale,
        column="row",
        in_points=True,
    )
    differences = np.asarray(paired.differences)[:seeds]
    n = len(differences)
    if n < 2:
        return (float(differences.mean()) if n else math.nan), math.nan, math.nan, n
    mean = float(differences.mean())
    width = float(t_half_width(float(differences.std(ddof=1)), n, confidence=confidence))
    return mean, mean - width, mean + width, n


# ----------------------------------------------------------------------------------------------
# The rule: one reading of the interval per claimed relation, in a stated order of precedence
# ----------------------------------------------------------------------------------------------
def read_interval(
    low: float | np.ndarray, high: float | np.ndarray, *, claimed: str = ">", margin: float = MARGIN
) -> np.ndarray:
    """The verdict text of the interval(s) [``low``, ``high``] of Δ for a claim "A ``claimed`` B" (vectorised).

    Precedence (the first that applies), m = ``margin``:

    * "A > B": interval above 0 and inside (0, +m) → *held, smaller than the margin*; above 0 otherwise →
      *held*; inside (−m, 0) → *reversed, smaller than the margin*; below 0 otherwise → *reversed*; across 0
      and inside (−m, +m) → *equivalent (no effect)*; otherwise *undecided*. Direction comes first: an
      interval above 0 establishes A > B, and the margin only qualifies its size.
    * "A ≈ B": inside (−m, +m) → *equivalent*, whether or not the interval holds 0 (the claim is of no
      difference that matters, and m says what matters); above +m → *not equivalent (A > B)*; below −m →
      *not equivalent (A < B)*; otherwise *undecided* (an interval reaching past ±m but not clear of it leaves
      both readings possible).

    A NaN bound (fewer than 2 seeds) reads *no verdict*. All inequalities are strict.
    """
    relation = claimed_relation(claimed)
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    above_zero, below_zero = low > 0, high < 0
    inside = (low > -margin) & (high < margin)
    if relation == ">":
        conditions = [above_zero & inside, above_zero, below_zero & inside, below_zero, inside]
    else:
        conditions = [inside, low > margin, high < -margin]
    text = np.select(conditions, list(RULE[relation]), default=UNDECIDED)
    return np.where(np.isnan(low) | np.isnan(high), NO_VERDICT, text)


def decision_p_values(
    mean: float | np.ndarray, sd: float | np.ndarray, seeds: int | np.ndarray, *, margin: float = MARGIN
) -> dict[str, np.ndarray]:
    """The p-value of each decision the rule can reach, from Δ = ``mean``, sd(d) and n = ``seeds`` (vectorised).

    Each is the smallest α at which the two-sided (1 − α) t-interval reaches the decision, so that a decision
    of :func:`read_interval` at ``confidence`` c holds exactly when its p-value is below 1 − c:

    * ``"zero"`` (held, reversed): Student's two-sided one-sample t-test of Δ = 0 (``scipy.stats.ttest_1samp``);
    * ``"inside"`` (equivalent): the two one-sided tests of Schuirmann (1987, *J. Pharmacokin. Biopharm.*
      15:657–680) of Δ ≤ −m and Δ ≥ +m, p = 2 · max of the two one-sided p-values — doubled because the rule
      reads a two-sided (1 − α) interval, which is TOST at α/2 per side;
    * ``"above"`` / ``"below"`` (not equivalent): 2 × the one-sided p-value of Δ ≤ +m / Δ ≥ −m.

    All capped at 1. A zero spread gives 0 where the point interval clears the bound and 1 where it does not.
    """
    mean = np.asarray(mean, dtype=float)
    seeds = np.asarray(seeds, dtype=float)
    standard_error = np.asarray(sd, dtype=float) / np.sqrt(seeds)
    df = seeds - 1

    def above(bound: float) -> np.ndarray:  # one-sided p of Δ ≤ bound, in favour of Δ > bound
        with np.errstate(divide="ignore", invalid="ignore"):
            statistic = (mean - bound) / standard_error
        return np.where(np.isnan(statistic) & (standard_error == 0), 1.0, stats.t.sf(statistic, df))

    def below(bound: float) -> np.ndarray:  # one-sided p of Δ ≥ bound, in favour of Δ < bound
        with np.errstate(divide="ignore", invalid="ignore"):
            statistic = (mean - bound) / standard_error
        return np.where(np.isnan(statistic) & (standard_error == 0), 1.0, stats.t.cdf(statistic, df))

    return {
        "zero": np.minimum(1.0, 2 * np.minimum(above(0.0), below(0.0))),
        "inside": np.minimum(1.0, 2 * np.maximum(above(-margin), below(margin))),
        "above": np.minimum(1.0, 2 * above(margin)),
        "below": np.minimum(1.0, 2 * below(-margin)),
    }


def decision_p_value(texts: np.ndarray, p_values: Mapping[str, np.ndarray], *, claimed: str = ">") -> np.ndarray:
    """Per claim, the p-value of the decision its verdict text names (:data:`DECISION_TEST`); for an undecided
    one the smallest p-value of the decisions open to its claimed relation (never below the level that would
    have decided it); NaN for no verdict."""
    relation = claimed_relation(claimed)
    texts = np.asarray(texts)
    open_tests = sorted({DECISION_TEST[text] for text in RULE[relation]})
    nearest = np.min(np.stack([np.broadcast_to(p_values[test], texts.shape) for test in open_tests]), axis=0)
    conditions = [texts == text for text in DECISION_TEST] + [texts == NO_VERDICT]
    choices = [np.broadcast_to(p_values[test], texts.shape) for test in DECISION_TEST.values()] + [math.nan]
    return np.select(conditions, choices, default=nearest)


def seeds_to_decide(
    mean: float, sd: float, *, claimed: str = ">", margin: float = MARGIN, confidence: float = CONFIDENCE
) -> int | None:
    """The smallest number of paired seeds n ≥ 2 at which, if the mean ``mean`` and the standard deviation
    ``sd`` of the differences stayed as observed, the t-interval would decide the claim:

        "A > B":  n* = min{ n : h(n) < |Δ| }  ∪  { n : |Δ| + h(n) < m }   (clear of 0; inside ±m)
        "A ≈ B":  n* = min{ n : |Δ| + h(n) < m }  ∪  { n : h(n) < |Δ| − m }   (inside ±m; clear of ±m)

    with h(n) = t_{(1+c)/2, n−1} · sd / √n. None when neither happens up to :data:`MAX_SEEDS` seeds.
    """
    n = np.arange(2, MAX_SEEDS + 1)
    width = t_half_width(sd, n, confidence=confidence)
    inside = abs(mean) + width < margin
    clear = width < (abs(mean) if claimed_relation(claimed) == ">" else abs(mean) - margin)
    decided = inside | clear
    return int(n[np.argmax(decided)]) if decided.any() else None


def level_text(confidence: float) -> str:
    """A confidence level in percent as a verdict writes it: 0.95 → ``"95"``, 0.9821 → ``"98.21"``."""
    return f"{100 * confidence:.2f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge` says about a claim "A > B" or "A ≈ B" from its paired differences."""

    outcome: str  # one of OUTCOMES: held / reversed / not held / undecided / no verdict
    mean: float  # Δ = mean of d_s
    low: float  # the t-interval of Δ (NaN below 2 seeds)
    high: float
    seeds: int
    margin: float
    claimed: str = ">"
    reading: str = UNDECIDED  # read_interval()'s text: a key of RULE[claimed], undecided or no verdict
    p_value: float = math.nan  # of the decision (decision_p_value): below 1 − confidence exactly when decided
    confidence: float = CONFIDENCE
    seeds_to_decide: int | None = None  # undecided only: see seeds_to_decide()
    censored: str = ""  # undecided by censor(): which runs the epoch cap cut short

    @property
    def inside_margin(self) -> bool:
        """The whole interval lies inside (−m, +m): for a held or reversed "A > B", a difference smaller
        than the margin; for "A ≈ B", the equivalence itself."""
        return bool(-self.margin < self.low and self.high < self.margin)

    @property
    def text(self) -> str:
        """The verdict as the tables print it (its outcome: :func:`outcome_of`)."""
        if self.outcome == NO_VERDICT:
            return f"no verdict ({self.seeds} seed{'s' if self.seeds != 1 else ''})"
        if self.censored:
            return f"{UNDECIDED} ({CENSORED_READING}: {self.censored}; a longer cap would decide)"
        if self.outcome == UNDECIDED:
            needed = f"≈ {self.seeds_to_decide}" if self.seeds_to_decide else f"more than {MAX_SEEDS}"
            return f"undecided ({needed} seeds would decide)"
        return self.reading

    def columns(self) -> dict[str, Any]:
        """The verdict's columns in the results tables (Δ and its interval rounded to 0.01 point)."""
        return {
            "Δ": round(self.mean, 2),
            "CI low": round(self.low, 2),
            "CI high": round(self.high, 2),
            "seeds": self.seeds,
            "verdict": self.text,
            "outcome": self.outcome,
            "inside margin": self.inside_margin,
            "p": self.p_value,
        }

    def interval_text(self, unit: str = "R@1 points") -> str:
        """``+1.20 R@1 points, 95 % CI [+0.31, +2.09], 5 paired seeds`` (no interval below 2 seeds)."""
        text = f"{self.mean:+.2f} {unit}"
        if self.seeds >= 2:
            text += f", {level_text(self.confidence)} % CI [{self.low:+.2f}, {self.high:+.2f}]"
        return text + f", {self.seeds} paired seed{'s' if self.seeds != 1 else ''}"


def judge(
    differences: Sequence[float],
    *,
    claimed: str = ">",
    margin: float = MARGIN,
    confidence: float = CONFIDENCE,
) -> Verdict:
    """THE verdict rule of the study, used by every reading of every notebook.

    ``differences`` are the per-seed paired differences d_s = A_s − B_s of a claim "A ``claimed`` B" (``">"``
    or ``"≈"``; seed s: the same backbone initialisation and batch sequence for A and B). Δ = mean(d), and its
    two-sided t-interval Δ ± t_{(1+c)/2, n−1} · sd(d) / √n (``scipy.stats.t``, c = ``confidence``), read by
    :func:`read_interval` in its order of precedence; the outcome is the claim's (:data:`RULE`), the p-value
    that of the decision (:func:`decision_p_values`), and an undecided claim gets the seeds that would decide
    it (:func:`seeds_to_decide`). Fewer than 2 paired seeds: no verdict (there is no spread to judge by).
    """
    relation = claimed_relation(claimed)
    values = np.asarray(differences, dtype=float)
    n = len(values)
    mean = float(values.mean()) if n else math.nan
    if n < 2:
        return Verdict(NO_VERDICT, mean, math.nan, math.nan, n, margin, relation, NO_VERDICT, math.nan, confidence)
    sd = float(values.std(ddof=1))
    width = float(t_half_width(sd, n, confidence=confidence))
    low, high = mean - width, mean + width
    reading = str(read_interval(low, high, claimed=relation, margin=margin))
    p_value = float(
        decision_p_value(np.asarray(reading), decision_p_values(mean, sd, n, margin=margin), claimed=relation)
    )
    outcome = RULE[relation].get(reading, UNDECIDED)
    needed = (
        seeds_to_decide(mean, sd, claimed=relation, margin=margin, confidence=confidence)
        if outcome == UNDECIDED
        else None
    )
    return Verdict(outcome, mean, low, high, n, margin, relation, reading, p_value, confidence, needed)


def outcome_of(text: str) -> str:
    """The outcome a verdict text states: a decided text of :data:`RULE` (alone, or followed by a sequential
    look, ``"held at look 2 (10 seeds)"``), or a text opening with "undecided", "no verdict" or "not
    evaluated". Raises ``ValueError`` for any other text."""
    decided = {text: outcome for rule in RULE.values() for text, outcome in rule.items()}
    if text in decided:
        return decided[text]
    for known, outcome in decided.items():
        if text.startswith(f"{known} at look "):
            return outcome
    for opening in (UNDECIDED, NO_VERDICT, "not evaluated"):
        if text.startswith(opening):
            return opening
    raise ValueError(f"not a verdict text of the rule: {text!r}")


def verdict_agrees(text: str, outcome: str) -> bool:
    """Whether a table's verdict text and its outcome say the same (False for a text the rule never writes)."""
    try:
        return outcome_of(text) == outcome
    except ValueError:
        return False


def censor(verdict: Verdict, *, can_rise: str = "", can_fall: str = "") -> Verdict:
    """:func:`judge`'s verdict on right-censored values (:data:`CENSORED_METRICS` of runs that reached their
    epoch cap still improving: the true value is at least the recorded one). ``can_rise`` / ``can_fall`` name
    the censored runs that could make the true Δ higher (on a side Δ adds) / lower (on a side Δ subtracts);
    empty when there are none.

    A decision rests on the interval bounds it reads: one on the lower bound (held; not equivalent, A > B) is
    overturned when Δ can fall, one on the upper bound (reversed; not equivalent, A < B) when Δ can rise, one
    inside ±m (equivalent, either kind) when it can move at all. An overturned verdict becomes undecided with
    no seed count (more seeds of the same cap cannot decide it) and p-value 1; so does an undecided one whose Δ
    points the way the censoring could undo (Δ < 0 and can rise, Δ > 0 and can fall). A "smaller than the
    margin" held (reversed) whose Δ can rise (fall) keeps its outcome and loses the qualifier. A verdict the
    censoring can only strengthen stands: the rule never decides more than it would uncensored.
    """
    either = "; ".join(text for text in (can_rise, can_fall) if text)
    overturned = {
        "held, smaller than the margin": can_fall,
        "held": can_fall,
        "reversed, smaller than the margin": can_rise,
        "reversed": can_rise,
        "equivalent (no effect)": either,
        "equivalent": either,
        "not equivalent (A > B)": can_fall,
        "not equivalent (A < B)": can_rise,
        UNDECIDED: can_rise if verdict.mean < 0 else can_fall if verdict.mean > 0 else "",
    }.get(verdict.reading, "")
    if overturned:
        return replace(
            verdict, outcome=UNDECIDED, reading=UNDECIDED, p_value=1.0, seeds_to_decide=None, censored=overturned
        )
    qualifier_lost = {"held, smaller than the margin": can_rise, "reversed, smaller than the margin": can_fall}
    if qualifier_lost.get(verdict.reading):
        return replace(verdict, reading=verdict.outcome)
    return verdict


def effect_sentence(
    what: str, *, ours: Paired, paper: float | None, margin: float = MARGIN, unit: str = "R@1 points"
) -> str:
    """One sentence: our paired difference ``what`` (A − B) with its interval and :func:`judge`'s verdict on
    the paper's claim.

    A paper difference of at least :data:`NO_EFFECT` points claims "A > B" in its own direction (the sign of
    ``paper``); a smaller one claims no effect, "A ≈ B", read as "consistent" (equivalent) or "NOT consistent"
    (not equivalent), or undecided. A missing paper number (None or NaN) claims nothing: the verdict is that of
    "A > B" and the sentence says the paper has no number.
    """
    missing = paper is None or (isinstance(paper, float) and math.isnan(paper))
    measured = judge(ours.differences, margin=margin)  # A − B as measured, for the numbers
    text = f"{what}: ours {measured.interval_text(unit)}"
    if missing:
        return text + f" → {measured.text} (A > B); the paper reports no number for this."
    if abs(paper) < NO_EFFECT:
        verdict = judge(ours.differences, claimed="≈", margin=margin)
        reading = {
            "held": f"consistent (equivalent within ±{margin:g})",
            "not held": f"NOT consistent ({verdict.text})",
        }.get(verdict.outcome, verdict.text)
        return text + f"; the paper found no effect ({paper:+.2f}) → {reading}."
    sign = -1.0 if paper < 0 else 1.0
    verdict = judge([sign * d for d in ours.differences], margin=margin)
    return text + f"; paper {paper:+.2f} → {verdict.text}."


# ----------------------------------------------------------------------------------------------
# Multiplicity: Holm's step-down adjustment over a family of claims
# ----------------------------------------------------------------------------------------------
def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979, *Scand. J. Statist.* 6:65–70), in the input's order.

    With the m p-values sorted, p₍₁₎ ≤ … ≤ p₍ₘ₎: p̃₍ᵢ₎ = max_{j ≤ i} min(1, (m − j + 1) · p₍ⱼ₎). Rejecting every
    hypothesis with p̃ < α controls the family-wise error rate — the chance of one or more false decisions in
    the family — at α whatever the dependence between the claims (claims of one table share rows and seeds).
    Holm rather than Benjamini–Hochberg (``scipy.stats.false_discovery_control``): a verdict is a decision
    about one claim that a reader takes on its own, not a discovery among many whose false fraction may be
    traded off, and BH's guarantee needs positive dependence or the more conservative Benjamini–Yekutieli
    form. NaN p-values (claims without a verdict) count in the family as 1.
    """
    p = np.nan_to_num(np.asarray(p_values, dtype=float), nan=1.0)
    m = len(p)
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    adjusted = np.empty(m)
    adjusted[order] = stepped
    return adjusted


def holm_columns(
    table: pd.DataFrame,
    *,
    p: str = "p",
    family: Sequence[str] = ("regime",),
    alpha: float = ALPHA,
) -> pd.DataFrame:
    """``table`` with ``"Holm p"`` (:func:`holm` within each family: the rows sharing the ``family`` columns;
    one family when ``family`` is empty) and ``"survives Holm at 5 %"`` (for ``alpha`` = 0.05: Holm p < α,
    strict like the interval rule, so only a decided verdict can survive)."""

    def adjust(p_values: pd.Series) -> np.ndarray:
        return holm(p_values.to_numpy(dtype=float))

    adjusted = table.groupby(list(family), sort=False)[p].transform(adjust) if family else adjust(table[p])
    return table.assign(**{"Holm p": adjusted, f"survives Holm at {level_text(alpha)} %": adjusted < alpha})
