"""The study kit: one verdict rule behind every reading, variant grids, the papers' numbers from one file."""

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from dmlstudy import verdicts
from dmlstudy.findings import numbers as papers

ROOT = Path(__file__).resolve().parents[1]


def test_the_paired_interval_is_scipys_t_interval():
    differences = np.random.default_rng(3).normal(0.7, 1.9, size=7)
    verdict = verdicts.judge(differences)
    low, high = stats.t.interval(0.95, len(differences) - 1, loc=differences.mean(), scale=stats.sem(differences))
    assert (verdict.mean, verdict.low, verdict.high) == pytest.approx((differences.mean(), low, high))
    assert verdict.seeds == 7


@pytest.mark.parametrize(
    "differences, outcome",
    [
        ([2.0, 2.5, 3.0], "held"),  # interval well above 0
        ([-2.0, -2.5, -3.0], "reversed"),
        ([0.1, -0.1, 0.05, -0.05, 0.0], "not held"),  # interval across 0 inside ±1: no effect
        ([3.0, -2.0, 0.5], "undecided"),  # wide interval across 0 and past the margin
        ([0.3, 0.35, 0.4, 0.45, 0.5], "held"),  # inside the margin but above 0: held is declared first
    ],
)
def test_the_verdicts(differences, outcome):
    assert verdicts.judge(differences, margin=1.0).outcome == outcome


def test_no_verdict_from_one_seed():
    one = verdicts.judge([5.0])
    assert (one.outcome, one.text, one.seeds, one.seeds_to_decide) == ("no verdict", "no verdict (1 seed)", 1, None)
    assert math.isnan(one.low) and math.isnan(one.high)
    assert verdicts.judge([]).text == "no verdict (0 seeds)"


def test_seeds_to_decide_on_a_crafted_case():
    differences = [-1.2, 0.3, 1.8]  # mean 0.3, sd 1.5: undecided at n = 3
    verdict = verdicts.judge(differences, margin=1.0)
    assert verdict.outcome == "undecided"

    def first_deciding(decides):  # independently, with scipy's t-interval around the same mean and sd
        return next(
            n for n in range(2, 1000) if decides(*stats.t.interval(0.95, n - 1, loc=0.3, scale=1.5 / math.sqrt(n)))
        )

    excluding_zero = first_deciding(lambda low, high: low > 0 or high < 0)
    inside_margin = first_deciding(lambda low, high: -1 < low and high < 1)
    # by hand: t(20)·1.5/√21 ≈ 0.683 < 1 − 0.3 (equivalence at 21); excluding 0 needs t·1.5/√n < 0.3: n = 99
    assert (excluding_zero, inside_margin) == (99, 21)
    assert verdict.seeds_to_decide == 21  # the smaller
    assert verdict.text == "undecided (≈ 21 seeds would decide)"
    assert verdicts.seeds_to_decide(0.0, 3.0, margin=1.0) > verdicts.seeds_to_decide(0.0, 1.0, margin=1.0)


def frame_of(values):
    return pd.DataFrame(
        [
            {"dataset": "d", "variant": variant, "seed": seed, "R@1": value}
            for variant, runs in values.items()
            for seed, value in runs.items()
        ]
    )


def test_paired_differences_pair_only_the_seeds_both_sides_ran():
    frame = frame_of({"a": {0: 0.50, 1: 0.52, 2: 0.54, 4: 0.9}, "b": {0: 0.40, 2: 0.41, 3: 0.1, 4: math.nan}})
    paired = verdicts.paired_differences(frame, "d", "a", "b")
    assert paired.seeds == (0, 2)  # seed 4 of b has no value, seeds 1 and 3 run on one side only
    assert paired.differences == pytest.approx((10.0, 13.0))  # R@1 in points
    scaled = verdicts.paired_differences(frame, "d", "a", "b", first_scale=0.5)
    assert scaled.differences == pytest.approx((25.0 - 40.0, 27.0 - 41.0))
    with pytest.raises(KeyError, match="no runs of variant 'c'"):
        verdicts.paired_differences(frame, "d", "a", "c")


def test_effect_sentence_reads_the_papers_direction_through_the_rule():
    up = verdicts.Paired((0, 1, 2), (2.0, 2.5, 3.0))
    assert verdicts.effect_sentence("x", ours=up, paper=2.0).endswith("paper +2.00 → held.")
    assert verdicts.effect_sentence("x", ours=up, paper=-2.0).endswith("paper -2.00 → reversed.")
    assert "95 % CI [+1.26, +3.74], 3 paired seeds" in verdicts.effect_sentence("x", ours=up, paper=2.0)
    flat = verdicts.Paired((0, 1, 2, 3, 4), (0.1, -0.1, 0.05, -0.05, 0.0))
    assert "→ consistent (equivalent within ±1)" in verdicts.effect_sentence("x", ours=flat, paper=0.1)
    assert "→ NOT consistent" in verdicts.effect_sentence("x", ours=up, paper=-0.1)
    assert "no verdict (1 seed)" in verdicts.effect_sentence("x", ours=verdicts.Paired((0,), (1.0,)), paper=2.0)
    for missing in (None, math.nan):
        assert verdicts.effect_sentence("x", ours=up, paper=missing).endswith(
            "→ held (A > B); the paper reports no number for this."
        )


# ----------------------------------------------------------------------------------------------
# The papers' numbers: one file, read by the modules, the plans and docs/papers.md checked against it
# ----------------------------------------------------------------------------------------------
def test_papers_yaml_gives_every_table_a_source_and_typed_values():
    data = papers.load()
    assert papers.PAPER_DATASET == {"synbirds": "CUB", "glyphs": "Cars", "emoji": "CUB"}
    for paper in ("crt", "diml", "cross_attention", "dgcrl"):
        for name, table in data[paper]["tables"].items():
            assert table["source"], f"{paper}.{name} has no source"
    assert papers.numbers("crt", "DIMS")[(128, 1024)] == (75.95, 76.52)
    assert papers.numbers("diml", "TRUNCATION")[("ms", 100)]["CUB-200"] == (64.89, 34.12, 23.38)
    assert papers.numbers("cross_attention", "PARAMETERS")["ResNet-101, MS, no blocks"] == (45.3, 67.4, 83.7)
    with pytest.raises(KeyError, match="no table 'nope'"):
        papers.numbers("crt", "nope")


def test_the_modules_read_the_papers_numbers_from_the_file():
    from dmlstudy.experiments import ablations
    from dmlstudy.experiments.papers import dgcrl, diml

    declared = ablations.declaration("crt")
    assert (
        ablations.paper_values(declared, declared.table("main"), "synbirds")
        == papers.numbers("crt", "BASELINE_VS_CRT")["CUB"]
    )
    assert diml.PAPER["G"] == papers.numbers("diml", "GRID")
    assert ablations.paper_values(dgcrl.DECLARED, dgcrl.DECLARED.table("main"), "synbirds")["dgcrl"] == 67.9


def test_a_declared_row_can_train_on_the_backbone_a_notebook_parameter_names():
    from types import SimpleNamespace

    from dmlstudy.experiments import ablations
    from dmlstudy.experiments.kit import backbone_overrides
    from dmlstudy.run.protocol import ProtocolConfig

    row = {"method": "ms", "backbone": "bigger", "final_evaluation": True}
    declared = ablations.Declaration("x", "ms", {"silent": ["output_stride"]}, {"t": {"rows": {"big": row}}})
    protocol = ProtocolConfig()
    for backbone in ("test_resnet", "test_vit", protocol.backbone):
        config = SimpleNamespace(protocol=protocol, bigger=backbone)
        overrides = backbone_overrides(backbone, protocol)
        name = "-".join(["ms", *(f"{k}={v}" for k, v in overrides.items() if k != "output_stride")])
        spec = {"method": "ms", **overrides, **ablations.FINAL_EVALUATION_ONLY}
        assert ablations.table_rows(declared, "t", config) == {"big": (name, spec)}
    assert overrides == {}  # the protocol's own backbone needs no override


@pytest.mark.parametrize("plan", sorted(p.stem for p in (ROOT / "plans" / "papers").glob("*.yaml")))
def test_paper_plans_and_readme_quote_the_file(plan):
    reported = papers.reported(plan)
    in_plan = yaml.safe_load((ROOT / "plans" / "papers" / f"{plan}.yaml").read_text())["reported"]["metrics"]
    assert in_plan == reported
    rows = [
        line
        for line in (ROOT / "docs" / "papers.md").read_text().splitlines()
        if f"`{plan}`" in line and line.startswith("|")
    ]
    assert rows, f"docs/papers.md: no row of the papers' numbers for {plan}"
    shown = {float(x) for x in re.findall(r"\d+\.\d+", rows[0])}
    assert {float(v) for v in reported.values()} <= shown, f"docs/papers.md row of {plan} differs from papers.yaml"


def test_every_yaml_of_the_package_ships_with_it():
    import fnmatch

    import tomllib

    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = sorted((ROOT / "dmlstudy").rglob("*.yaml"))
    assert {"claims.yaml", "papers.yaml", "crt.yaml"} <= {path.name for path in files}
    for path in files:
        package = ".".join(path.parent.relative_to(ROOT).parts)
        assert any(fnmatch.fnmatch(path.name, pattern) for pattern in shipped.get(package, [])), path


@pytest.mark.parametrize(
    "differences, can_rise, can_fall, outcome, censored",
    [
        ([-2.0, -2.5, -3.0], "5 of 5 triplet runs", "", "undecided", True),  # reversed, but A may be higher
        ([-2.0, -2.5, -3.0], "", "5 of 5 dgcrl runs", "reversed", False),  # censoring can only lower Δ further
        ([2.0, 2.5, 3.0], "", "1 of 3 dgcrl runs", "undecided", True),  # held, but B's true values may be higher
        ([2.0, 2.5, 3.0], "2 of 3 triplet runs", "", "held", False),
        ([0.1, -0.1, 0.05, -0.05, 0.0], "1 of 5 triplet runs", "", "undecided", True),  # equivalence moves
        ([3.0, -2.0, 0.5], "", "3 of 3 dgcrl runs", "undecided", True),  # Δ > 0 heads to held, which B could undo
        ([3.0, -2.0, 0.5], "3 of 3 triplet runs", "", "undecided", False),  # more seeds may still decide it
        ([2.0, 2.5, 3.0], "", "", "held", False),
    ],
)
def test_censoring_overturns_only_the_verdicts_it_could_reverse(differences, can_rise, can_fall, outcome, censored):
    judged = verdicts.judge(differences, margin=1.0)
    verdict = verdicts.censor(judged, can_rise=can_rise, can_fall=can_fall)
    assert verdict.outcome == outcome
    assert (verdict.mean, verdict.low, verdict.high, verdict.seeds) == (
        judged.mean,
        judged.low,
        judged.high,
        len(differences),
    )
    if not censored:
        assert verdict == judged
    else:
        assert verdict.seeds_to_decide is None
        assert verdict.text.startswith("undecided (censored by the epoch cap: ")
        assert (can_rise or can_fall) in verdict.text and "longer cap" in verdict.text


def test_paired_censoring_sorts_censored_runs_by_the_direction_they_move_the_difference():
    frame = pd.DataFrame(
        {
            "dataset": ["glyphs"] * 6 + ["synbirds"],
            "variant": ["triplet"] * 3 + ["dgcrl"] * 3 + ["triplet"],
            "seed": [0, 1, 2, 0, 1, 2, 0],
            "best_epoch_censored": [True, False, True, True, False, False, True],
        }
    )
    both = verdicts.paired_censoring(frame, "glyphs", "triplet", "dgcrl", (0, 1, 2), first_scale=0.2)
    assert both == {"can_rise": "2 of 3 triplet runs", "can_fall": "1 of 3 dgcrl runs"}
    assert verdicts.paired_censoring(frame, "glyphs", "triplet", "dgcrl", (1,)) == {"can_rise": "", "can_fall": ""}
    flipped = verdicts.paired_censoring(frame, "glyphs", "triplet", "dgcrl", (0, 1, 2), first_scale=-1.0)
    assert flipped == {"can_rise": "", "can_fall": "2 of 3 triplet runs, 1 of 3 dgcrl runs"}
    no_column = frame.drop(columns="best_epoch_censored")
    assert verdicts.paired_censoring(no_column, "glyphs", "triplet", "dgcrl", (0, 1, 2)) == {
        "can_rise": "",
        "can_fall": "",
    }


def test_a_table_takes_keywords_from_notebook_parameters_and_names_them_by_suffix():
    """``parameters`` sets the rows' keywords from the notebook's parameters of the same name (left out at the
    method's default; a row's own ``kwargs`` win); ``names.suffixes`` writes them after the name, a fixed ``name``
    too, in the declared order, a true flag as its suffix alone."""
    from types import SimpleNamespace

    from dmlstudy.experiments import ablations

    declared = ablations.Declaration(
        "diml",
        "diml",
        {"suffixes": {"grid_size": "_g", "epsilon": "_eps", "uniform_marginals": "_uniform"}, "values": "g"},
        {
            "runs": {
                "parameters": ["grid_size", "epsilon", "uniform_marginals"],
                "rows": {
                    "plain": {},
                    "margin": {"kwargs": {"base_loss": "margin"}, "name": "m"},
                    "own": {"kwargs": {"epsilon": 0.5}},
                },
            }
        },
    )
    at_defaults = SimpleNamespace(grid_size=4, epsilon=0.05, uniform_marginals=False)
    assert ablations.table_rows(declared, "runs", at_defaults) == {
        "plain": ("diml", {"method": "diml"}),
        "margin": ("m", {"method": "diml", "method_kwargs": {"base_loss": "margin"}}),
        "own": ("diml_eps0.5", {"method": "diml", "method_kwargs": {"epsilon": 0.5}}),
    }
    changed = ablations.table_rows(declared, "runs", SimpleNamespace(grid_size=2, epsilon=0.1, uniform_marginals=True))
    assert {label: name for label, (name, _) in changed.items()} == {
        "plain": "diml_g2_eps0.1_uniform",
        "margin": "m_g2_eps0.1_uniform",
        "own": "diml_g2_eps0.5_uniform",
    }
    assert changed["margin"][1]["method_kwargs"] == {
        "base_loss": "margin",
        "epsilon": 0.1,
        "grid_size": 2,
        "uniform_marginals": True,
    }


def test_a_table_of_papers_yaml_names_the_one_paper_that_reports_it():
    from dmlstudy.findings.numbers import reporting

    assert reporting("ESD") == reporting("RHO") == "crt"  # the geometry the comparison sets beside the paper's
    with pytest.raises(KeyError, match="no paper"):
        reporting("NO_SUCH_TABLE")
