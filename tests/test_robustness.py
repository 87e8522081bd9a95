"""The robustness study's readings: each column by the study's rule, the pooled partitions over partition means,
the amended label and the label as first declared, their false rates under no effect, each claim's chain of
readings, and the relatives-out recall, each against an independent computation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dmlstudy.data.emoji_sources import RELATIVES
from dmlstudy.experiments import rerank
from dmlstudy.findings import robustness
from dmlstudy.findings.claims import Claim
from dmlstudy.findings.robustness import RELATIVES_OUT, SCHEDULE
from dmlstudy.metrics import relative_mask, relatives_out_recall

CLAIM = Claim(name="A > B", kind="headline", a="a", b="b", runs="protocol", source="test")


def per_seed(perturbation: str, dataset: str, a: list[float], b: list[float]) -> pd.DataFrame:
    rows = [
        {"perturbation": perturbation, "regime": "imagenet", "dataset": dataset, "row": row, "seed": seed, "R@1": v}
        for row, values in (("a", a), ("b", b))
        for seed, v in enumerate(values)
    ]
    return pd.DataFrame(rows)


def t_interval(values: np.ndarray) -> tuple[float, float, float]:
    mean = values.mean()
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def test_each_column_and_the_pooled_partitions_against_scipy():
    rng = np.random.default_rng(0)
    frames, partition_means = [], []
    for name, dataset, shift in (
        ("default", "emoji", 3.0),
        ("partition 1", "emoji_p1", 1.0),
        ("partition 2", "emoji_p2", 2.5),
    ):
        b = rng.normal(50, 2, 5)
        a = b + shift + rng.normal(0, 0.5, 5)
        frames.append(per_seed(name, dataset, list(a), list(b)))
        partition_means.append((a - b).mean())
    table = robustness.robustness_table(pd.concat(frames, ignore_index=True), [CLAIM])
    cells = table.set_index("perturbation")
    mean, low, high = t_interval(
        np.asarray([*frames[0].query("row == 'a'")["R@1"]]) - frames[0].query("row == 'b'")["R@1"].to_numpy()
    )
    assert cells.loc["default", ["Δ", "CI low", "CI high"]].tolist() == pytest.approx([mean, low, high], abs=0.006)
    mean, low, high = t_interval(np.asarray(partition_means))  # 2 degrees of freedom
    pooled = cells.loc[robustness.POOLED]
    assert [pooled["Δ"], pooled["CI low"], pooled["CI high"]] == pytest.approx([mean, low, high], abs=0.006)
    assert pooled["model"] == "partition means" and pooled["seeds"] == 3 and "partitions" in pooled["covers"]
    schedule = cells.loc[robustness.SCHEDULE]
    assert schedule["outcome"] == "not run" and schedule["verdict"] == "not run"
    assert cells.loc["default", "outcome"] == "held"
    assert table["robustness"].iloc[0].endswith("so far")  # columns not run yet


def test_an_undecided_cell_gives_the_seeds_that_would_decide_it():
    differences = np.array([1.5, -0.5, 2.0, 0.2, 1.1])
    a = list(50 + differences)
    table = robustness.robustness_table(per_seed("default", "emoji", a, [50.0] * 5), [CLAIM])
    cell = table.set_index("perturbation").loc["default"]
    assert cell["outcome"] == "undecided"
    mean, sd = differences.mean(), differences.std(ddof=1)
    half = lambda n: stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)  # noqa: E731
    # the first n at which the interval, at this Δ and spread, clears 0 or fits inside ±1
    needed = next(n for n in range(2, 10_000) if half(n) < abs(mean) or abs(mean) + half(n) < 1)
    assert cell["seeds to decide"] == needed
    assert f"(≈ {needed} seeds)" in robustness.cell_text(cell.to_dict())


def cells_of(outcomes: dict[str, tuple[str, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "perturbation": list(outcomes),
            "outcome": [o for o, _ in outcomes.values()],
            "Δ": [d for _, d in outcomes.values()],
        }
    )


@pytest.mark.parametrize(
    ("outcomes", "label"),
    [
        ({"default": ("held", 2.0), "224 px": ("held", 1.5), RELATIVES_OUT: ("held", 2.0)}, "robust"),
        ({"default": ("reversed", -3.0), "unseen designers": ("reversed", -1.0)}, "robust"),
        ({"default": ("not held", 0.2), "224 px": ("not held", -0.1)}, "robust"),  # equivalent everywhere
        # an undecided cell never counts as agreement
        ({"default": ("held", 2.0), "224 px": ("undecided", 0.5)}, "consistent"),
        ({"default": ("held", 2.0), "224 px": ("not held", 0.3)}, "consistent"),  # a direction beside an equivalence
        ({"default": ("reversed", -3.5), SCHEDULE: ("undecided", 0.3)}, "unstable"),  # the sign flipped
        ({"default": ("held", 2.0), "224 px": ("reversed", -1.2), "unseen designers": ("undecided", 0.1)}, "fragile"),
        ({"partition 1": ("held", 1.5), "partition 2": ("reversed", -1.5)}, "fragile"),  # every cell counts
        ({"default": ("undecided", 0.4), "224 px": ("undecided", 0.8)}, "open"),
        ({"default": ("undecided", 0.4), "224 px": ("undecided", -0.8)}, "unstable"),
    ],
)
def test_the_amended_label(outcomes, label):
    assert robustness.robustness_label(cells_of(outcomes)) == label


@pytest.mark.parametrize(
    ("outcomes", "label"),
    [
        ({"default": "held", SCHEDULE: "held", "224 px": "undecided"}, "robust"),
        ({"default": "reversed", "unseen designers": "reversed"}, "robust"),
        ({"default": "held", "224 px": "reversed"}, "fragile"),
        ({"default": "undecided", "224 px": "not run"}, "open"),
        ({"default": "held", "224 px": "not held"}, "open"),  # a direction beside an equivalence
        (
            {"default": "undecided", "partition 1": "held", "partition 2": "reversed"},
            "open",
        ),  # partitions alone did not count
        ({"partitions pooled": "reversed", "partition 1": "held"}, "robust"),
    ],
)
def test_the_label_as_first_declared_is_kept(outcomes, label):
    cells = pd.DataFrame({"perturbation": list(outcomes), "outcome": list(outcomes.values())})
    assert robustness.declared_label(cells) == label


def test_the_table_labels_by_both_rules_and_counts_shared_runs_once():
    """The default and relatives-out cells are one reading; the label as first declared still reads 'robust'
    where the amended one does not, so the table shows both."""
    rng = np.random.default_rng(3)
    b = rng.normal(50, 1, 5)
    frames = [
        per_seed("default", "emoji", list(b + 3 + rng.normal(0, 0.3, 5)), list(b)),
        per_seed(RELATIVES_OUT, "emoji", list(b + 3 + rng.normal(0, 0.3, 5)), list(b)),
        per_seed("unseen designers", "emoji_designers", list(b + 0.2 + rng.normal(0, 3, 5)), list(b)),
    ]
    table = robustness.robustness_table(pd.concat(frames, ignore_index=True), [CLAIM])
    first = table.iloc[0]
    assert first["robustness"] == "consistent so far"
    assert first["label as first declared"] == "robust"
    assert first["readings decided"] == "held in 1 of 2 readings"


def test_simulated_label_rates_against_the_closed_form():
    """With two independent columns whose spread is too wide for an equivalence, each decides 'held' and
    'reversed' with probability p = 2.5 % under no effect: the amended rule labels robust-with-a-direction with
    probability 2p², the rule first declared with 2[(1 − p)² − (1 − 2p)²] (some cell decided, none opposite)."""
    rows = []
    for name, dataset in (("default", "emoji"), ("unseen designers", "emoji_designers")):
        rng = np.random.default_rng(len(name))
        differences = rng.normal(0, 1, 5)
        differences = 10 * (differences - differences.mean()) / differences.std(ddof=1)  # sd exactly 10
        rows.append(per_seed(name, dataset, list(50 + differences), [50.0] * 5))
    simulation = robustness.simulate_labels(pd.concat(rows, ignore_index=True), [CLAIM], draws=100_000)
    ran = simulation[simulation["columns"] == "run so far"].set_index("rule")
    assert ran.loc["amended", "cells"] == 2
    p = 0.025
    assert ran.loc["amended", "robust with a direction"] == pytest.approx(2 * p**2, abs=0.0006)
    assert ran.loc["as first declared", "robust with a direction"] == pytest.approx(
        2 * ((1 - p) ** 2 - (1 - 2 * p) ** 2), abs=0.004
    )
    alone = simulation[simulation["columns"] == "default alone"].set_index("rule")
    assert alone.loc["amended", "robust with a direction"] == pytest.approx(2 * p, abs=0.003)  # one look: 5 %
    everything = simulation[simulation["columns"] == "all declared"].set_index("rule")
    assert everything.loc["amended", "robust with a direction"] <= robustness.FALSE_ROBUST_BOUND
    assert everything.loc["as first declared", "robust with a direction"] > robustness.FALSE_ROBUST_BOUND


def test_the_chain_error_is_the_sum_of_the_levels_up_to_the_first_reading_that_reached_the_verdict(tmp_path):
    from dmlstudy.findings import chain

    claims = [CLAIM, Claim(name="C > D", kind="headline", a="c", b="d", runs="protocol", source="test")]
    # build 1: the first five seeds decide neither claim on their own
    rows = []
    for row, values in (("a", [50, 51, 49, 52, 48]), ("b", [50, 50, 50, 50, 50])):
        rows += [
            {"regime": "imagenet", "dataset": "emoji", "row": row, "seed": s, "R@1": v} for s, v in enumerate(values)
        ]
    for row, values in (("c", [55, 56, 54, 55, 57]), ("d", [50, 50, 50, 50, 50])):  # C > D held at once
        rows += [
            {"regime": "imagenet", "dataset": "emoji", "row": row, "seed": s, "R@1": v} for s, v in enumerate(values)
        ]
    folders = {study: tmp_path / study for study in ("sequential", "confirm", "confirm_dgcrl", "default")}
    for folder in folders.values():
        folder.mkdir()
    pd.DataFrame(rows).to_csv(folders["sequential"] / "runs_per_seed.csv", index=False)

    def claims_table(study, entries):
        pd.DataFrame(
            [{"claim": name, "Δ": delta, "seeds": seeds, "verdict": text} for name, delta, seeds, text in entries]
        ).to_csv(folders[study] / "claims.csv", index=False)

    claims_table(
        "sequential",
        [("A > B", 0.5, 20, "undecided at the cap (20 seeds)"), ("C > D", 5.4, 5, "held at look 1 (5 seeds)")],
    )
    claims_table("confirm", [("A > B", 0.9, 40, "held"), ("C > D", math.nan, 0, "not evaluated (no c runs)")])
    claims_table("confirm_dgcrl", [("A > B", math.nan, 0, "not evaluated"), ("C > D", math.nan, 0, "not evaluated")])
    claims_table("default", [("A > B", 1.2, 5, "held"), ("C > D", 5.0, 5, "held")])
    readings = chain.chain_readings(claims, outputs=lambda study: folders[study])
    errors = chain.chain_errors(readings).set_index("claim")
    assert readings.query("claim == 'A > B'")["outcome"].tolist() == ["undecided", "undecided", "held", "held"]
    assert errors.loc["A > B", "first reached by"] == "confirmatory study (build 1)"
    assert errors.loc["A > B", "error"] == pytest.approx(0.15)  # a later agreeing look does not lower it
    assert errors.loc["C > D", "error"] == pytest.approx(0.05)
    assert errors.loc["C > D", "chain"] == "held → held → not run → held"
    assert [chain.error_text(e) for e in (0.05, 0.15)] == ["5 %", "≤ 15 %"]


def test_relative_mask_removes_self_and_the_relative_family_only():
    families = ["noto", "noto-v1", "twemoji", "noto", "emojione-v1", "emojione"]
    mask = relative_mask(families, relatives=RELATIVES)
    expected = np.array(
        [
            [
                families[j]
                == {"noto": "noto-v1", "noto-v1": "noto", "emojione": "emojione-v1", "emojione-v1": "emojione"}.get(
                    families[i]
                )
                or i == j
                for j in range(6)
            ]
            for i in range(6)
        ]
    )
    assert (mask == expected).all()


def test_relatives_out_recall_against_a_plain_loop():
    rng = np.random.default_rng(1)
    families = ["noto", "noto-v1", "twemoji", "emojione", "emojione-v1", "fxemoji"] * 5
    labels = np.repeat(np.arange(5), 6)
    embeddings = rng.normal(size=(30, 8)) + labels[:, None] * 0.3
    # the noto-v1 drawing of each class a near copy of its noto drawing: without the mask it is found first
    embeddings[1::6] = embeddings[0::6] + 1e-3
    normed = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    hits = []
    for i in range(30):
        allowed = [j for j in range(30) if j != i and RELATIVES.get(families[i]) != families[j]]
        best = max(allowed, key=lambda j: normed[i] @ normed[j])
        hits.append(labels[best] == labels[i])
    assert relatives_out_recall(embeddings, labels, families, relatives=RELATIVES) == pytest.approx(100 * np.mean(hits))
    plain = 100 * np.mean(
        [
            labels[max((j for j in range(30) if j != i), key=lambda j: normed[i] @ normed[j])] == labels[i]
            for i in range(30)
        ]
    )
    assert plain > relatives_out_recall(embeddings, labels, families, relatives=RELATIVES)  # the relatives helped


def test_reranked_recall_with_one_candidate_is_the_cosine_recall_and_never_picks_a_relative(monkeypatch):
    rng = np.random.default_rng(2)
    families = ["noto", "noto-v1", "twemoji", "fxemoji"] * 6
    labels = np.repeat(np.arange(6), 4)
    embeddings = rng.normal(size=(24, 6)) + labels[:, None]
    local = rng.normal(size=(24, 4, 6)).astype(np.float32)
    assert rerank.relatives_out_reranked_recall(embeddings, local, labels, families, top_k=1) == pytest.approx(
        relatives_out_recall(embeddings, labels, families, relatives=RELATIVES)
    )
    chosen = {}

    def structural(gq, lq, gg, lg, candidates, **_):
        chosen["candidates"] = candidates
        return np.zeros(candidates.shape, dtype=np.float32)

    monkeypatch.setattr("dmlstudy.structural.transport.candidate_structural_similarity", structural)
    rerank.relatives_out_reranked_recall(embeddings, local, labels, families, top_k=10)
    mask = relative_mask(families, relatives=RELATIVES)
    assert not np.take_along_axis(mask, chosen["candidates"], axis=1).any()


def test_the_front_page_shows_the_committed_robustness_table():
    """The README's robustness table is the one `dmlstudy study robustness` writes (with each claim's published
    verdict and its error from the committed chain), not a hand copy."""
    from pathlib import Path

    from dmlstudy.findings import chain

    root = Path(__file__).resolve().parents[1]
    folder = root / "results" / "robustness"
    table = pd.read_csv(folder / "claims.csv")
    errors = pd.read_csv(folder / "chain.csv").drop_duplicates("claim")
    readme = (root / "README.md").read_text()
    assert robustness.readme_markdown(table, errors) in readme
    for name in robustness.columns_not_run(table):
        assert name in readme.split("## Two commands")[0] or name.startswith("partition")
    recomputed = chain.chain_errors(chain.chain_readings())
    committed = errors.set_index("claim").loc[recomputed["claim"]]
    assert committed["error"].tolist() == pytest.approx(recomputed["error"].tolist())
    assert committed["published verdict"].tolist() == recomputed["published verdict"].tolist()


def test_the_committed_label_simulation_keeps_the_declared_bound():
    from pathlib import Path

    simulation = pd.read_csv(Path(__file__).resolve().parents[1] / "results" / "robustness" / robustness.SIMULATION)
    amended = simulation[simulation["rule"] == "amended"]
    assert set(amended["columns"]) == {"default alone", "run so far", "all declared"}
    labelled = amended[amended["columns"] != "default alone"]  # one look alone is the scale: about 5 %
    assert (labelled["robust with a direction"] <= robustness.FALSE_ROBUST_BOUND).all()


def test_reruns_replace_the_rows_of_their_runs_only():
    first = per_seed("partition 1", "emoji_p1", [50.0, 51.0], [40.0, 41.0]).drop(columns="perturbation")
    again = pd.DataFrame(
        [
            {"regime": "imagenet", "dataset": "emoji_p1", "row": "a", "seed": 1, "R@1": 52.5, "numerics": "pinned"},
            {"regime": "imagenet", "dataset": "emoji_p2", "row": "a", "seed": 0, "R@1": 99.0, "numerics": "pinned"},
        ]
    )
    merged = robustness.with_reruns(first, again).set_index(["row", "seed"])
    assert len(merged) == 4
    assert merged.loc[("a", 1), "R@1"] == 52.5 and merged.loc[("a", 1), "numerics"] == "pinned"
    assert merged.loc[("a", 0), "R@1"] == 50.0 and merged.loc[("b", 1), "R@1"] == 41.0
    assert robustness.with_reruns(first, again[again["dataset"] == "emoji_p2"]).equals(first)


def test_the_committed_per_seed_table_is_the_columns_tables_with_their_reruns():
    """``results/robustness/runs_per_seed.csv`` holds each column's committed rows, a partition's runs trained again
    (docs/protocol.md, fourth amendment) in place of their first rows: no row is edited by hand."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "results" / "robustness"
    committed = pd.read_csv(folder / robustness.PER_SEED)
    relatives = committed[committed["perturbation"] == RELATIVES_OUT].drop(columns="perturbation")
    collected = robustness.collect_per_seed(relatives)
    keys = ["perturbation", "regime", "dataset", "row", "seed"]
    mine = committed.sort_values(keys).reset_index(drop=True)
    theirs = collected.sort_values(keys).reset_index(drop=True)
    assert mine[keys].equals(theirs[keys])
    assert np.array_equal(mine["R@1"].to_numpy(), theirs["R@1"].to_numpy())
    reruns = pd.read_csv(folder.parent / robustness.PARTITION_RERUNS / robustness.PER_SEED)
    partitions = mine[mine["perturbation"].isin(["partition 1", "partition 2"])].merge(reruns, on=keys[1:])
    assert len(partitions) == len(reruns) and (partitions["R@1_x"] == partitions["R@1_y"]).all()
