"""The statistics of claims: the rule's precedence, its p-values, Holm's adjustment and the sequential design."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dmlstudy import verdicts
from dmlstudy.study import sequential
from dmlstudy.study.sequential import SequentialDesign, judge_sequential
from dmlstudy.verdicts import RULE, judge, read_interval

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("claimed", [">", "≈"])
def test_the_interval_is_scipys_t_interval(claimed):
    differences = np.random.default_rng(3).normal(0.7, 1.9, size=7)
    for confidence in (0.95, 0.99):
        verdict = judge(differences, claimed=claimed, confidence=confidence)
        low, high = stats.t.interval(
            confidence, len(differences) - 1, loc=differences.mean(), scale=stats.sem(differences)
        )
        assert (verdict.mean, verdict.low, verdict.high, verdict.seeds) == pytest.approx(
            (differences.mean(), low, high, 7)
        )


@pytest.mark.parametrize(
    "claimed, low, high, text, outcome",
    [
        (">", 0.10, 0.60, "held, smaller than the margin", "held"),  # above 0, inside (0, +m)
        (">", 0.50, 1.50, "held", "held"),  # above 0, reaching past +m: the size is not resolved
        (">", 1.20, 3.00, "held", "held"),  # clear of the margin
        (">", -0.60, -0.10, "reversed, smaller than the margin", "reversed"),
        (">", -3.00, -0.50, "reversed", "reversed"),
        (">", -0.50, 0.50, "equivalent (no effect)", "not held"),  # the claimed improvement is absent
        (">", -0.50, 1.50, "undecided", "undecided"),
        (">", -2.00, 2.00, "undecided", "undecided"),
        (">", math.nan, math.nan, "no verdict", "no verdict"),
        ("≈", 0.10, 0.67, "equivalent", "held"),  # the committed +0.38 [+0.10, +0.67]: equivalence comes first
        ("≈", -0.50, 0.50, "equivalent", "held"),
        ("≈", 1.20, 3.00, "not equivalent (A > B)", "not held"),
        ("≈", -3.00, -1.20, "not equivalent (A < B)", "not held"),
        ("≈", 0.50, 1.50, "undecided", "undecided"),  # above 0 but not clear of +m: the claim may still hold
        ("≈", -2.00, 2.00, "undecided", "undecided"),
        ("A ≈ B", -1.00, 0.50, "undecided", "undecided"),  # strict: an interval touching −m is not inside
    ],
)
def test_every_interval_position_has_one_reading(claimed, low, high, text, outcome):
    assert str(read_interval(low, high, claimed=claimed, margin=1.0)) == text
    assert verdicts.outcome_of(text) == outcome


def test_judge_reads_the_interval_of_the_differences_in_precedence_order():
    cases = {  # differences → (claimed, text): intervals from the data, checked against the by-hand table above
        (2.0, 2.5, 3.0): (">", "held"),
        (-2.0, -2.5, -3.0): (">", "reversed"),
        (0.3, 0.35, 0.4, 0.45, 0.5): (">", "held, smaller than the margin"),
        (0.1, -0.1, 0.05, -0.05, 0.0): (">", "equivalent (no effect)"),
        (3.0, -2.0, 0.5): (">", "undecided"),
        (0.3, 0.35, 0.4, 0.45, 0.5, 0.0): ("≈", "equivalent"),
        (4.0, 5.0, 6.0, 5.5): ("≈", "not equivalent (A > B)"),
    }
    for differences, (claimed, text) in cases.items():
        verdict = judge(differences, claimed=claimed, margin=1.0)
        low, high = stats.t.interval(0.95, len(differences) - 1, loc=np.mean(differences), scale=stats.sem(differences))
        assert str(read_interval(low, high, claimed=claimed)) == text
        assert verdict.reading == text and verdict.outcome == verdicts.outcome_of(text)


def test_no_verdict_below_two_seeds():
    one = judge([5.0])
    assert (one.outcome, one.text, one.seeds, one.seeds_to_decide) == ("no verdict", "no verdict (1 seed)", 1, None)
    assert math.isnan(one.low) and math.isnan(one.p_value)
    assert judge([], claimed="≈").text == "no verdict (0 seeds)"


def test_every_text_the_rule_writes_agrees_with_its_outcome():
    rng = np.random.default_rng(11)
    seen = set()
    for claimed in (">", "≈"):
        for n in (1, 3, 5, 10):
            for _ in range(40):
                differences = rng.normal(rng.uniform(-3, 3), rng.uniform(0.05, 3), size=n)
                verdict = judge(differences, claimed=claimed)
                assert verdicts.verdict_agrees(verdict.text, verdict.outcome), verdict
                censored = verdicts.censor(verdict, can_rise="1 of 5 b runs")
                assert verdicts.verdict_agrees(censored.text, censored.outcome), censored
                seen.add(verdict.reading)
    assert seen == {*RULE[">"], *RULE["≈"], "undecided", "no verdict"}  # every reading was reached
    # the contradictions of the tables the former rule wrote: a "≈" claim's text beside a direction's outcome
    assert not verdicts.verdict_agrees("not equivalent (A > B)", "held")
    assert not verdicts.verdict_agrees("equivalent (the claim holds)", "equivalent")
    assert verdicts.verdict_agrees("held, smaller than the margin at look 2 (10 seeds)", "held")
    assert verdicts.verdict_agrees("not evaluated (no crt runs)", "not evaluated")


def test_decision_p_values_are_scipys_tests_and_dual_to_the_interval():
    rng = np.random.default_rng(5)
    margin = 1.0
    for _ in range(25):
        n = int(rng.integers(3, 12))
        differences = rng.normal(rng.uniform(-2, 2), rng.uniform(0.2, 2), size=n)
        mean, sd = differences.mean(), differences.std(ddof=1)
        p = {test: float(value) for test, value in verdicts.decision_p_values(mean, sd, n, margin=margin).items()}
        assert p["zero"] == pytest.approx(stats.ttest_1samp(differences, 0.0).pvalue)
        tost = max(
            stats.ttest_1samp(differences, -margin, alternative="greater").pvalue,
            stats.ttest_1samp(differences, margin, alternative="less").pvalue,
        )
        assert p["inside"] == pytest.approx(min(1.0, 2 * tost))
        assert p["above"] == pytest.approx(
            min(1.0, 2 * stats.ttest_1samp(differences, margin, alternative="greater").pvalue)
        )
        assert p["below"] == pytest.approx(
            min(1.0, 2 * stats.ttest_1samp(differences, -margin, alternative="less").pvalue)
        )
        for claimed in (">", "≈"):
            for confidence in (0.9, 0.95, 0.99):
                verdict = judge(differences, claimed=claimed, margin=margin, confidence=confidence)
                assert (verdict.outcome != "undecided") == (verdict.p_value < 1 - confidence), verdict


def test_seeds_to_decide_an_equivalence_claim_against_an_independent_search():
    def first_deciding(decides, mean, sd):
        return next(
            n for n in range(2, 2000) if decides(*stats.t.interval(0.95, n - 1, loc=mean, scale=sd / math.sqrt(n)))
        )

    for mean, sd in ((0.3, 1.5), (1.6, 1.2), (-2.5, 3.0)):
        expected = first_deciding(lambda low, high: -1 < low < high < 1 or low > 1 or high < -1, mean, sd)
        assert verdicts.seeds_to_decide(mean, sd, claimed="≈", margin=1.0) == expected
        expected = first_deciding(lambda low, high: low > 0 or high < 0 or -1 < low < high < 1, mean, sd)
        assert verdicts.seeds_to_decide(mean, sd, claimed=">", margin=1.0) == expected
    assert verdicts.seeds_to_decide(1.0, 1.0, claimed="≈", margin=1.0) is None  # an effect exactly at the margin


@pytest.mark.parametrize(
    "differences, claimed, can_rise, can_fall, reading",
    [
        ([2.0, 2.5, 3.0], ">", "", "5 of 5 a runs", "undecided"),  # held rests on the lower bound
        ([2.0, 2.5, 3.0], ">", "5 of 5 a runs", "", "held"),  # can only strengthen it
        ([0.3, 0.35, 0.4, 0.45, 0.5], ">", "1 of 5 a runs", "", "held"),  # keeps held, loses "smaller than"
        ([-2.0, -2.5, -3.0], ">", "1 of 3 a runs", "", "undecided"),
        ([0.1, -0.1, 0.05, -0.05, 0.0], ">", "", "1 of 5 b runs", "undecided"),  # inside ±m rests on both
        ([0.1, -0.1, 0.05, -0.05, 0.0], "≈", "1 of 5 a runs", "", "undecided"),
        ([4.0, 5.0, 6.0, 5.5], "≈", "1 of 4 a runs", "", "not equivalent (A > B)"),
        ([4.0, 5.0, 6.0, 5.5], "≈", "", "1 of 4 b runs", "undecided"),
    ],
)
def test_censoring_overturns_only_what_it_could_move(differences, claimed, can_rise, can_fall, reading):
    censored = verdicts.censor(judge(differences, claimed=claimed), can_rise=can_rise, can_fall=can_fall)
    assert censored.reading == reading
    if reading == "undecided":
        assert censored.censored and censored.seeds_to_decide is None and censored.p_value == 1.0
        assert censored.text.startswith("undecided (censored by the epoch cap")


def test_paired_interval_recomputes_a_claim_from_the_per_seed_table():
    per_seed = pd.DataFrame(
        [
            ("scratch", "glyphs", "crt", 0, 20.0),
            ("scratch", "glyphs", "crt", 1, 25.0),
            ("scratch", "glyphs", "crt", 2, 22.0),
            ("scratch", "glyphs", "crt", 3, 30.0),  # no ms run of seed 3: does not pair
            ("scratch", "glyphs", "ms", 0, 18.0),
            ("scratch", "glyphs", "ms", 1, 21.0),
            ("scratch", "glyphs", "ms", 2, 22.0),
            ("pretrained", "glyphs", "ms", 1, 90.0),  # another regime: not read
            ("scratch", "synbirds", "ms", 1, 90.0),  # another dataset: not read
        ],
        columns=["regime", "dataset", "row", "seed", "R@1"],  # in points, as the claims read them
    )
    delta, low, high, n = verdicts.paired_interval(
        per_seed, A="crt", B="ms", metric="R@1", dataset="glyphs", regime="scratch"
    )
    differences = np.array([2.0, 4.0, 0.0])  # in points
    expected = stats.t.interval(0.95, 2, loc=differences.mean(), scale=stats.sem(differences))
    assert (delta, low, high, n) == pytest.approx((2.0, *expected, 3))
    first_two = verdicts.paired_interval(
        per_seed, A="crt", B="ms", metric="R@1", dataset="glyphs", regime="scratch", seeds=2
    )
    assert first_two[0] == pytest.approx(3.0) and first_two[3] == 2
    with pytest.raises(KeyError):
        verdicts.paired_interval(per_seed, A="crt", B="dgcrl", metric="R@1", dataset="glyphs", regime="scratch")


def test_holm_on_a_hand_worked_family():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 → running max 0.02, 0.03, 0.06, 0.06
    adjusted = verdicts.holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert verdicts.holm([0.5, math.nan]) == pytest.approx([1.0, 1.0])  # a claim without a p counts, as 1


def test_holm_rejects_what_the_step_down_procedure_rejects():
    rng = np.random.default_rng(2)
    for _ in range(200):
        m = int(rng.integers(1, 30))
        p = rng.uniform(0, 0.1, size=m) ** rng.uniform(0.5, 3)
        rejected = set()  # Holm (1979) as stated: step through the sorted p while p_(i) < α / (m − i + 1)
        for i, index in enumerate(np.argsort(p, kind="stable")):
            if p[index] >= 0.05 / (m - i):
                break
            rejected.add(int(index))
        assert set(np.flatnonzero(verdicts.holm(p) < 0.05)) == rejected


def test_holm_columns_adjust_within_each_family():
    table = pd.DataFrame(
        {"regime": ["scratch"] * 4 + ["pretrained"] * 2, "p": [0.01, 0.04, 0.03, 0.005, 0.03, math.nan]}
    )
    adjusted = verdicts.holm_columns(table)
    assert adjusted["Holm p"].tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02, 0.06, 1.0])
    assert adjusted["survives Holm at 5 %"].tolist() == [True, False, False, True, False, False]
    assert verdicts.holm_columns(table, family=())["Holm p"].iloc[3] == pytest.approx(0.03)  # one family of 6


def test_the_declared_design_spends_alpha_across_its_looks():
    design = SequentialDesign(first_seeds=5, batch=5, cap=20, alpha=0.05, spending="pocock")
    assert design.looks == (5, 10, 15, 20)
    assert SequentialDesign(first_seeds=5, batch=4, cap=15).looks == (5, 9, 13, 15)
    spent = [design.alpha_at(look) for look in range(1, 5)]
    assert sum(spent) == pytest.approx(0.05) and all(a > 0 for a in spent)
    assert spent[0] == pytest.approx(0.05 * math.log(1 + (math.e - 1) * 0.25))  # Lan–DeMets Pocock type
    obrien = SequentialDesign(spending="obrien-fleming")
    assert obrien.spent(2) == pytest.approx(2 * stats.norm.sf(stats.norm.ppf(0.975) / math.sqrt(0.5)))
    assert SequentialDesign(spending="linear").alpha_at(3) == pytest.approx(0.0125)  # Bonferroni's α / 4
    assert design.level(1) == pytest.approx(1 - spent[0])
    assert [design.looks_reached(n) for n in (3, 5, 9, 10, 25)] == [0, 1, 1, 2, 4]
    with pytest.raises(ValueError, match="spending"):
        SequentialDesign(spending="haybittle")


def test_judge_sequential_stops_at_the_first_deciding_look():
    design = SequentialDesign()
    clear = np.r_[np.full(5, 8.0) + np.linspace(-1, 1, 5), np.full(15, -50.0)]  # decided at 5; later seeds unread
    stopped = judge_sequential(clear, design)
    assert (stopped.look, stopped.outcome, stopped.open, stopped.next_seeds) == (1, "held", False, None)
    assert stopped.text == "held at look 1 (5 seeds)" and stopped.verdict.seeds == 5
    assert stopped.verdict.confidence == pytest.approx(design.level(1))
    assert stopped.p_value < design.alpha
    assert stopped.p_value == pytest.approx(stats.ttest_1samp(clear[:5], 0).pvalue * design.alpha / design.alpha_at(1))

    noisy = np.random.default_rng(1).normal(0.0, 6.0, size=20)
    at_cap = judge_sequential(noisy, design)
    assert (at_cap.look, at_cap.outcome, at_cap.open) == (4, "undecided", False)
    bound = max(abs(at_cap.verdict.low), abs(at_cap.verdict.high))
    assert at_cap.text == f"undecided at the cap (20 seeds): |Δ| < {bound:.1f}" and at_cap.p_value >= design.alpha
    waiting = judge_sequential(noisy[:12], design)
    assert (waiting.look, waiting.open, waiting.next_seeds) == (2, True, 15)
    assert waiting.text == "undecided at look 2 (10 seeds; next look at 15)"
    early = judge_sequential(noisy[:3], design)
    assert (early.look, early.outcome, early.next_seeds, early.text) == (
        0,
        "no verdict",
        5,
        "no verdict (3 seeds; first look at 5)",
    )
    for result in (stopped, at_cap, waiting, early):
        assert verdicts.verdict_agrees(result.text, result.outcome)


def test_judge_sequential_is_the_vectorised_rule_claim_by_claim():
    design = SequentialDesign(first_seeds=3, batch=3, cap=12, spending="obrien-fleming")
    differences = np.random.default_rng(4).normal(0.8, 1.5, size=(16, 12))
    for claimed in (">", "≈"):
        texts, looks, p_values = sequential.sequential_readings(differences, design, claimed=claimed)
        for row, text, look, p in zip(differences, texts, looks, p_values):
            one = judge_sequential(row, design, claimed=claimed)
            assert (one.verdict.reading, one.look) == (text, look)
            assert one.p_value == pytest.approx(p)


def test_rows_needing_seeds_follow_the_open_claims():
    design = SequentialDesign()
    rng = np.random.default_rng(0)
    decided = judge_sequential(np.full(5, 9.0) + rng.normal(0, 0.1, 5), design)
    open_at_5 = judge_sequential(rng.normal(0, 6, 5), design)
    open_at_10 = judge_sequential(rng.normal(0, 6, 10), design)
    claims = {"crt > ms": ("crt", "ms"), "diml > ms": ("diml", "ms"), "dgcrl > triplet": ("dgcrl", "triplet")}
    needs = sequential.rows_needing_seeds(
        {**claims, "new": ("lifted", "ms")},
        {"crt > ms": decided, "diml > ms": open_at_5, "dgcrl > triplet": open_at_10},
        design,
    )
    # crt: only a decided claim reads it; ms: shared by an open claim at 5 seeds and a new one
    assert needs == {"diml": 10, "ms": 10, "dgcrl": 15, "triplet": 15, "lifted": 5}


# ----------------------------------------------------------------------------------------------
# Simulation: the error rates the design promises, on synthetic paired differences
# ----------------------------------------------------------------------------------------------
CLAIMS, DESIGN = 4000, SequentialDesign()  # 5, 10, 15, 20 seeds; α = 0.05 spent Pocock-type


def repeated_fixed_level_rule(differences, claimed, margin, confidence=0.95):
    """The plain rule applied at every look of DESIGN at its own 95 %, stopping at the first decision."""
    final = np.full(len(differences), "undecided", dtype=object)
    for n in DESIGN.looks:
        sample = differences[:, :n]
        low, high = stats.t.interval(confidence, n - 1, loc=sample.mean(axis=1), scale=stats.sem(sample, axis=1))
        reading = read_interval(low, high, claimed=claimed, margin=margin)
        final = np.where(final == "undecided", reading, final)
    return final


def rate(texts, decisions):
    return float(np.isin(texts, decisions).mean())


def test_simulated_null_claims_keep_the_false_decision_rate_under_alpha():
    differences = np.random.default_rng(20261127).normal(0.0, 4.0, size=(CLAIMS, DESIGN.cap))  # true Δ = 0
    direction = [text for text in RULE[">"] if RULE[">"][text] in ("held", "reversed")]
    texts, _, p_values = sequential.sequential_readings(differences, DESIGN, claimed=">", margin=1.0)
    tolerance = 3 * math.sqrt(0.05 * 0.95 / CLAIMS)  # three Monte Carlo standard errors at the declared level
    assert rate(texts, direction) <= DESIGN.alpha + tolerance
    assert np.array_equal(texts != "undecided", p_values < DESIGN.alpha)  # decided ⇔ sequential p < α
    naive = repeated_fixed_level_rule(differences, ">", 1.0)
    assert rate(naive, direction) > DESIGN.alpha + 3 * tolerance  # looking four times at 95 % each


def test_simulated_claims_at_the_margin_rarely_read_equivalent():
    differences = np.random.default_rng(1127).normal(1.0, 1.0, size=(CLAIMS, DESIGN.cap))  # true Δ = m: not ≈
    texts, _, _ = sequential.sequential_readings(differences, DESIGN, claimed="≈", margin=1.0)
    tolerance = 3 * math.sqrt(0.025 * 0.975 / CLAIMS)
    assert rate(texts, ["equivalent"]) <= DESIGN.alpha / 2 + tolerance  # TOST at α/2 per side
    naive = repeated_fixed_level_rule(differences, "≈", 1.0)
    assert rate(naive, ["equivalent"]) > DESIGN.alpha / 2 + 3 * tolerance


# ----------------------------------------------------------------------------------------------
# The committed tables under the amended rule
# ----------------------------------------------------------------------------------------------
COMMITTED = sorted(ROOT.glob("results/**/claims.csv"))


def amended_outcome(claimed, outcome, low, high, margin):
    """The outcome the amendment gives a committed row, from the row's former outcome and its interval alone."""
    if claimed == "≈" and outcome in ("held", "reversed", "equivalent"):  # equivalence is now judged first
        if -margin < low and high < margin:
            return "held"
        return "not held" if low > margin or high < -margin else "undecided"
    return {"equivalent": "not held"}.get(outcome, outcome)  # ">": an interval across 0 inside ±m, no effect


@pytest.mark.parametrize("path", COMMITTED, ids=lambda path: str(path.relative_to(ROOT)))
def test_the_amendment_changes_only_what_it_declares_in_the_committed_tables(path):
    table = pd.read_csv(path)
    judged = table[(table["seeds"] >= 2) & ~table["verdict"].str.contains("censored")]
    assert len(judged)
    for _, row in judged.iterrows():
        claimed = verdicts.claimed_relation(row["claimed"])
        low, high = row["CI low"], row["CI high"]
        text = str(read_interval(low, high, claimed=claimed, margin=row["margin"]))
        expected = amended_outcome(claimed, row["outcome"], low, high, row["margin"])
        assert verdicts.outcome_of(text) == expected, (row["claim"], row["dataset"], row["regime"])


def test_a_design_describes_its_looks_and_their_levels():
    """Pocock-type spending α·ln(1 + (e − 1)·t) at t = n_k / cap, each look at 1 − (α(t_k) − α(t_{k−1}))."""
    design = sequential.SequentialDesign(first_seeds=5, batch=5, cap=20)
    spent = [0.05 * math.log(1 + (math.e - 1) * n / 20) for n in (0, 5, 10, 15, 20)]
    levels = [f"{100 * (1 - (b - a)):.2f}" for a, b in zip(spent, spent[1:])]
    assert design.description == (
        f"looks at 5, 10, 15, 20 paired seeds at {', '.join(levels)} % (Pocock-type spending of α = 5 %)"
    )
    assert levels[0] == "98.21"
