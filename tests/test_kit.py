"""The study kit: one verdict rule behind every reading, variant grids, the papers' numbers from one file."""

import math
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dmlstudy.experiments import kit, papers
from dmlstudy.experiments.protocol import mean_std_table

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "difference, error, seeds, expected, direction, noise",
    [
        (1.0, 0.1, 3, 1.0, 1, False),  # clearly with the claim
        (-1.0, 0.1, 3, 1.0, -1, False),  # clearly against it
        (0.1, 0.2, 3, 1.0, 1, True),  # |Δ| < 2 s.e.
        (0.5, 0.25, 3, 1.0, 1, False),  # |Δ| = 2 s.e. is beyond noise
        (0.1, 0.0, 1, 1.0, 1, False),  # one seed: only the sign
        (0.0, 0.0, 1, 1.0, 0, False),
        (-2.0, 0.1, 2, -3.0, 1, False),  # the paper's own sign is the expected one
    ],
)
def test_judge(difference, error, seeds, expected, direction, noise):
    verdict = kit.judge(difference, error, seeds, expected=expected)
    assert (verdict.direction, verdict.within_noise, verdict.one_seed) == (direction, noise, seeds < 2)


def test_both_phrasings_follow_the_one_rule():
    assert kit.claim_verdict(1.0, 0.1, 3) == "held"
    assert kit.claim_verdict(-1.0, 0.1, 3) == "did not hold"
    assert kit.claim_verdict(0.1, 0.2, 3) == "inconclusive (|Δ| < 2 s.e.)"
    assert kit.claim_verdict(0.1, 0.0, 1) == "held (1 seed, no noise estimate)"
    assert kit.claim_verdict(0.0, 0.0, 1) == "no difference (1 seed, no noise estimate)"
    assert kit.effect_sentence("x", ours=(1.0, 0.1), paper=2.0, seeds=3).endswith("paper +2.00 → direction held.")
    assert "NOT reproduced" in kit.effect_sentence("x", ours=(-1.0, 0.1), paper=2.0, seeds=3)
    assert "NOT reproduced" in kit.effect_sentence("x", ours=(1.0, 0.1), paper=-2.0, seeds=3)
    assert "direction held (but within seed noise" in kit.effect_sentence("x", ours=(0.1, 0.2), paper=2.0, seeds=3)
    assert "→ consistent (within seed noise)" in kit.effect_sentence("x", ours=(0.1, 0.2), paper=-0.01, seeds=3)
    assert "→ NOT consistent" in kit.effect_sentence("x", ours=(1.0, 0.2), paper=-0.01, seeds=3)
    assert "cannot tell" in kit.effect_sentence("x", ours=(1.0, 0.0), paper=0.1, seeds=1)
    for missing in (None, math.nan):
        assert kit.effect_sentence("x", ours=(1.0, 0.1), paper=missing, seeds=3).endswith(
            "the paper reports no number for this."
        )


def test_difference_is_the_mean_gap_with_its_standard_error():
    frame = pd.DataFrame(
        [
            {"dataset": "d", "variant": v, "seed": s, "R@1": x}
            for v, values in {"a": [0.50, 0.52, 0.54], "b": [0.40, 0.40]}.items()
            for s, x in enumerate(values)
        ]
    )
    table = mean_std_table(frame, metrics=["R@1"])
    (gap, error), seeds = kit.difference(table, "d", "a", "b")
    assert gap == pytest.approx(12.0) and seeds == 2
    assert error == pytest.approx(math.sqrt(pd.Series([50.0, 52, 54]).var() / 3 + 0.0 / 2))
    with pytest.raises(KeyError, match="no runs of variant 'c'"):
        kit.lookup(table, "d", "c")


def test_variant_grids():
    assert kit.with_reference([4, 1, 4], 64) == [1, 4, 64]
    assert kit.with_reference([[32, 64]], (128, 1024)) == [(32, 64), (128, 1024)]
    assert (
        kit.variant_name(
            "crt",
            {"classes_per_batch": 8, "output_stride": 16, "K1": 4},
            short={"classes_per_batch": "P"},
            silent={"output_stride"},
        )
        == "crt-P=8-K1=4"
    )
    assert kit.as_grid({1: ("a", {"method": "ms"}), 2: ("b", {"method": "crt"})}) == {
        "a": {"method": "ms"},
        "b": {"method": "crt"},
    }
    assert kit.with_baseline(("crt", {"method": "crt"})) == {"ms": {"method": "ms"}, "crt": {"method": "crt"}}


def test_paper_column_puts_each_dataset_beside_its_stand_in():
    table = pd.DataFrame({"dataset": ["synbirds", "synbirds", "glyphs"], "variant": ["ms", "crt", "other"]})
    shown = kit.paper_column(
        table, {"CUB": {"ms": 1.0, "crt": 2.0}, "Cars": {"ms": 3.0}}, label=lambda name: f"paper ({name})"
    )
    assert shown["paper (CUB)"].tolist()[:2] == [1.0, 2.0]
    assert shown["paper (Cars)"].tolist()[2] == "–"


# ----------------------------------------------------------------------------------------------
# The papers' numbers: one file, read by the modules, the plans and the README checked against it
# ----------------------------------------------------------------------------------------------
def test_papers_yaml_gives_every_table_a_source_and_typed_values():
    data = papers.load()
    assert papers.PAPER_DATASET == {"synbirds": "CUB", "glyphs": "Cars"}
    for paper in ("crt", "diml", "cross_attention", "dgcrl"):
        for name, table in data[paper]["tables"].items():
            assert table["source"], f"{paper}.{name} has no source"
    assert papers.numbers("crt", "DIMS")[(128, 1024)] == (75.95, 76.52)
    assert papers.numbers("diml", "TRUNCATION")[("ms", 100)]["CUB-200"] == (64.89, 34.12, 23.38)
    assert papers.numbers("cross_attention", "PARAMETERS")["ResNet-101, MS, no blocks"] == (45.3, 67.4, 83.7)
    with pytest.raises(KeyError, match="no table 'nope'"):
        papers.numbers("crt", "nope")


def test_the_modules_read_the_papers_numbers_from_the_file():
    from dmlstudy.experiments import crt, dgcrl, diml

    assert crt.PAPER_BASELINE_VS_CRT is not None and crt.PAPER_BASELINE_VS_CRT == papers.numbers(
        "crt", "BASELINE_VS_CRT"
    )
    assert diml.PAPER_GRID == papers.numbers("diml", "GRID")
    assert dgcrl.PAPER_TABLE1["CUB"]["dgcrl"][0] == 67.9


@pytest.mark.parametrize("plan", sorted(p.stem for p in (ROOT / "plans" / "papers").glob("*.yaml")))
def test_paper_plans_and_readme_quote_the_file(plan):
    reported = papers.reported(plan)
    in_plan = yaml.safe_load((ROOT / "plans" / "papers" / f"{plan}.yaml").read_text())["reported"]["metrics"]
    assert in_plan == reported
    rows = [
        line for line in (ROOT / "README.md").read_text().splitlines() if f"`{plan}`" in line and line.startswith("|")
    ]
    assert rows, f"README: no row of the papers' numbers for {plan}"
    shown = {float(x) for x in re.findall(r"\d+\.\d+", rows[0])}
    assert {float(v) for v in reported.values()} <= shown, f"README row of {plan} differs from papers.yaml"


def test_papers_yaml_ships_with_the_package():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"dmlstudy.experiments" = ["papers.yaml"]' in text
