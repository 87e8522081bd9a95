"""A sequential design for a study's claims: every claim starts at its rows' first seeds; after each look only the
rows of undecided claims get more seeds, in batches, up to a declared cap, with the error rate spent across the
looks (:class:`SequentialDesign`, :func:`judge_sequential`, :func:`rows_needing_seeds`). Each look is read by the
one verdict rule of :mod:`dmlstudy.verdicts` at the look's level; the design is declared in ``docs/protocol.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from dmlstudy.verdicts import (
    ALPHA,
    MARGIN,
    NO_VERDICT,
    UNDECIDED,
    Verdict,
    decision_p_value,
    decision_p_values,
    judge,
    level_text,
    read_interval,
    t_half_width,
)


# ----------------------------------------------------------------------------------------------
# A sequential design: looks at declared seed counts, the error rate spent across them
# ----------------------------------------------------------------------------------------------
def _obrien_fleming(t: np.ndarray, alpha: float) -> np.ndarray:
    return 2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / np.sqrt(t))


def _pocock(t: np.ndarray, alpha: float) -> np.ndarray:
    return alpha * np.log1p((math.e - 1) * t)


def _linear(t: np.ndarray, alpha: float) -> np.ndarray:
    return alpha * t


SPENDING: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {  # α(t): the error spent by information t
    "pocock": _pocock,  # α·ln(1 + (e − 1)·t), Lan & DeMets (1983): much of α early
    "obrien-fleming": _obrien_fleming,  # 2 − 2Φ(z_{1−α/2} / √t), Lan & DeMets (1983): little α early
    "linear": _linear,  # α·t: with equal batches, Bonferroni's equal split α/K
}


@dataclass(frozen=True)
class SequentialDesign:
    """A group-sequential design declared before the runs: every claim is first judged at ``first_seeds``
    paired seeds; an undecided claim's rows get ``batch`` more seeds per look, up to ``cap``
    (:attr:`looks`). A claim's error rate α = ``alpha`` is spent across its looks by the Lan–DeMets
    error-spending function ``spending`` (Lan & DeMets 1983, *Biometrika* 70:659–663) of the information
    fraction t_k = n_k / cap: look k judges with the ordinary t-interval at level 1 − α_k, α_k = α(t_k) −
    α(t_{k−1}).

    The looks are combined by Bonferroni's inequality, not by the joint distribution of the looks' statistics
    that Lan and DeMets integrate: P(a false decision at any look) ≤ Σ α_k = α, exactly, for Student's t at the
    small seed counts of the study (where the normal-theory boundaries would be approximate) and whatever
    the dependence between looks. The price is a little conservatism: looks at nested seeds are strongly
    correlated, so the true error is below α. Pocock-type spending is the default: a seed is expensive, the
    looks are few, and with 4 degrees of freedom at the first look the t-quantiles of an O'Brien–Fleming-type
    α_1 (≈ 10⁻⁴) are so large that only the grossest effects could stop early.
    """

    first_seeds: int = 5
    batch: int = 5
    cap: int = 20
    alpha: float = ALPHA
    spending: str = "pocock"

    def __post_init__(self) -> None:
        if self.spending not in SPENDING:
            raise ValueError(f"unknown spending {self.spending!r}; valid: {sorted(SPENDING)}")
        if not (2 <= self.first_seeds <= self.cap and self.batch >= 1 and 0 < self.alpha < 1):
            raise ValueError(f"a design needs 2 ≤ first_seeds ≤ cap, batch ≥ 1 and 0 < alpha < 1: {self}")

    @property
    def looks(self) -> tuple[int, ...]:
        """The paired seeds at each look: first_seeds, + batch, …, the cap (the last batch may be smaller)."""
        counts = list(range(self.first_seeds, self.cap + 1, self.batch))
        return tuple(counts if counts[-1] == self.cap else [*counts, self.cap])

    @property
    def description(self) -> str:
        """``looks at 5, 10, 15, 20 paired seeds at 98.21, 98.69, 98.96, 99.14 % (Pocock-type spending of α = 5 %)``"""
        levels = ", ".join(level_text(self.level(look)) for look in range(1, len(self.looks) + 1))
        seeds = ", ".join(str(n) for n in self.looks)
        return (
            f"looks at {seeds} paired seeds at {levels} % ({self.spending.capitalize()}-type spending of "
            f"α = {level_text(self.alpha)} %)"
        )

    def spent(self, look: int) -> float:
        """α(t_k): the error spent by look ``look`` (1-based; 0 before the first)."""
        if look == 0:
            return 0.0
        return float(SPENDING[self.spending](np.asarray(self.looks[look - 1] / self.cap), self.alpha))

    def alpha_at(self, look: int) -> float:
        """α_k = α(t_k) − α(t_{k−1}): the error look ``look`` (1-based) may spend."""
        return self.spent(look) - self.spent(look - 1)

    def level(self, look: int) -> float:
        """The confidence of look ``look``'s t-interval (1-based): 1 − α_k."""
        return 1 - self.alpha_at(look)

    def looks_reached(self, seeds: int) -> int:
        """How many looks ``seeds`` paired seeds reach (0 below the first)."""
        return int(np.searchsorted(self.looks, seeds, side="right"))


def sequential_readings(
    differences: np.ndarray, design: SequentialDesign, *, claimed: str = ">", margin: float = MARGIN
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sequential rule on a matrix of paired differences, claims × seeds in seed order (vectorised).

    At each look k the seeds reach, every claim's first n_k differences are read by :func:`read_interval`
    at level :meth:`SequentialDesign.level`; a claim stops at its first decided look, and the later seeds of
    its rows (run for other claims) are not read for it. Returns, per claim: the verdict text, the look it
    stopped at (or the last look reached; 0 below the first) and its sequential p-value
    min_{j ≤ k} p_j · α / α_j over the looks read (p_j of the decision reached, :func:`decision_p_value`) —
    a valid p-value by the same union bound, below α exactly when the claim is decided, so it can enter
    :func:`holm`.
    """
    values = np.atleast_2d(np.asarray(differences, dtype=float))
    claims, seeds = values.shape
    reached = design.looks_reached(seeds)
    if reached == 0:
        return np.full(claims, NO_VERDICT), np.zeros(claims, dtype=int), np.full(claims, math.nan)
    texts, p_values = [], []
    for look in range(1, reached + 1):
        n = design.looks[look - 1]
        mean, sd = values[:, :n].mean(axis=1), values[:, :n].std(axis=1, ddof=1)
        width = t_half_width(sd, n, confidence=design.level(look))
        texts.append(read_interval(mean - width, mean + width, claimed=claimed, margin=margin))
        p_values.append(
            {
                test: p * design.alpha / design.alpha_at(look)
                for test, p in decision_p_values(mean, sd, n, margin=margin).items()
            }
        )
    decided = np.stack(texts, axis=1) != UNDECIDED  # claims × looks
    stop = np.where(decided.any(axis=1), np.argmax(decided, axis=1), reached - 1)  # 0-based look
    final = np.stack(texts, axis=1)[np.arange(claims), stop]
    per_look = np.stack(  # claims × looks: each look's p-value of the claim's final decision, spent-scaled
        [decision_p_value(final, p_values[look], claimed=claimed) for look in range(reached)], axis=1
    )
    read = np.arange(reached)[None, :] <= stop[:, None]
    return final, stop + 1, np.minimum(1.0, np.min(np.where(read, per_look, np.inf), axis=1))


@dataclass(frozen=True)
class SequentialVerdict:
    """What :func:`judge_sequential` says: the verdict at the look that decided the claim, or at the last look
    reached, and whether the claim still needs seeds."""

    verdict: Verdict  # judged on the look's seeds at the look's level
    look: int  # 1-based; 0: fewer paired seeds than the first look
    design: SequentialDesign
    p_value: float  # the sequential p-value (sequential_readings)

    @property
    def outcome(self) -> str:
        return self.verdict.outcome if self.look else NO_VERDICT

    @property
    def open(self) -> bool:
        """Undecided before the cap: the claim's rows need the seeds of the next look."""
        return self.outcome in (UNDECIDED, NO_VERDICT) and self.look < len(self.design.looks)

    @property
    def next_seeds(self) -> int | None:
        """The paired seeds the claim needs for its next look (None when it is decided or at the cap)."""
        return self.design.looks[self.look] if self.open else None

    @property
    def largest_effect(self) -> float:
        """The largest |Δ| the last interval still allows: max(|low|, |high|)."""
        return max(abs(self.verdict.low), abs(self.verdict.high))

    @property
    def text(self) -> str:
        """``held at look 2 (10 seeds)``; ``undecided at look 1 (5 seeds; next look at 10)``; at the cap,
        ``undecided at the cap (20 seeds): |Δ| < 2.1``; ``no verdict (3 seeds; first look at 5)``."""
        seeds = self.verdict.seeds
        if not self.look:
            return f"{NO_VERDICT} ({seeds} seed{'s' if seeds != 1 else ''}; first look at {self.design.first_seeds})"
        if self.outcome != UNDECIDED:
            return f"{self.verdict.reading} at look {self.look} ({seeds} seeds)"
        if self.open:
            return f"{UNDECIDED} at look {self.look} ({seeds} seeds; next look at {self.next_seeds})"
        return f"{UNDECIDED} at the cap ({seeds} seeds): |Δ| < {self.largest_effect:.1f}"


def judge_sequential(
    differences: Sequence[float], design: SequentialDesign, *, claimed: str = ">", margin: float = MARGIN
) -> SequentialVerdict:
    """The sequential rule (:func:`sequential_readings`) on one claim's paired differences in seed order: its
    :class:`SequentialVerdict`, with the verdict :func:`judge` gives on the stopping look's seeds at that
    look's level."""
    values = np.asarray(differences, dtype=float)
    _, looks, p_values = sequential_readings(values[None, :], design, claimed=claimed, margin=margin)
    look = int(looks[0])
    if not look:
        return SequentialVerdict(judge(values, claimed=claimed, margin=margin), 0, design, math.nan)
    n = design.looks[look - 1]
    verdict = judge(values[:n], claimed=claimed, margin=margin, confidence=design.level(look))
    return SequentialVerdict(verdict, look, design, float(p_values[0]))


def rows_needing_seeds(
    claims: Mapping[Hashable, tuple[str, str]],
    verdicts: Mapping[Hashable, SequentialVerdict],
    design: SequentialDesign,
) -> dict[str, int]:
    """Row → the paired seeds it needs for the next look, for the rows of every open claim.

    ``claims`` maps a claim's key to its rows (A, B); ``verdicts`` holds the claims judged so far (a claim
    without one needs the first look). A row read by several open claims needs the most any of them does;
    a row whose claims are all decided or at the cap needs none (and is left out).
    """
    needs: dict[str, int] = {}
    for key, rows in claims.items():
        verdict = verdicts.get(key)
        seeds = design.first_seeds if verdict is None else verdict.next_seeds
        if seeds is None:
            continue
        for row in rows:
            needs[row] = max(needs.get(row, 0), seeds)
    return needs
